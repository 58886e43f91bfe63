"""Checksums of checkpoint files: computed by the process that wrote a file, checked before a load.

No torch here: `lcm-runner ckpt verify` runs on a controller without the trainer's packages.

Layout inside one checkpoint directory (iter_NNNNNNN/):

    __<rank>_<n>.distcp            shards, written by rank <rank>'s writer (a forked process when async)
    .metadata, metadata.json, common.pt   written by rank 0
    lcm_sums/rank<R>.json          {file: {size, digest}} of the shards rank R's writer wrote, written
                                   by that writer right after its shards (fsynced)
    lcm_complete.json              the completeness marker: every file with its size and digest, the
                                   algorithm, step and world size; written last, by rank 0

Hash: xxh3-128 (xxhash) where installed, else zlib's crc32 (stdlib). Measured on the lab machine
(benchmarks/results/checksum.json): xxh3_128 0.033 s/GB, crc32c 0.064, zlib crc32 0.25, sha256 0.56.
"""

from __future__ import annotations

import json
import os
import time
import zlib
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

COMPLETE_MARKER = "lcm_complete.json"
SUMS_DIR = "lcm_sums"
MANIFEST_VERSION = 2  # 1: the marker without per-file digests (written before checksums existed)
CHUNK = 8 << 20

try:  # pragma: no cover - which branch runs depends on the environment
    import xxhash as _xxhash
except ImportError:  # pragma: no cover
    _xxhash = None


def _crc32(path: Path) -> str:
    crc = 0
    with open(path, "rb", buffering=0) as f:
        while chunk := f.read(CHUNK):
            crc = zlib.crc32(chunk, crc)
    return f"{crc:08x}"


def _xxh3_128(path: Path) -> str:
    assert _xxhash is not None
    h = _xxhash.xxh3_128()
    with open(path, "rb", buffering=0) as f:
        while chunk := f.read(CHUNK):
            h.update(chunk)
    return h.hexdigest()


ALGORITHMS: dict[str, Callable[[Path], str]] = {"crc32": _crc32}
if _xxhash is not None:
    ALGORITHMS["xxh3_128"] = _xxh3_128
DEFAULT_ALGORITHM = "xxh3_128" if "xxh3_128" in ALGORITHMS else "crc32"


class IntegrityError(RuntimeError):
    """A checkpoint that must not be loaded: names the checkpoint and the file."""

    def __init__(self, ckpt: Path, file: str, reason: str):
        super().__init__(f"{ckpt}: {file}: {reason}")
        self.ckpt, self.file, self.reason = ckpt, file, reason


def digest(path: Path, algorithm: str = DEFAULT_ALGORITHM) -> str:
    try:
        fn = ALGORITHMS[algorithm]
    except KeyError:
        raise ValueError(
            f"checksum algorithm {algorithm!r} is not available here (have: {', '.join(ALGORITHMS)}; "
            "xxh3_128 needs the xxhash package)"
        ) from None
    return fn(path)


def fsync_write_json(path: Path, data: Any) -> None:
    """Write JSON durably: temp file, fsync, rename, fsync the directory."""
    tmp = path.with_name(f".{path.name}.tmp")
    with open(tmp, "w") as f:
        json.dump(data, f, sort_keys=True)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    dfd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dfd)
    finally:
        os.close(dfd)


def rank_shards(ckpt: Path, rank: int) -> list[Path]:
    return sorted(ckpt.glob(f"__{rank}_*.distcp"))


def sum_files(files: Iterable[Path], root: Path, algorithm: str = DEFAULT_ALGORITHM) -> dict[str, dict]:
    """Sizes and digests; several files (one per writer thread) are hashed in parallel threads."""
    paths = list(files)

    def one(f: Path) -> tuple[str, dict]:
        return str(f.relative_to(root)), {"size": f.stat().st_size, "digest": digest(f, algorithm)}

    if len(paths) < 2:
        return dict(map(one, paths))
    with ThreadPoolExecutor(max_workers=min(len(paths), 8)) as pool:
        return dict(pool.map(one, paths))


def write_rank_sums(ckpt: Path, rank: int, algorithm: str = DEFAULT_ALGORITHM) -> dict[str, dict]:
    """Called by rank `rank`'s writer once its shards are on disk: their sizes and digests, fsynced."""
    t0 = time.perf_counter()
    sums = sum_files(rank_shards(ckpt, rank), ckpt, algorithm)
    seconds = time.perf_counter() - t0
    (ckpt / SUMS_DIR).mkdir(exist_ok=True)
    fsync_write_json(
        ckpt / SUMS_DIR / f"rank{rank}.json", {"algorithm": algorithm, "files": sums, "seconds": seconds}
    )
    return sums


@dataclass(frozen=True)
class HashingWriter:
    """A writer function (dist_checkpointing's async_fn) wrapped so that the process that wrote the shards
    hashes them right after: the trainer (sync), its forked writer (mcore async) or NVRx's persistent
    checkpoint worker (nvrx async: the request is pickled to it, hence a class, not a closure)."""

    fn: Callable[..., Any] | None
    ckpt: Path
    rank: int
    algorithm: str

    def __call__(self, *args: Any, **kwargs: Any) -> None:
        if self.fn is not None:
            self.fn(*args, **kwargs)
        write_rank_sums(self.ckpt, self.rank, self.algorithm)


def metadata_files(ckpt: Path) -> list[Path]:
    names = (".metadata", "metadata.json", "common.pt")
    return [ckpt / n for n in names if (ckpt / n).is_file()]


