"""Shape of the scheduler-layer roles (munge, slurmdbd, slurm, shared_storage, enroot, pyxis): public defaults
role-prefixed and in sync with meta/argument_specs.yml, private vars `_<role>_`, a thin tasks/main.yml
(preflight -> install -> configure -> run with the role's tags), and a managed.d record."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from _role_render import ROLES

SCHEDULER_ROLES = ["munge", "slurmdbd", "slurm", "shared_storage", "enroot", "pyxis"]


def _yaml(path: Path) -> object:
    return yaml.safe_load(path.read_text())


@pytest.mark.parametrize("role", SCHEDULER_ROLES)
def test_writes_managed_record(role: str) -> None:
    """Through _generation's manifest entry point (one writer of /var/lib/lcm/managed.d/<role>.json)."""
    tasks = _yaml(ROLES / role / "tasks/configure.yml")
    assert isinstance(tasks, list)
    rec = [t for t in tasks if t.get("ansible.builtin.include_role", {}).get("tasks_from") == "manifest"]
    assert len(rec) == 1 and rec[0]["ansible.builtin.include_role"]["name"] == "_generation"
    assert rec[0]["vars"]["_generation_manifest_role"] == role


def test_secrets_are_no_log() -> None:
    """Every task that generates, reads or writes the munge key hides its values."""
    tasks = _yaml(ROLES / "munge/tasks/configure.yml")
    key_tasks = [t for t in tasks if t.get("register") == "_munge_key" or "_munge_key." in str(t)]
    key_tasks += [t for t in tasks if "urandom" in str(t)]
    assert len(key_tasks) == 3
    assert all(t.get("no_log") is True for t in key_tasks)
