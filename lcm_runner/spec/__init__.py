"""The cluster spec: one schema (schema.yml), one validator, one loader for Ansible and the runner.

from lcm_runner.spec import fill_defaults, load_cluster, validate
errors = validate(load_cluster("inventories/lab"), {"controller": ["ctl"], "compute": ["c1"]})
cluster = fill_defaults(spec)   # what the roles read: every schema default filled in

The schema is the only place spec defaults are written: validation fills them in (fill_defaults) and
playbooks/validate.yml hands the filled-in spec to every host as the `cluster` fact.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .errors import SpecError, SpecInvalid
from .loader import load_cluster, load_inventory_groups
from .rules import inventory_rules, spec_rules
from .schema import check, fill_defaults, load_schema

__all__ = [
    "SpecError",
    "SpecInvalid",
    "fill_defaults",
    "load_cluster",
    "load_inventory_groups",
    "load_schema",
    "validate",
    "validated",
]


def validate(
    spec: Any,
    inventory_groups: Mapping[str, list[str]] | None = None,
    lock: Any = None,
    settings: Mapping[str, Any] | None = None,
) -> list[SpecError]:
    """Every error of the cluster mapping (the value of `cluster:`) and, when given, the inventory groups
    and the lock (lcm_lock; settings: inventory overrides of the role settings the lock needs depend on).

    Cross-field and lock rules run only when the schema passes (they rely on the types); inventory rules
    always run. Rules see the spec with its defaults filled in.
    """
    errors = check(spec, load_schema(), "cluster")
    filled = fill_defaults(spec)
    if not errors:
        errors = spec_rules(filled)
    if inventory_groups is not None:
        errors += inventory_rules(filled if isinstance(filled, Mapping) else {}, inventory_groups)
    if lock is not None:
        from .lock_rules import lock_errors
        from .lock_shape import check_lock

        errors += lock_errors(filled, lock, settings) if not errors else check_lock(lock)
    return errors


def validated(
    spec: Any,
    inventory_groups: Mapping[str, list[str]] | None = None,
    lock: Any = None,
    settings: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """The spec with its defaults filled in; raises SpecInvalid listing every error."""
    errors = validate(spec, inventory_groups, lock, settings)
    if errors:
        raise SpecInvalid(errors)
    out: dict[str, Any] = fill_defaults(spec)
    return out
