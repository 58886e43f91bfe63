"""The checkpoints of one save directory: their states, `latest`, known-good marks, retention.

No torch here (the offline `lcm-runner ckpt verify` uses it too).

    incomplete   no lcm_complete.json: a save that never finished; never selected
    complete     the marker exists (every file listed with its size and digest)
    verified     complete, and every file matches its digest (checked now)
    damaged      complete, but a file is missing, has another size or another digest (names the file)
    rejected     a trainer's load found it damaged (iter_*/lcm_rejected.json): never selected again
    known-good   it verified, and training then made healthy progress from it (iter_*/lcm_good.json)

Retention keeps the newest `keep_last` complete, not rejected checkpoints, and always the newest
known-good one and the one `latest` names: no `keep_last` can leave only suspect checkpoints.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass
from pathlib import Path

from lcm_runner.contracts import LATEST_FILE, iter_dir_name

from .integrity import COMPLETE_MARKER, Verification, fsync_write_json, verify_checkpoint

GOOD_MARKER = "lcm_good.json"
REJECTED_MARKER = "lcm_rejected.json"
GUARD_FILE = "lcm_guard.json"  # <save>/: the numerical guard's rewinds (see lcm_runner/train/guard.py)


class CatalogError(RuntimeError):
    pass


def read_latest(ckpt_dir: str | Path) -> int | None:
    """The step named by <dir>/latest_checkpointed_iteration.txt, or None when there is none."""
    p = Path(ckpt_dir) / LATEST_FILE
    if not p.is_file():
        return None
    text = p.read_text().strip()
    if not text.isdigit():
        raise CatalogError(f"{p}: expected a step number, found {text!r}")
    return int(text)


def write_latest_atomically(ckpt_dir: Path, step: int) -> None:
    tmp = ckpt_dir / f".{LATEST_FILE}.tmp"
    with open(tmp, "w") as f:
        f.write(f"{step}\n")
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, ckpt_dir / LATEST_FILE)
    dfd = os.open(ckpt_dir, os.O_RDONLY)
    try:
        os.fsync(dfd)
    finally:
        os.close(dfd)


def iter_steps(ckpt_dir: Path) -> list[int]:
    """Every iter_NNNNNNN directory's step, ascending (complete or not)."""
    out = []
    for d in ckpt_dir.glob("iter_*"):
        if d.is_dir() and d.name[5:].isdigit():
            out.append(int(d.name[5:]))
    return sorted(out)


def is_complete(ckpt: Path) -> bool:
    return (ckpt / COMPLETE_MARKER).is_file()


def is_rejected(ckpt: Path) -> bool:
    return (ckpt / REJECTED_MARKER).is_file()


def is_known_good(ckpt: Path) -> bool:
    return (ckpt / GOOD_MARKER).is_file()


def complete_steps(ckpt_dir: Path, include_rejected: bool = False) -> list[int]:
    """Steps with a complete (marker-bearing) directory, ascending; rejected ones left out by default."""
    return [
        s
        for s in iter_steps(ckpt_dir)
        if is_complete(ckpt_dir / iter_dir_name(s))
        and (include_rejected or not is_rejected(ckpt_dir / iter_dir_name(s)))
    ]


def known_good_steps(ckpt_dir: Path) -> list[int]:
    return [s for s in complete_steps(ckpt_dir) if is_known_good(ckpt_dir / iter_dir_name(s))]


def newest_known_good(ckpt_dir: Path, before: int | None = None) -> int | None:
    good = [s for s in known_good_steps(ckpt_dir) if before is None or s < before]
    return good[-1] if good else None


def mark_known_good(ckpt_dir: Path, step: int, healthy_steps: int, last_step: int, loss: float) -> None:
    fsync_write_json(
        ckpt_dir / iter_dir_name(step) / GOOD_MARKER,
        {
            "step": step,
            "healthy_steps": healthy_steps,
            "through_step": last_step,
            "loss": loss,
            "ts": time.time(),
        },
    )


def mark_rejected(ckpt_dir: Path, step: int, file: str, reason: str) -> None:
    d = ckpt_dir / iter_dir_name(step)
    if d.is_dir():
        fsync_write_json(
            d / REJECTED_MARKER, {"step": step, "file": file, "reason": reason, "ts": time.time()}
        )
        (d / GOOD_MARKER).unlink(missing_ok=True)


def retention_plan(
    ckpt_dir: Path, keep_last: int, latest: int | None, in_flight: set[int] | None = None
) -> list[int]:
    """Steps whose directories may be deleted now: older than `latest`, not among the newest
    `keep_last` complete, not-rejected checkpoints, not the newest known-good, not in flight."""
    if keep_last <= 0 or latest is None:
        return []
    keep = set(complete_steps(ckpt_dir)[-keep_last:]) | {latest} | set(in_flight or ())
    good = newest_known_good(ckpt_dir)
    if good is not None:
        keep.add(good)
    return [s for s in iter_steps(ckpt_dir) if s < latest and s not in keep]


@dataclass
class Entry:
    step: int
    path: Path
    state: str  # incomplete | complete | verified | damaged | legacy
    known_good: bool
    rejected: str  # the recorded rejection ("" when none)
    detail: str
    verification: Verification | None = None

    def line(self, latest: int | None) -> str:
        tags = []
        if self.known_good:
            tags.append("known-good")
        if self.rejected:
            tags.append(f"rejected earlier: {self.rejected}")
        if latest == self.step:
            tags.append("<- latest")
        extra = f" ({'; '.join(tags)})" if tags else ""
        detail = f": {self.detail}" if self.detail else ""
        return f"{self.path.name}  {self.state}{detail}{extra}"


def scan(ckpt_dir: Path, verify: bool = True) -> list[Entry]:
    """Every checkpoint of `ckpt_dir`, ascending, with its state (digests checked when `verify`)."""
    out = []
    for s in iter_steps(ckpt_dir):
        d = ckpt_dir / iter_dir_name(s)
        rejected = ""
        if is_rejected(d):
            try:
                r = json.loads((d / REJECTED_MARKER).read_text())
                rejected = f"{r.get('file')}: {r.get('reason')}"
            except (OSError, ValueError):
                rejected = "(unreadable record)"
        if not is_complete(d):
            out.append(Entry(s, d, "incomplete", False, rejected, "no lcm_complete.json"))
            continue
        if not verify:
            out.append(Entry(s, d, "complete", is_known_good(d), rejected, ""))
            continue
        v = verify_checkpoint(d)
        if v.legacy:
            state, detail = (
                ("legacy", "complete, no checksums recorded") if v.ok else ("damaged", v.first_problem())
            )
        elif v.ok:
            state, detail = "verified", f"{v.files_checked} files, {v.bytes_checked / 1e6:.1f} MB"
        else:
            state, detail = "damaged", v.first_problem()
        out.append(Entry(s, d, state, is_known_good(d), rejected, detail, v))
    return out
