"""HCA port state from `ibstat` or sysfs (/sys/class/infiniband/<hca>/ports/<p>/...), and its checks:
every HCA of the spec present, its port Active / LinkUp, on the spec's link layer, at >= the spec's rate.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from .expect import FabricExpect
from .report import Check, check, skip

LINK_LAYER = {"infiniband": "InfiniBand", "roce": "Ethernet"}


@dataclass(frozen=True)
class HcaPort:
    hca: str
    port: int
    state: str  # Active / Down / Initializing / Armed
    phys_state: str  # LinkUp / Polling / Disabled / ...
    rate_gbps: float | None
    link_layer: str  # InfiniBand / Ethernet


def parse_ibstat(text: str) -> dict[tuple[str, int], HcaPort]:
    """`ibstat` (all CAs): CA 'mlx5_0' ... Port 1: State/Physical state/Rate/Link layer."""
    out: dict[tuple[str, int], HcaPort] = {}
    hca: str | None = None
    port: int | None = None
    fields: dict[str, str] = {}

    def flush() -> None:
        if hca is not None and port is not None:
            rate = re.match(r"^([\d.]+)", fields.get("Rate", ""))
            out[(hca, port)] = HcaPort(
                hca,
                port,
                fields.get("State", "?"),
                fields.get("Physical state", "?"),
                float(rate.group(1)) if rate else None,
                fields.get("Link layer", "?"),
            )

    for raw in text.splitlines():
        line = raw.strip()
        if m := re.match(r"^CA '([^']+)'", line):
            flush()
            hca, port, fields = m.group(1), None, {}
        elif m := re.match(r"^Port (\d+):$", line):
            flush()
            port, fields = int(m.group(1)), {}
        elif port is not None and ":" in line:
            key, _, value = line.partition(":")
            fields[key.strip()] = value.strip()
    flush()
    return out


def sysfs_word(text: str) -> str:
    """'4: ACTIVE' -> 'Active', '5: LinkUp' -> 'LinkUp' (ibstat's spelling)."""
    word = text.split(":", 1)[-1].strip()
    return word.capitalize() if word.isupper() else word


def read_sysfs(root: Path, hcas: tuple[str, ...], port: int) -> dict[tuple[str, int], HcaPort]:
    """The named HCAs' port from sysfs (root = /sys/class/infiniband); absent HCAs are left out."""
    out = {}
    for hca in hcas:
        d = root / hca / "ports" / str(port)
        if not d.is_dir():
            continue

        def read(name: str, d: Path = d) -> str:
            try:
                return (d / name).read_text(encoding="utf-8").strip()
            except OSError:
                return "?"

        rate = re.match(r"^([\d.]+)", read("rate"))
        out[(hca, port)] = HcaPort(
            hca,
            port,
            sysfs_word(read("state")),
            sysfs_word(read("phys_state")),
            float(rate.group(1)) if rate else None,
            read("link_layer"),
        )
    return out


FABRIC_CHECKS = ("fabric.hcas_present",)


def check_fabric(
    node: str, exp: FabricExpect, ports: dict[tuple[str, int], HcaPort] | None, error: str = ""
) -> list[Check]:
    """One check for presence, then one per HCA (fabric.<hca>) naming what is wrong with it."""
    if exp.type == "ethernet" or not exp.hcas:
        return [skip(node, "fabric.hcas_present", f"spec: fabric type {exp.type}, no HCAs to check")]
    if ports is None:
        return [
            check(
                node,
                "fabric.hcas_present",
                False,
                "unknown",
                ", ".join(exp.hcas),
                f"cannot read HCA state: {error}",
            )
        ]
    missing = [h for h in exp.hcas if (h, exp.port) not in ports]
    out = [
        check(
            node,
            "fabric.hcas_present",
            not missing,
            f"missing {', '.join(missing)}" if missing else f"{len(exp.hcas)}/{len(exp.hcas)} present",
            ", ".join(exp.hcas) + f" (port {exp.port})",
            f"{len(missing)} HCA(s) of the spec not found: {', '.join(missing)}",
        )
    ]
    layer = LINK_LAYER.get(exp.type, "?")
    want = f"Active/LinkUp, {layer}" + (f", >= {exp.rate_gbps} Gb/s" if exp.rate_gbps else "")
    for hca in exp.hcas:
        p = ports.get((hca, exp.port))
        if p is None:
            continue
        problems = []
        if p.state != "Active":
            problems.append(f"state {p.state}")
        if p.phys_state != "LinkUp":
            problems.append(f"physical state {p.phys_state}")
        if p.link_layer != layer:
            problems.append(f"link layer {p.link_layer}")
        if exp.rate_gbps and (p.rate_gbps is None or p.rate_gbps < exp.rate_gbps):
            problems.append(f"rate {p.rate_gbps:g} Gb/s" if p.rate_gbps is not None else "rate unknown")
        rate = f"{p.rate_gbps:g}" if p.rate_gbps is not None else "?"
        value = f"{p.state}/{p.phys_state}, {p.link_layer}, {rate} Gb/s"
        out.append(
            check(
                node,
                f"fabric.{hca}",
                not problems,
                value,
                want,
                f"{hca} port {exp.port}: " + "; ".join(problems),
            )
        )
    return out
