"""Run one of the project's roles for real with ansible-playbook against localhost (connection local).

Used by the role unit tests (tests/unit/test_nccl_role.py, test_nvidia*.py, test_rdma*.py): the role's own
task files run, with file paths pointed into a pytest tmp dir, so preflight failures, template rendering
and version checks are tested without GPUs, InfiniBand or a lab.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from lcm_runner.lock import release_lock
from lcm_runner.spec import fill_defaults

REPO = Path(__file__).resolve().parents[2]


@dataclass
class RoleRun:
    rc: int
    stdout: str
    stderr: str
    results: list[dict[str, Any]] = field(default_factory=list)  # one per task: {"task", "result"}
    stats: dict[str, Any] = field(default_factory=dict)

    @property
    def failed_msgs(self) -> list[str]:
        return [str(r["result"].get("msg", "")) for r in self.results if r["result"].get("failed")]

    def task(self, name_part: str) -> dict[str, Any]:
        for r in self.results:
            if name_part in r["task"]:
                return r["result"]
        raise KeyError(f"no task named like {name_part!r}; tasks: {[r['task'] for r in self.results]}")

    @property
    def changed(self) -> int:
        return int(self.stats.get("localhost", {}).get("changed", -1))


def lock() -> dict[str, Any]:
    return release_lock(yaml.safe_load((REPO / "versions.lock.yml").read_text())["lcm_lock"])


def run_role(
    role: str,
    tmp_path: Path,
    extra_vars: dict[str, Any],
    tasks_from: str = "main",
    check: bool = False,
    tags: str | None = None,
    cfg_extra: str = "",
) -> RoleRun:
    """Run `role` (entry point `tasks_from`) on localhost with `extra_vars`; parse the json callback.
    `cfg_extra`: lines added to ansible.cfg's [defaults] (e.g. a fact cache)."""
    play = [
        {
            "name": f"unit test of role {role}",
            "hosts": "localhost",
            "gather_facts": False,
            "tasks": [
                {
                    "name": f"Run {role}",
                    "ansible.builtin.include_role": {"name": role, "tasks_from": f"{tasks_from}.yml"},
                    "tags": ["always"],
                }
            ],
        }
    ]
    play_file = tmp_path / f"play_{role}.yml"
    play_file.write_text(yaml.safe_dump(play))
    vars_file = tmp_path / f"vars_{role}.json"
    base = {"ansible_python_interpreter": sys.executable, "lcm_lock": lock()}
    if isinstance(extra_vars.get("cluster"), dict):  # as playbooks/validate.yml hands it to the roles
        extra_vars = {**extra_vars, "cluster": fill_defaults(extra_vars["cluster"])}
    vars_file.write_text(json.dumps(base | extra_vars))
    cfg = tmp_path / "ansible.cfg"
    cfg.write_text(
        "[defaults]\n"
        f"roles_path = {REPO / 'roles'}\n"
        f"library = {REPO / 'plugins/modules'}\n"
        f"module_utils = {REPO / 'plugins/module_utils'}\n"
        f"action_plugins = {REPO / 'plugins/action'}\n"
        f"filter_plugins = {REPO / 'plugins/filter'}\n"
        "stdout_callback = ansible.builtin.json\n"
        "retry_files_enabled = false\n"
        "localhost_warning = false\n"
        "inventory_unparsed_warning = false\n" + cfg_extra
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("ANSIBLE_")} | {
        "ANSIBLE_CONFIG": str(cfg),
        "ANSIBLE_LOCAL_TEMP": str(tmp_path / ".ansible-tmp"),
    }
    # LCM_ANSIBLE_PLAYBOOK: another way to start ansible-playbook (e.g. "python3 -m ansible playbook" on a
    # GPU machine that has ansible-core on PYTHONPATH but no venv of this project).
    launcher = os.environ.get("LCM_ANSIBLE_PLAYBOOK", str(Path(sys.executable).parent / "ansible-playbook"))
    cmd = [
        *launcher.split(),
        "-i",
        "localhost,",
        "-c",
        "local",
        str(play_file),
        "-e",
        f"@{vars_file}",
    ]
    if check:
        cmd.append("--check")
    if tags:
        cmd += ["--tags", tags]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300, check=False)
    try:
        out = json.loads(proc.stdout[proc.stdout.index("{") :])
    except ValueError as exc:
        raise AssertionError(
            f"no json output (rc {proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
        ) from exc
    results = []
    for play_out in out.get("plays", []):
        for task in play_out.get("tasks", []):
            for host_result in task.get("hosts", {}).values():
                results.append({"task": task["task"]["name"], "result": host_result})
    return RoleRun(proc.returncode, proc.stdout, proc.stderr, results, out.get("stats", {}))


def spec(**over: Any) -> dict[str, Any]:
    """A valid cluster spec (the lab's shape), with top-level sections replaced by `over`."""
    base: dict[str, Any] = {
        "name": "unit",
        "gpu": {"model": "none", "count_per_node": 0, "gres_type": "", "nvswitch": False},
        "fabric": {
            "type": "ethernet",
            "hcas": [],
            "rate_gbps": 0,
            "socket_ifname": "lo",
            "roce_gid_index": None,
        },
        "storage": {"type": "lab_shared", "mountpoint": "/shared", "checkpoint_dir": "/shared/checkpoints"},
        "layers": {"nvidia": False, "rdma": False, "nccl": True},
    }
    return base | over


H200_GPU = {"model": "h200", "count_per_node": 8, "gres_type": "h200", "nvswitch": True}
IB_FABRIC = {
    "type": "infiniband",
    "hcas": [f"mlx5_{i}" for i in range(8)],
    "rate_gbps": 400,
    "socket_ifname": "lo",
    "roce_gid_index": None,
}
