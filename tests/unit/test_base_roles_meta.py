"""Shape of roles/lab and roles/common: defaults role-prefixed and in sync with meta/argument_specs.yml,
private vars `_<role>_`, a thin tasks/main.yml of tagged import_tasks, common's managed.d record."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

ROLES = Path(__file__).resolve().parents[2] / "roles"
BASE_ROLES = ["lab", "common"]


def _yaml(path: Path) -> object:
    return yaml.safe_load(path.read_text(encoding="utf-8"))


@pytest.mark.parametrize("role", BASE_ROLES)
def test_defaults_match_argument_specs(role: str) -> None:
    defaults = _yaml(ROLES / role / "defaults/main.yml")
    assert isinstance(defaults, dict)
    options = _yaml(ROLES / role / "meta/argument_specs.yml")["argument_specs"]["main"]["options"]
    assert set(defaults) == set(options)
    for name, value in defaults.items():
        assert name.startswith(f"{role}_"), name
        assert options[name]["default"] == value, name
        assert options[name]["description"], name


@pytest.mark.parametrize("role", BASE_ROLES)
def test_private_vars_prefixed(role: str) -> None:
    private = _yaml(ROLES / role / "vars/main.yml")
    assert isinstance(private, dict)
    assert all(name.startswith(f"_{role}_") for name in private)


@pytest.mark.parametrize("role", BASE_ROLES)
def test_thin_main_of_tagged_imports(role: str) -> None:
    tasks = _yaml(ROLES / role / "tasks/main.yml")
    assert isinstance(tasks, list)
    phases = []
    for task in tasks:
        assert set(task) <= {"name", "ansible.builtin.import_tasks", "tags", "when"}, task
        phase = task["ansible.builtin.import_tasks"].removesuffix(".yml")
        assert (ROLES / role / "tasks" / f"{phase}.yml").exists()
        assert task["tags"] == [role, f"{role}_{phase}"], task
        phases.append(phase)
    assert phases[0] == "preflight"


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
