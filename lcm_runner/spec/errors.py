"""The error type every spec check returns."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any


def _show(value: Any) -> str:
    try:
        return json.dumps(value, sort_keys=True)
    except (TypeError, ValueError):
        return repr(value)


@dataclass(frozen=True)
class SpecError:
    """One problem: which field, the value found there and what was expected."""

    path: str  # dotted field path, e.g. cluster.gpu.count_per_node, or inventory.groups.controller
    value: Any
    expected: str

    def __str__(self) -> str:
        return f"{self.path} = {_show(self.value)}: expected {self.expected}"


class SpecInvalid(ValueError):
    """Raised by load-and-validate helpers; carries every error found."""

    def __init__(self, errors: list[SpecError]) -> None:
        self.errors = errors
        super().__init__("cluster spec invalid:\n" + "\n".join(f"  - {e}" for e in errors))
