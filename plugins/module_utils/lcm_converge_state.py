"""A node's record of its last complete converge, and the check that nothing changed since (standard library).

`<generations_dir>/converged.json` = {"fingerprint": <sha256 of the converge's inputs>, "generation": <n>,
"services": [units active then]}, written by the last play of site.yml on every node that finished the
converge (roles/_generation, playbooks/generation.yml). site.yml's unchanged check (playbooks/unchanged.yml)
skips the whole converge only when every node reports `unchanged`: the same inputs fingerprint, its
current generation still the one that converge recorded, no drift of any managed file or package from it,
and every unit that was active still active. Anything else is a reason, and the converge runs in full.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from ansible.module_utils.lcm_generation_ops import drift
from ansible.module_utils.lcm_generation_store import (
    GenerationError,
    PkgQuery,
    current_number,
    dpkg_versions,
    read_manifests,
)

RECORD_NAME = "converged.json"

ActiveQuery = Callable[[Sequence[str]], dict[str, bool]]


def systemd_active(units: Sequence[str]) -> dict[str, bool]:
    """unit -> `systemctl is-active` says active (one systemctl call for all units)."""
    if not units:
        return {}
    proc = subprocess.run(
        ["systemctl", "is-active", "--", *units], capture_output=True, text=True, check=False
    )
    states = proc.stdout.split("\n")
    return {u: (states[i].strip() == "active" if i < len(states) else False) for i, u in enumerate(units)}


def managed_services(managed_dir: Path) -> list[str]:
    return sorted({s for r in read_manifests(managed_dir).values() for s in r.get("services", [])})


def record_text(fingerprint: str, generation: int | None, services: Sequence[str]) -> str:
    body = {"fingerprint": fingerprint, "generation": generation, "services": sorted(services)}
    return json.dumps(body, indent=2, sort_keys=True) + "\n"


def read_record(gen_dir: Path) -> dict[str, Any] | None:
    path = gen_dir / RECORD_NAME
    try:
        rec = json.loads(path.read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        raise GenerationError(f"{path}: unreadable ({exc})") from exc
    if not isinstance(rec, dict) or not isinstance(rec.get("fingerprint"), str):
        raise GenerationError(f"{path}: not a converge record (no fingerprint)")
    return rec


def mark(
    gen_dir: Path,
    managed_dir: Path,
    fingerprint: str,
    check: bool = False,
    active_query: ActiveQuery = systemd_active,
) -> tuple[bool, dict[str, Any]]:
    """Write converged.json for this converge (only when its bytes differ); return (changed, record)."""
    services = managed_services(managed_dir)
    active = active_query(services)
    text = record_text(fingerprint, current_number(gen_dir), [u for u in services if active.get(u)])
    path = gen_dir / RECORD_NAME
    try:
        old = path.read_text()
    except FileNotFoundError:
        old = None
    changed = old != text
    if changed and not check:
        gen_dir.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(text)
        tmp.chmod(0o600)
        tmp.replace(path)
    return changed, json.loads(text)


def check(
    gen_dir: Path,
    managed_dir: Path,
    fingerprint: str,
    pkg_query: PkgQuery = dpkg_versions,
    active_query: ActiveQuery = systemd_active,
) -> list[str]:
    """Every reason this node must be converged again; [] when nothing changed since its last converge."""
    try:
        rec = read_record(gen_dir)
    except GenerationError as exc:
        return [str(exc)]
    if rec is None:
        return [f"no record of a complete converge ({gen_dir / RECORD_NAME})"]
    reasons: list[str] = []
    if rec["fingerprint"] != fingerprint:
        reasons.append(
            f"the converge's inputs changed (fingerprint {fingerprint[:12]}, "
            f"last converge {rec['fingerprint'][:12]})"
        )
    cur = current_number(gen_dir)
    if cur != rec.get("generation"):
        reasons.append(f"current generation is {cur}, the last converge recorded {rec.get('generation')}")
    try:
        _, diffs = drift(gen_dir, managed_dir, pkg_query)
    except GenerationError as exc:
        return [*reasons, str(exc)]
    for d in diffs:
        reasons.append(f"drift: {d['role']} {d['kind']} {d.get('path') or d.get('name')}")
    units = [u for u in rec.get("services", []) if isinstance(u, str)]
    active = active_query(units)
    reasons += [f"service {u} is not active" for u in units if not active.get(u)]
    return reasons
