"""Render a role's templates the way Ansible does, without a host: role defaults + vars + given facts.

Used by the template tests of the scheduler roles (slurm, shared_storage, enroot, pyxis). It runs
Ansible's own templating engine (ansible-core's Templar), so filters and lazy variable references in
defaults/main.yml behave as in a play.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from ansible.parsing.dataloader import DataLoader
from ansible.plugins.loader import filter_loader
from ansible.template import Templar, trust_as_template

from lcm_runner.lock import release_lock
from lcm_runner.spec import fill_defaults

REPO = Path(__file__).resolve().parents[2]
ROLES = REPO / "roles"


def _trust(value: Any) -> Any:
    """Mark strings from the role's own YAML as templates (as Ansible does for role files)."""
    if isinstance(value, str):
        return trust_as_template(value)
    if isinstance(value, list):
        return [_trust(v) for v in value]
    if isinstance(value, dict):
        return {k: _trust(v) for k, v in value.items()}
    return value


def role_vars(role: str) -> dict[str, Any]:
    merged: dict[str, Any] = {}
    for sub in ("defaults", "vars"):
        path = ROLES / role / sub / "main.yml"
        if path.exists():
            merged.update(_trust(yaml.safe_load(path.read_text()) or {}))
    return merged


def validated(variables: dict[str, Any]) -> dict[str, Any]:
    """`cluster` as playbooks/validate.yml hands it to the roles: the schema's defaults filled in; and, unless
    given, `lcm_lock` as an inventory's group_vars hold it, seen from a node of the spec's release."""
    if isinstance(variables.get("cluster"), dict):
        variables = {**variables, "cluster": fill_defaults(variables["cluster"])}
    if "lcm_lock" not in variables:
        release = (variables.get("cluster") or {}).get("os", {}).get("release", "bookworm")
        raw = yaml.safe_load((REPO / "versions.lock.yml").read_text())["lcm_lock"]
        variables = {**variables, "lcm_lock": release_lock(raw, release)}
    return variables


def _role_filters(role: str) -> None:
    """Make the role's own filter_plugins visible, as Ansible does when the role runs."""
    path = ROLES / role / "filter_plugins"
    if path.is_dir():
        filter_loader.add_directory(str(path))


def render(role: str, template: str, variables: dict[str, Any]) -> str:
    """Render roles/<role>/templates/<template> with the role's variables overridden by `variables`."""
    _role_filters(role)
    variables = validated(variables)
    all_vars = {"ansible_managed": "managed by lcm-infra", **role_vars(role), **variables}
    templar = Templar(loader=DataLoader(), variables=all_vars)
    text = (ROLES / role / "templates" / template).read_text()
    return templar.template(trust_as_template(text))


def evaluate(role: str, expression: str, variables: dict[str, Any]) -> Any:
    """Evaluate a Jinja expression (e.g. a role variable) in the role's variable context."""
    _role_filters(role)
    variables = validated(variables)
    all_vars = {**role_vars(role), **variables}
    templar = Templar(loader=DataLoader(), variables=all_vars)
    return templar.template(trust_as_template("{{ " + expression + " }}"))
