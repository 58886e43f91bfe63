"""Slurm hostlist expressions (topology.conf Nodes= / Switches=): `gpu[01-16]`, `a[1,3-5]b,c07`.

expand() returns the names or raises HostlistError saying what is wrong, so the spec's validation can name
the field, the value and what is expected before Slurm reads the expression on a host.
"""

from __future__ import annotations

import re

# More names than this in one expression is a typo (gpu[1-1000000]), not a cluster.
MAX_NAMES = 65536
EXPECTED = "a Slurm hostlist: comma-separated names, each with optional [ranges] like gpu[01-04,07]"

_RANGE = re.compile(r"(\d+)(?:-(\d+))?")
_SEGMENT = re.compile(r"([^\[\]]*)(?:\[([^\]]*)\])?")


class HostlistError(ValueError):
    """Why an expression is not a Slurm hostlist."""


def _split_top(expr: str) -> list[str]:
    """expr split on the commas outside brackets; unbalanced or nested brackets raise."""
    items, depth, cur = [], 0, []
    for ch in expr:
        if ch == "[":
            if depth:
                raise HostlistError("nested '[' is not allowed")
            depth = 1
        elif ch == "]":
            if not depth:
                raise HostlistError("a ']' without its '['")
            depth = 0
        if ch == "," and not depth:
            items.append("".join(cur))
            cur = []
        else:
            cur.append(ch)
    if depth:
        raise HostlistError("a '[' without its ']'")
    items.append("".join(cur))
    return items


def _ranges(body: str, item: str) -> list[str]:
    out: list[str] = []
    for part in body.split(","):
        m = _RANGE.fullmatch(part)
        if not m:
            raise HostlistError(f"'[{body}]' in {item!r}: ranges are N or N-M with digits only ({part!r})")
        lo, hi = m.group(1), m.group(2) or m.group(1)
        if int(hi) < int(lo):
            raise HostlistError(f"'{part}' in {item!r}: the range ends below its start")
        if int(hi) - int(lo) + 1 > MAX_NAMES:
            raise HostlistError(f"'{part}' in {item!r}: more than {MAX_NAMES} names")
        width = len(lo) if lo.startswith("0") else 0
        out += [str(n).zfill(width) for n in range(int(lo), int(hi) + 1)]
    return out


def expand(expr: str) -> list[str]:
    """The names of a hostlist expression, in order; HostlistError when it is malformed."""
    if not expr:
        raise HostlistError("it is empty")
    names: list[str] = []
    for item in _split_top(expr):
        if not item:
            raise HostlistError("an empty name (',,' or a leading or trailing ',')")
        expanded = [""]
        for m in _SEGMENT.finditer(item):
            if not m.group(0):
                continue
            text, bracket = m.group(1), m.group(2)
            choices = _ranges(bracket, item) if bracket is not None else [""]
            expanded = [p + text + c for p in expanded for c in choices]
            if len(names) + len(expanded) > MAX_NAMES:
                raise HostlistError(f"more than {MAX_NAMES} names")
        names += expanded
    return names


_TRAILING = re.compile(r"^(.*?)(\d+)$")


def compress(names: list[str] | tuple[str, ...]) -> str:
    """The shortest-form hostlist of `names` (duplicates dropped): names that differ only in a trailing
    number of the same width become one bracket, `gpu0001..gpu1000` -> `gpu[0001-1000]`. Names are
    grouped by prefix and digit count and ordered by (prefix, width, number); expand(compress(x)) has
    exactly the names of x. '' for no names."""
    groups: dict[tuple[str, int], set[int]] = {}
    plain: set[str] = set()
    for name in names:
        if not name or any(c in name for c in "[],"):
            raise HostlistError(f"{name!r} is not a host name (empty, or has '[', ']' or ',')")
        m = _TRAILING.match(name)
        if m:
            groups.setdefault((m.group(1), len(m.group(2))), set()).add(int(m.group(2)))
        else:
            plain.add(name)
    items: list[tuple[tuple[str, int, int], str]] = [((n, -1, 0), n) for n in plain]
    for (prefix, width), numbers in groups.items():
        ordered = sorted(numbers)
        runs: list[tuple[int, int]] = []
        for n in ordered:
            if runs and n == runs[-1][1] + 1:
                runs[-1] = (runs[-1][0], n)
            else:
                runs.append((n, n))
        if len(ordered) == 1:
            items.append(((prefix, width, ordered[0]), f"{prefix}{ordered[0]:0{width}d}"))
            continue
        body = ",".join(
            f"{lo:0{width}d}" if lo == hi else f"{lo:0{width}d}-{hi:0{width}d}" for lo, hi in runs
        )
        items.append(((prefix, width, ordered[0]), f"{prefix}[{body}]"))
    return ",".join(text for _, text in sorted(items))
