"""munge on a converged cluster: one key, 0400 munge:munge, on every node, and a credential made on any
node decodes on every other node (and one made with another key does not).

Run: pytest tests/infra/test_munge.py --hosts=ansible://all --ansible-inventory=inventories/<name>
"""

from __future__ import annotations

import re
from typing import Any

import pytest
import testinfra


def _peers(host: Any) -> list[Any]:
    """Every node of the cluster group, as testinfra hosts of the same inventory."""
    inventory = host.backend.ansible_inventory
    names = sorted(set(host.ansible.get_variables()["groups"]["cluster"]))
    return [testinfra.get_host(f"ansible://{n}", ansible_inventory=inventory) for n in names]


def test_key_mode_and_owner(host: Any) -> None:
    key = host.file("/etc/munge/munge.key")
    assert key.is_file
    assert key.user == "munge"
    assert key.group == "munge"
    assert key.mode == 0o400
    assert key.size >= 32


def test_munged_running_and_enabled(host: Any) -> None:
    svc = host.service("munge")
    assert svc.is_running
    assert svc.is_enabled


def test_one_key_everywhere(host: Any) -> None:
    mine = host.check_output("sha256sum /etc/munge/munge.key").split()[0]
    for peer in _peers(host):
        assert peer.check_output("sha256sum /etc/munge/munge.key").split()[0] == mine


def test_credential_decodes_on_every_node(host: Any) -> None:
    cred = host.check_output("munge -n")
    assert cred.startswith("MUNGE:")
    for peer in _peers(host):
        out = peer.run(f"echo {cred} | unmunge")
        assert out.rc == 0, f"-> {peer.backend.get_hostname()}: {out.stdout} {out.stderr}"
        assert re.search(r"^STATUS:\s+Success \(0\)$", out.stdout, re.M), out.stdout


@pytest.mark.groups("controller")
def test_foreign_key_credential_rejected(host: Any) -> None:
    """A credential made by a second munged with another key does not decode on the nodes: the check
    above is not vacuous."""
    tmp = host.check_output(
        "set -e; d=$(mktemp -d /run/lcm-test-munge.XXXXXX); head -c 1024 /dev/urandom > $d/k;"
        " chmod 0400 $d/k; chmod 0755 $d;"
        " chown -R munge:munge $d; runuser -u munge -- /usr/sbin/munged --key-file=$d/k --socket=$d/sock"
        " --pid-file=$d/pid --log-file=$d/log --seed-file=$d/seed; echo $d"
    )
    try:
        cred = host.check_output(f"munge -n --socket={tmp}/sock")
        for peer in _peers(host):
            out = peer.run(f"echo {cred} | unmunge")
            assert out.rc != 0
            assert "Invalid credential" in out.stdout + out.stderr
    finally:
        host.run(f"kill $(cat {tmp}/pid); rm -rf {tmp}")
