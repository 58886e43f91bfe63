"""Fabric Manager (NVSwitch systems): the service is active and its version equals the driver version."""

from __future__ import annotations

import re
from dataclasses import dataclass

from .expect import GpuExpect
from .report import Check, check, skip

VERSION = re.compile(r"(\d+\.\d+(?:\.\d+)?)")


def parse_version(text: str) -> str | None:
    """`nv-fabricmanager --version` ('Fabric Manager version is : 580.159.04') or a dpkg version
    ('580.159.04-1', '1:580.159.04-1') -> '580.159.04'."""
    text = re.sub(r"^\s*\d+:", "", text.strip())
    m = VERSION.search(text)
    return m.group(1) if m else None


@dataclass(frozen=True)
class FabricManagerState:
    active: str | None  # systemctl is-active's word (active/inactive/failed), None = no systemd
    version_text: str | None  # nv-fabricmanager --version or the package version; None = not found
    version_source: str = ""
    error: str = ""


def check_fabric_manager(node: str, exp: GpuExpect, state: FabricManagerState, driver: str) -> list[Check]:
    if not (exp.nvswitch and exp.fabric_manager):
        reason = "spec: no NVSwitch (no Fabric Manager)"
        return [skip(node, "fm.active", reason), skip(node, "fm.version", reason)]
    out = []
    if state.active is None:
        out.append(skip(node, "fm.active", "no systemd: the service state cannot be read", "active"))
    else:
        out.append(
            check(
                node,
                "fm.active",
                state.active == "active",
                state.active,
                "active",
                "nvidia-fabricmanager is not running: NVLink is unusable on an NVSwitch system",
            )
        )
    want = driver or exp.driver
    version = parse_version(state.version_text) if state.version_text else None
    if version is None:
        out.append(
            check(
                node,
                "fm.version",
                False,
                "not found",
                want or "the driver version",
                state.error or "neither nv-fabricmanager --version nor the package reports a version",
            )
        )
    elif not want:
        out.append(skip(node, "fm.version", "no driver version to compare with", value=version))
    else:
        out.append(
            check(
                node,
                "fm.version",
                version == want,
                f"{version} ({state.version_source})",
                f"{want} (the driver)",
                "Fabric Manager and the driver differ: FM refuses to start",
            )
        )
    return out
