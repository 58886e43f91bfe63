"""playbooks/validate.yml against bad specs: the play fails with the field's message, before any host task.

The temporary inventory's hosts point at a closed port on 127.0.0.1: a play that reached them would end
UNREACHABLE (a different failure), and the marker play after validate.yml would print its task name.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "inventories" / "example-h200"

HOSTS = """
all:
  vars: {ansible_host: 127.0.0.1, ansible_port: 1, ansible_user: nobody, ansible_connection: ssh}
  children:
    cluster:
      children:
        controller: {hosts: {ctl: {}}}
        compute: {hosts: {gpu1: {}, gpu2: {}}}
        monitoring: {hosts: {ctl: {}}}
        login: {hosts: {}}
"""

SITE = f"""
- name: Validate
  ansible.builtin.import_playbook: {ROOT}/playbooks/validate.yml
- name: Touch every host
  hosts: cluster
  gather_facts: false
  tasks:
    - name: MARKER host task ran
      ansible.builtin.ping:
"""


def _inventory(tmp_path: Path, cluster: dict, hosts: str = HOSTS) -> Path:
    inv = tmp_path / "inv"
    (inv / "group_vars" / "all").mkdir(parents=True)
    (inv / "hosts.yml").write_text(hosts)
    (inv / "group_vars" / "all" / "cluster.yml").write_text(yaml.safe_dump({"cluster": cluster}))
    shutil.copy(ROOT / "versions.lock.yml", inv / "group_vars" / "all" / "lock.yml")
    (tmp_path / "site.yml").write_text(SITE)
    return inv


def _run(tmp_path: Path, inv: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "ANSIBLE_CONFIG": str(ROOT / "ansible.cfg")}
    exe = shutil.which("ansible-playbook")
    assert exe, "ansible-playbook not on PATH (activate .venv)"
    return subprocess.run(
        [exe, "-i", str(inv), str(tmp_path / "site.yml")],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )


def _spec() -> dict:
    spec = yaml.safe_load((EXAMPLE / "group_vars" / "all" / "cluster.yml").read_text())["cluster"]
    spec["fabric"]["topology"][0]["nodes"] = "gpu[1-2]"  # this file's compute hosts
    return spec


def test_good_spec_reaches_hosts(tmp_path: Path) -> None:
    """Control: with a valid spec the marker play runs (and fails UNREACHABLE on the closed port)."""
    out = _run(tmp_path, _inventory(tmp_path, _spec()))
    assert "MARKER host task ran" in out.stdout, out.stdout
    assert "UNREACHABLE" in out.stdout


def _bad(key: str, sub: str, value: object) -> dict:
    spec = _spec()
    spec[key][sub] = value
    return spec


@pytest.mark.parametrize(
    ("cluster", "hosts", "message"),
    [
        (_bad("gpu", "gres_type", ""), HOSTS, 'cluster.gpu.gres_type = "": expected a gres type name'),
        (_bad("fabric", "hcas", []), HOSTS, "cluster.fabric.hcas = []: expected at least one HCA"),
        (_bad("layers", "pyxis_x", True), HOSTS, "cluster.layers.pyxis_x = true: expected no such field"),
        (
            _spec(),
            HOSTS.replace("controller: {hosts: {ctl: {}}}", "controller: {hosts: {ctl: {}, gpu1: {}}}"),
            'inventory.groups.controller = ["ctl", "gpu1"]: expected exactly 1 host',
        ),
    ],
    ids=["gres-vs-gpu-count", "ib-without-hcas", "unknown-key", "two-controllers"],
)
def test_bad_spec_stops_before_any_host(tmp_path: Path, cluster: dict, hosts: str, message: str) -> None:
    out = _run(tmp_path, _inventory(tmp_path, cluster, hosts))
    assert out.returncode != 0
    assert message in out.stdout, out.stdout
    assert "no host was touched" in out.stdout
    assert "MARKER" not in out.stdout and "UNREACHABLE" not in out.stdout


def test_host_overriding_the_spec_is_rejected(tmp_path: Path) -> None:
    spec = _spec()
    other = {**spec, "name": "other"}
    hosts = HOSTS.replace(
        "compute: {hosts: {gpu1: {}, gpu2: {}}}", "compute: {hosts: {gpu1: {cluster: %s}, gpu2: {}}}"
    )
    out = _run(tmp_path, _inventory(tmp_path, spec, hosts % json.dumps(other)))
    assert out.returncode != 0
    assert "hosts gpu1 see a different `cluster` mapping" in out.stdout, out.stdout
    assert "MARKER" not in out.stdout and "UNREACHABLE" not in out.stdout
