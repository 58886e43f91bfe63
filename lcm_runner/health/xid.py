"""XID errors in the kernel log: `NVRM: Xid (PCI:0000:3b:00): 79, pid=..., GPU has fallen off the bus.`"""

from __future__ import annotations

import re
from dataclasses import dataclass

from .expect import GpuExpect
from .report import Check, check, skip

XID_LINE = re.compile(r"NVRM: Xid \((PCI:[0-9A-Fa-f:.]+)\): (\d+),\s*(.*)$")


@dataclass(frozen=True)
class Xid:
    code: int
    pci: str
    message: str


def parse_xids(text: str) -> list[Xid]:
    out = []
    for line in text.splitlines():
        if m := XID_LINE.search(line):
            out.append(Xid(int(m.group(2)), m.group(1), m.group(3).strip()))
    return out


def check_xids(node: str, exp: GpuExpect, log: str | None, unreadable: str = "") -> Check:
    """log None = the kernel log could not be read (unreadable says why): skip, never a silent pass."""
    ignore = sorted(set(exp.xid_ignore))
    expected = "no XID" + (f" except {','.join(map(str, ignore))}" if ignore else "")
    if log is None:
        return skip(node, "gpu.xid", f"kernel log unreadable: {unreadable or 'no source'}", expected)
    xids = parse_xids(log)
    bad = [x for x in xids if x.code not in ignore]
    if bad:
        first = {}
        for x in bad:
            first.setdefault((x.code, x.pci), x)
        value = "; ".join(f"Xid {x.code} on {x.pci}: {x.message}" for x in first.values())
        codes = ",".join(str(c) for c in sorted({x.code for x in bad}))
        return check(
            node,
            "gpu.xid",
            False,
            value,
            expected,
            f"{len(bad)} XID line(s) (codes {codes}) in the kernel log",
        )
    note = f"{len(xids)} ignored XID line(s)" if xids else "none"
    return check(node, "gpu.xid", True, note, expected)
