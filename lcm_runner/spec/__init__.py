"""The cluster spec: one schema (schema.yml), one validator, one loader for Ansible and the runner.

from lcm_runner.spec import load_cluster, validate
errors = validate(load_cluster("inventories/lab"), {"controller": ["ctl"], "compute": ["c1"]})
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .errors import SpecError, SpecInvalid
from .loader import load_cluster, load_inventory_groups
from .rules import inventory_rules, spec_rules
from .schema import check, load_schema

__all__ = ["SpecError", "SpecInvalid", "load_cluster", "load_inventory_groups", "load_schema", "validate"]


def validate(spec: Any, inventory_groups: Mapping[str, list[str]] | None = None) -> list[SpecError]:
    """Every error of the cluster mapping (the value of `cluster:`) and, when given, the inventory groups.

    Cross-field rules run only when the schema passes (they rely on the types); inventory rules always run.
    """
    errors = check(spec, load_schema(), "cluster")
    if not errors:
        errors = spec_rules(spec)
    if inventory_groups is not None:
        errors += inventory_rules(spec if isinstance(spec, Mapping) else {}, inventory_groups)
    return errors
