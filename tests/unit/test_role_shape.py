"""Shape of every public role (the project's rule, one test for all of them): public defaults
role-prefixed and in sync with meta/argument_specs.yml (same names, same defaults, each described),
private vars `_<role>_`, a thin tasks/main.yml of tagged import_tasks that starts with preflight, and
handlers (where a role has them) that do not restart without waiting."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

ROLES = Path(__file__).resolve().parents[2] / "roles"
PHASES = ["preflight", "install", "configure", "run"]
# Phases a role adds to the four, by name (the lab builds an image and has a state=absent path).
EXTRA_PHASES = {"lab": ["image", "absent"]}
PUBLIC_ROLES = sorted(p.name for p in ROLES.iterdir() if p.is_dir() and not p.name.startswith("_"))


def _yaml(path: Path) -> object:
    return yaml.safe_load(path.read_text(encoding="utf-8"))


def test_every_role_is_covered() -> None:
    assert {"common", "lab", "munge", "slurm", "shared_storage", "nccl", "lcm_runner"} <= set(PUBLIC_ROLES)


@pytest.mark.parametrize("role", PUBLIC_ROLES)
def test_defaults_match_argument_specs(role: str) -> None:
    defaults = _yaml(ROLES / role / "defaults/main.yml")
    assert isinstance(defaults, dict)
    options = _yaml(ROLES / role / "meta/argument_specs.yml")["argument_specs"]["main"]["options"]
    assert set(defaults) == set(options)
    for name, value in defaults.items():
        assert name.startswith(f"{role}_"), name
        assert options[name].get("default") == value, name
        assert options[name]["description"], name


@pytest.mark.parametrize("role", PUBLIC_ROLES)
def test_private_vars_prefixed(role: str) -> None:
    path = ROLES / role / "vars/main.yml"
    if not path.exists():
        pytest.skip(f"{role} has no private vars")
    private = _yaml(path) or {}
    assert all(name.startswith(f"_{role}_") for name in private), sorted(private)


@pytest.mark.parametrize("role", PUBLIC_ROLES)
def test_thin_main_of_tagged_phase_imports(role: str) -> None:
    tasks = _yaml(ROLES / role / "tasks/main.yml")
    assert isinstance(tasks, list)
    phases = []
    for task in tasks:
        assert set(task) <= {"name", "ansible.builtin.import_tasks", "tags", "when"}, task
        assert (ROLES / role / "tasks" / task["ansible.builtin.import_tasks"]).exists(), task
        tag_role, tag_phase = task["tags"]
        assert tag_role == role, task
        assert tag_phase in {f"{role}_{p}" for p in PHASES + EXTRA_PHASES.get(role, [])}, task
        phases.append(tag_phase.removeprefix(f"{role}_"))
    assert phases[0] == "preflight", phases
    canonical = [p for p in phases if p in PHASES]
    assert canonical == sorted(canonical, key=PHASES.index), (
        phases
    )  # preflight -> install -> configure -> run
