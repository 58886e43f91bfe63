"""A node's record of its last complete converge, and the check that nothing changed since (standard library).

`<generations_dir>/converged.json` = {"fingerprint": <sha256 of the converge's inputs>, "generation": <n>,
"services": [managed services running then]}, written by the last play of site.yml on every node that
finished the converge (playbooks/generation.yml). site.yml's unchanged check (playbooks/unchanged.yml) skips
the whole converge only when every node reports `unchanged`: the same inputs fingerprint, its current
generation still the one that converge recorded, no drift of any managed file or package from it, and every
managed service that was running then still running. Anything else is a reason; the converge runs in full.
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


def parse_show(text: str, units: Sequence[str]) -> dict[str, bool]:
    """`systemctl show -p Id,Type,ActiveState <units>` (one block per unit, in order) -> unit -> a service
    that runs (active, not Type=oneshot: a timer's oneshot is active only while it runs: no lasting state)."""
    blocks = text.strip().split("\n\n") if text.strip() else []
    out: dict[str, bool] = {}
    for i, unit in enumerate(units):
        props = (
            dict(line.split("=", 1) for line in blocks[i].splitlines() if "=" in line)
            if i < len(blocks)
            else {}
        )
        out[unit] = props.get("ActiveState") == "active" and props.get("Type", "") != "oneshot"
    return out


def systemd_active(units: Sequence[str]) -> dict[str, bool]:
    """unit -> a running service (parse_show; one systemctl call for all units)."""
    if not units:
        return {}
    proc = subprocess.run(
        ["systemctl", "show", "--property=Id,Type,ActiveState", "--", *units],
        capture_output=True,
        text=True,
        check=False,
    )
    return parse_show(proc.stdout, units)


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
    """Write converged.json for this converge; return (changed, record).

    A record of the same fingerprint and generation is kept as it is: it describes the first complete converge
    to this state, and a second one (the idempotence run) changes nothing. Its units are the managed services
    running then (a unit still starting, or a timer's oneshot, is not expected to run later)."""
    gen = current_number(gen_dir)
    path = gen_dir / RECORD_NAME
    try:
        old = read_record(gen_dir)
    except GenerationError:
        old = None
    if old is not None and old["fingerprint"] == fingerprint and old.get("generation") == gen:
        return False, old
    services = managed_services(managed_dir)
    active = active_query(services)
    text = record_text(fingerprint, gen, [u for u in services if active.get(u)])
    changed = True
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
