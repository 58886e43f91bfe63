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
    configure = (ROLES / "common/tasks/configure.yml").read_text(encoding="utf-8")
    assert "_common_managed_file" in configure and "to_nice_json" in configure
    private = _yaml(ROLES / "common/vars/main.yml")
    assert private["_common_managed_file"] == "/var/lib/lcm/managed.d/common.json"
