"""The slurm role's preflight, run by ansible-playbook on localhost (two inventory hosts with a local
connection): a wrong spec for this layer fails before anything changes, with a clear message."""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from _role_render import REPO

from lcm_runner.lock import release_lock
from lcm_runner.spec import validate
from lcm_runner.spec.schema import fill_defaults

LAB = yaml.safe_load((REPO / "inventories/lab/group_vars/all/cluster.yml").read_text())["cluster"]
PLAY = """
- name: slurm preflight only
  hosts: all
  gather_facts: true
  tasks:
    - name: Preflight
      ansible.builtin.import_role:
        name: slurm
        tasks_from: preflight
"""


# The machine that runs the tests may resolve its own name to loopback (its /etc/hosts); the daemons'
# listening name is pointed at a cluster-like address unless a test is about it (getent resolves an
# address literal to itself).
CLUSTER_ADDRESS = "10.89.42.11"


def _run(
    tmp_path: Path, cluster: dict, listen_name: str = CLUSTER_ADDRESS, *extra: str
) -> subprocess.CompletedProcess[str]:
    (tmp_path / "hosts.ini").write_text(
        "[controller]\nctl ansible_connection=local\n[compute]\nnode1 ansible_connection=local\n"
        "[cluster:children]\ncontroller\ncompute\n"
    )
    (tmp_path / "play.yml").write_text(PLAY)
    # as validate.yml hands the spec over, and the lock as a node of the spec's release reads it
    spec = fill_defaults(cluster)
    lock = release_lock(
        yaml.safe_load((REPO / "versions.lock.yml").read_text())["lcm_lock"], spec["os"]["release"]
    )
    (tmp_path / "spec.json").write_text(json.dumps({"cluster": spec, "lcm_lock": lock}))
    (tmp_path / "ansible.cfg").write_text("[defaults]\nnocows = true\n")
    env = {
        **os.environ,
        "ANSIBLE_ROLES_PATH": str(REPO / "roles"),
        "ANSIBLE_CONFIG": str(tmp_path / "ansible.cfg"),
        "ANSIBLE_PYTHON_INTERPRETER": sys.executable,
        "ANSIBLE_NOCOLOR": "1",
        "ANSIBLE_GATHER_SUBSET": "!all,!min,hardware",
    }
    venv_bin = REPO / ".venv" / "bin"
    cmd = [str(venv_bin / "ansible-playbook"), "-i", str(tmp_path / "hosts.ini"), str(tmp_path / "play.yml")]
    cmd += ["-e", f"@{tmp_path / 'spec.json'}", "-e", f"_slurm_listen_name={listen_name}", *extra]
    return subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=180, check=False)


@pytest.mark.slow
def test_lab_spec_passes(tmp_path: Path) -> None:
    result = _run(tmp_path, LAB)
    assert result.returncode == 0, result.stdout[-3000:]


@pytest.mark.slow
@pytest.mark.parametrize(("release", "refused"), [("bookworm", False), ("trixie", True)])
def test_cons_res_is_refused_where_slurm_removed_it(tmp_path: Path, release: str, refused: bool) -> None:
    """select/cons_res exists in Slurm 22.05 (Debian 12) and was removed in 23.11: on Debian 13's 24.11 the
    preflight stops before any change, naming the release."""
    spec = {**LAB, "os": {"release": release}}
    result = _run(tmp_path, spec, CLUSTER_ADDRESS, "-e", "slurm_select_type=select/cons_res")
    assert (result.returncode != 0) == refused, result.stdout[-3000:]
    if refused:
        assert "Slurm 24.11 (the lock's 24.11.5-4+deb13u1" in result.stdout
        assert "(select/cons_res was removed in 23.11)" in result.stdout


@pytest.mark.slow
@pytest.mark.parametrize(
    ("setting", "shown"),
    [
        ("slurm_cred_expire=4", "slurm_cred_expire must be >= 5 (is 4: Slurm would silently use 120)"),
        ("slurm_tcp_timeout=0", "slurm_tcp_timeout (is 0)"),
    ],
)
def test_timers_slurm_would_replace_or_reject_are_refused(tmp_path: Path, setting: str, shown: str) -> None:
    """A cred_expire below 5 is replaced by 120 in slurmctld with one log line (a requeue would then wait
    2 minutes), a TCPTimeout of 0 is an error at start: both stop in the preflight, named."""
    result = _run(tmp_path, LAB, CLUSTER_ADDRESS, "-e", setting)
    assert result.returncode != 0
    assert shown in result.stdout, result.stdout[-3000:]


@pytest.mark.slow
@pytest.mark.parametrize(
    ("name", "shown"),
    [("localhost", "resolves to 127.0.0.1"), ("no-such-node.invalid", "resolves to no IPv4 address")],
)
def test_a_name_on_loopback_or_unresolved_is_refused(tmp_path: Path, name: str, shown: str) -> None:
    """With bind_any_address false, slurmctld/slurmd listen only where the node's name resolves: a name on
    loopback (Debian's 127.0.1.1 line) or none at all is refused on every node, saying which and why."""
    result = _run(tmp_path, LAB, listen_name=name)
    assert result.returncode != 0
    for host in ("ctl", "node1"):
        assert f"slurm: the name '{name}' of {host} {shown}" in result.stdout, result.stdout[-3000:]
    assert "cluster.slurm.bind_any_address true" in result.stdout


@pytest.mark.slow
def test_a_name_on_loopback_is_fine_when_the_daemons_listen_on_every_address(tmp_path: Path) -> None:
    spec = copy.deepcopy(LAB)
    spec["slurm"]["bind_any_address"] = True
    result = _run(tmp_path, spec, listen_name="localhost")
    assert result.returncode == 0, result.stdout[-3000:]
    assert "slurm: the name" not in result.stdout


GROUPS = {
    "controller": ["ctl"],
    "compute": ["node1"],
    "monitoring": ["ctl"],
    "cluster": ["ctl", "node1"],
    "all": ["ctl", "node1"],
}


# Spec mistakes of this layer are refused by validation (playbooks/validate.yml, before any host is
# contacted), not by the role's preflight, which checks only what the host shows.
def test_gpus_without_gres_type_are_refused_by_validation() -> None:
    spec = copy.deepcopy(LAB)
    spec["gpu"].update(model="h200", count_per_node=8, gres_type="")
    msgs = [str(e) for e in validate(spec, GROUPS)]
    assert msgs == ['cluster.gpu.gres_type = "": expected a gres type name (Gres=gpu:<type>:8)']


def test_unknown_partition_group_is_refused_by_validation() -> None:
    spec = copy.deepcopy(LAB)
    spec["slurm"]["partitions"][0]["groups"] = ["gpunodes"]
    msgs = [str(e) for e in validate(spec, GROUPS)]
    assert msgs == [
        'cluster.slurm.partitions[0].groups = "gpunodes": expected an inventory group '
        "(known: cluster, compute, controller, monitoring)"
    ]
