"""Shape of roles/lab and roles/common: defaults role-prefixed and in sync with meta/argument_specs.yml,
private vars `_<role>_`, a thin tasks/main.yml of tagged import_tasks, common's managed.d record."""

from __future__ import annotations

from pathlib import Path

import yaml

ROLES = Path(__file__).resolve().parents[2] / "roles"
BASE_ROLES = ["lab", "common"]


def _yaml(path: Path) -> object:
    return yaml.safe_load(path.read_text(encoding="utf-8"))


def test_common_phases_in_order() -> None:
    tasks = _yaml(ROLES / "common/tasks/main.yml")
    assert [t["ansible.builtin.import_tasks"] for t in tasks] == [
        "preflight.yml",
        "install.yml",
        "configure.yml",
        "run.yml",
    ]


def test_common_records_managed_files() -> None:
    """Through _generation's manifest entry point (one writer of /var/lib/lcm/managed.d/<role>.json)."""
    tasks = _yaml(ROLES / "common/tasks/configure.yml")
    rec = [t for t in tasks if t.get("ansible.builtin.include_role", {}).get("tasks_from") == "manifest"]
    assert len(rec) == 1 and rec[0]["ansible.builtin.include_role"]["name"] == "_generation"
    assert rec[0]["vars"]["_generation_manifest_role"] == "common"
    assert rec[0]["vars"]["_generation_manifest_services"] == ["chrony"]
