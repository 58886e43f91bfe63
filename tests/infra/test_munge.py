"""munge on a converged cluster (default: the lab): one key, 0400 munge:munge, on every node, and a
credential made on any node decodes on every other node.

Run: pytest tests/infra/test_munge.py   (LCM_INVENTORY=<inventory dir> for another cluster)
"""

from __future__ import annotations

import os
from functools import cache
from pathlib import Path

import pytest
import testinfra
from testinfra.utils.ansible_runner import AnsibleRunner

pytestmark = pytest.mark.lab
INVENTORY = os.environ.get("LCM_INVENTORY", str(Path(__file__).resolve().parents[2] / "inventories" / "lab"))


@cache
def _runner() -> AnsibleRunner:
    return AnsibleRunner(INVENTORY)


@cache
def _host(name: str) -> testinfra.host.Host:
    return testinfra.get_host(f"ansible://{name}", ansible_inventory=INVENTORY)


def _names(group: str) -> list[str]:
    return sorted(_runner().get_hosts(group))


NODES = _names("cluster")


@pytest.mark.parametrize("name", NODES)
def test_key_mode_and_owner(name: str) -> None:
    key = _host(name).file("/etc/munge/munge.key")
    assert key.is_file
    assert key.user == "munge"
    assert key.group == "munge"
    assert key.mode == 0o400
    assert key.size >= 32


def test_one_key_everywhere() -> None:
    digests = {n: _host(n).check_output("sha256sum /etc/munge/munge.key").split()[0] for n in NODES}
    assert len(set(digests.values())) == 1, digests


@pytest.mark.parametrize("name", NODES)
def test_munged_running_and_enabled(name: str) -> None:
    svc = _host(name).service("munge")
    assert svc.is_running
    assert svc.is_enabled


@pytest.mark.parametrize("origin", NODES)
def test_credential_decodes_on_every_node(origin: str) -> None:
    cred = _host(origin).check_output("munge -n")
    assert cred.startswith("MUNGE:")
    for other in NODES:
        out = _host(other).run(f"echo {cred} | unmunge")
        assert out.rc == 0, f"{origin} -> {other}: {out.stdout} {out.stderr}"
        assert "STATUS:           Success (0)" in out.stdout


def test_foreign_key_credential_rejected() -> None:
    """A credential made with another key does not decode: the check above is not vacuous."""
    node = _host(NODES[0])
    node.check_output(
        "set -e; d=$(mktemp -d); head -c 1024 /dev/urandom > $d/k; chmod 0400 $d/k; chown -R munge:munge $d;"
        "runuser -u munge -- munged --key-file=$d/k --socket=$d/sock --pid-file=$d/pid --log-file=$d/log"
        " --seed-file=$d/seed; echo $d > /tmp/lcm-test-munge-dir"
    )
    tmp = node.check_output("cat /tmp/lcm-test-munge-dir")
    try:
        cred = node.check_output(f"munge -n --socket={tmp}/sock")
        out = _host(NODES[-1]).run(f"echo {cred} | unmunge")
        assert out.rc != 0
        assert "Invalid credential" in out.stdout + out.stderr
    finally:
        node.run(f"kill $(cat {tmp}/pid); rm -rf {tmp} /tmp/lcm-test-munge-dir")