def build_manifest(ckpt: Path, world: int, step: int, algorithm: str, extra: dict | None = None) -> dict:
    """Rank 0, after every rank's writer finished: the marker's content. Raises IntegrityError when a
    rank's sums are missing, a shard on disk has no sum, or a summed shard is missing/changed size."""
    files: dict[str, dict] = {}
    writer_s = 0.0
    for r in range(world):
        p = ckpt / SUMS_DIR / f"rank{r}.json"
        try:
            data = json.loads(p.read_text())
        except (OSError, ValueError) as e:
            raise IntegrityError(
                ckpt, str(p.relative_to(ckpt)), f"rank {r}'s checksums unreadable: {e}"
            ) from e
        if data.get("algorithm") != algorithm:
            raise IntegrityError(ckpt, p.name, f"algorithm {data.get('algorithm')!r}, expected {algorithm!r}")
        files.update(data["files"])
        writer_s = max(writer_s, float(data.get("seconds", 0.0)))
    on_disk = {str(f.relative_to(ckpt)) for f in ckpt.glob("__*_*.distcp")}
    if missing := sorted(on_disk - set(files)):
        raise IntegrityError(ckpt, missing[0], "a shard no writer recorded")
    for name, meta in files.items():
        f = ckpt / name
        if not f.is_file():
            raise IntegrityError(ckpt, name, "shard recorded by its writer is missing")
        if f.stat().st_size != meta["size"] or meta["size"] == 0:
            raise IntegrityError(ckpt, name, f"size {f.stat().st_size}, writer recorded {meta['size']}")
    meta_files = metadata_files(ckpt)
    if not any(f.name == ".metadata" for f in meta_files) or not any(
        f.name == "metadata.json" for f in meta_files
    ):
        raise IntegrityError(ckpt, ".metadata/metadata.json", "metadata not written")
    t0 = time.perf_counter()
    files.update(sum_files(meta_files, ckpt, algorithm))
    return {
        "hash_s": {"writers_max": round(writer_s, 6), "metadata": round(time.perf_counter() - t0, 6)},
        "version": MANIFEST_VERSION,
        "step": step,
        "world_size": world,
        "algorithm": algorithm,
        "bytes": sum(m["size"] for m in files.values()),
        "files": files,
        **(extra or {}),
    }


def read_marker(ckpt: Path) -> dict | None:
    p = ckpt / COMPLETE_MARKER
    if not p.is_file():
        return None
    try:
        data = json.loads(p.read_text())
    except (OSError, ValueError) as e:
        raise IntegrityError(ckpt, COMPLETE_MARKER, f"unreadable marker: {e}") from e
    if not isinstance(data, dict):
        raise IntegrityError(ckpt, COMPLETE_MARKER, "marker is not a JSON object")
    return data


@dataclass
class Verification:
    ckpt: Path
    ok: bool
    files_checked: int = 0
    bytes_checked: int = 0
    problems: list[tuple[str, str]] = field(default_factory=list)  # (file, reason)
    legacy: bool = False  # a marker without digests (written before checksums): complete, unverifiable

    def first_problem(self) -> str:
        if not self.problems:
            return ""
        f, why = self.problems[0]
        more = f" (+{len(self.problems) - 1} more)" if len(self.problems) > 1 else ""
        return f"{f}: {why}{more}"


def verify_files(ckpt: Path, marker: dict, names: Iterable[str] | None = None) -> Verification:
    """Check the files of `marker` (or the subset `names`) against their recorded size and digest."""
    v = Verification(ckpt, ok=True)
    files: dict[str, dict] = marker.get("files") or {}
    algorithm = marker.get("algorithm", "")
    if algorithm not in ALGORITHMS:
        v.ok = False
        v.problems.append((COMPLETE_MARKER, f"checksum algorithm {algorithm!r} not available here"))
        return v
    for name in sorted(names if names is not None else files):
        meta = files[name]
        f = ckpt / name
        try:
            size = f.stat().st_size
        except OSError as e:
            v.problems.append((name, f"missing ({e.strerror})"))
            continue
        if size != meta["size"]:
            v.problems.append((name, f"size {size}, recorded {meta['size']}"))
            continue
        try:
            got = digest(f, algorithm)
        except OSError as e:
            v.problems.append((name, f"unreadable ({e.strerror})"))
            continue
        v.files_checked += 1
        v.bytes_checked += size
        if got != meta["digest"]:
            v.problems.append((name, f"{algorithm} mismatch: recorded {meta['digest']}, file has {got}"))
    v.ok = not v.problems
    return v


def verify_checkpoint(ckpt: Path, part: int = 0, parts: int = 1) -> Verification:
    """Verify a checkpoint directory (or its `part`-th of `parts` slices of files, for parallel checks
    by several ranks). A missing or unreadable marker or metadata file is a problem of every slice."""
    try:
        marker = read_marker(ckpt)
    except IntegrityError as e:
        return Verification(ckpt, ok=False, problems=[(e.file, e.reason)])
    if marker is None:
        return Verification(
            ckpt, ok=False, problems=[(COMPLETE_MARKER, "no completeness marker (incomplete)")]
        )
    if not marker.get("files"):
        v = Verification(ckpt, ok=True, legacy=True)
        for name in (".metadata", "metadata.json"):
            if not (ckpt / name).is_file():
                v.ok = False
                v.problems.append((name, "missing"))
        return v
    names = sorted(marker["files"])
    mine = [n for i, n in enumerate(names) if i % parts == part]
    v = verify_files(ckpt, marker, mine)
    for name in ("metadata.json",):  # every slice also checks the metadata parses
        if name in marker["files"]:
            try:
                json.loads((ckpt / name).read_text())
            except (OSError, ValueError) as e:
                v.problems.append((name, f"unreadable metadata: {e}"))
                v.ok = False
    return v
