"""The little PromQL handling dashboards need without a Grafana or a PromQL parser: the metric names an
expression reads (docs/dashboards.md, the unit test's name check) and Grafana's variable substitution
(what the unit test hands promtool and the lab test sends to Prometheus).

Parsing itself is promtool's job (tests/unit/test_dashboards.py); metric_names only has to be right for
the expressions these dashboards are written in (no `offset`, no string functions like label_replace's
regex arguments matter: strings are dropped before names are looked for).
"""

from __future__ import annotations

import re

_STRING = re.compile(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'|`[^`]*`')
_MATCHERS = re.compile(r"\{[^{}]*\}")
_RANGE = re.compile(r"\[[^\[\]]*\]")
_GROUPING = re.compile(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^()]*\)")
_IDENT = re.compile(r"(?<![\w:.$])[A-Za-z_:][\w:]*")
_KEYWORDS = frozenset(
    {"by", "without", "on", "ignoring", "group_left", "group_right", "and", "or", "unless", "bool"}
    | {"offset", "inf", "nan", "Inf", "NaN"}
)

# Grafana's variables as these dashboards use them, and what a query gets for "All".
VARIABLES = ("node", "job_id")
_VAR = re.compile(r"\$(?:\{(\w+)\}|(\w+))")


def metric_names(expr: str) -> list[str]:
    """Sorted metric names the expression selects (functions, keywords and label names left out)."""
    s = _STRING.sub('""', expr)
    s = _MATCHERS.sub(" ", s)
    s = _RANGE.sub(" ", s)
    s = _GROUPING.sub(" ", s)
    names = set()
    for m in _IDENT.finditer(s):
        rest = s[m.end() :].lstrip()
        if m.group() in _KEYWORDS or rest.startswith("("):
            continue  # a function or aggregation call, or a keyword
        names.add(m.group())
    return sorted(names)


def variables_outside_regex(expr: str) -> list[str]:
    """$node / $job_id uses that are not the whole value of a `=~"..."` matcher (Grafana expands a
    multi-value or All selection into a regex, which only a regex matcher reads right)."""
    inside = re.sub(r'=~\s*"\$\{?(?:' + "|".join(VARIABLES) + r')\}?"', "", expr)
    return [m.group(0) for m in _VAR.finditer(inside) if (m.group(1) or m.group(2)) in VARIABLES]


def substitute(expr: str, *, rate_interval: str = "1m", values: dict[str, str] | None = None) -> str:
    """The expression as Grafana sends it: `$node`/`$job_id` (and `${...}`) become the selection's regex
    (".*" for All unless `values` says otherwise), `$__rate_interval`/`$__interval` the window."""
    chosen = {name: ".*" for name in VARIABLES} | (values or {})
    builtins = {"__rate_interval": rate_interval, "__interval": rate_interval, "datasource": "prometheus"}

    def one(m: re.Match[str]) -> str:
        name = m.group(1) or m.group(2)
        if name in chosen:
            return chosen[name]
        if name in builtins:
            return builtins[name]
        raise ValueError(f"unknown variable ${name} in {expr!r}")

    return _VAR.sub(one, expr)
