"""Checkpoint checksum cost: each algorithm over one file, against the write of that file, in one run.

    python benchmarks/checksum.py [--gb 1] [--dir /tmp] [--out benchmarks/results]

Writes --gb of random bytes (fsynced) in 256 MiB chunks, then hashes the file with every algorithm
lcm_runner.ckpt.integrity offers plus sha256 and blake2b (for comparison) through the same reader the
trainer uses (8 MiB reads; the file is in the page cache, as it is right after a save). Reports s/GB,
GB/s, and each algorithm's time as a ratio of the write and of sha256. Result: checksum-<host>-<UTC>.json.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import socket
import time
from datetime import UTC, datetime
from pathlib import Path

from lcm_runner.ckpt import integrity


def _hashlib(name: str):
    def run(path: Path) -> str:
        h = hashlib.new(name)
        with open(path, "rb", buffering=0) as f:
            while chunk := f.read(integrity.CHUNK):
                h.update(chunk)
        return h.hexdigest()

    return run


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--gb", type=float, default=1.0)
    ap.add_argument("--dir", type=Path, default=Path("/tmp"))
    ap.add_argument("--out", type=Path, default=Path(__file__).resolve().parent / "results")
    ns = ap.parse_args()
    path = ns.dir / f"lcm-checksum-{os.getpid()}.bin"
    size = int(ns.gb * (1 << 30))
    chunk = os.urandom(256 << 20)
    t0 = time.perf_counter()
    with open(path, "wb") as f:
        left = size
        while left > 0:
            n = min(left, len(chunk))
            f.write(chunk[:n])
            left -= n
        f.flush()
        os.fsync(f.fileno())
    write_s = time.perf_counter() - t0
    algos = dict(integrity.ALGORITHMS)
    algos["sha256"] = _hashlib("sha256")
    algos["blake2b"] = _hashlib("blake2b")
    res: dict[str, dict[str, float]] = {}
    try:
        for name, fn in algos.items():
            fn(path)  # warm the page cache and the code path
            t0 = time.perf_counter()
            fn(path)
            dt = time.perf_counter() - t0
            res[name] = {"s": dt, "s_per_gb": dt / (size / 1e9), "gb_per_s": size / 1e9 / dt}
    finally:
        path.unlink(missing_ok=True)
    for r in res.values():
        r["ratio_to_write"] = r["s"] / write_s
        r["ratio_to_sha256"] = r["s"] / res["sha256"]["s"]
    out = {
        "host": socket.gethostname(),
        "cpu": platform.processor() or platform.machine(),
        "when": datetime.now(UTC).isoformat(timespec="seconds"),
        "bytes": size,
        "dir": str(ns.dir),
        "write_s": write_s,
        "write_gb_per_s": size / 1e9 / write_s,
        "default_algorithm": integrity.DEFAULT_ALGORITHM,
        "algorithms": res,
    }
    ns.out.mkdir(parents=True, exist_ok=True)
    dest = ns.out / f"checksum-{out['host']}-{datetime.now(UTC):%Y%m%d-%H%M%S}.json"
    dest.write_text(json.dumps(out, indent=2) + "\n")
    for name, r in sorted(res.items(), key=lambda kv: kv[1]["s"]):
        print(
            f"{name:9s} {r['s_per_gb']:.3f} s/GB  {r['gb_per_s']:6.2f} GB/s  "
            f"{r['ratio_to_write']:.3f}x the write  {r['ratio_to_sha256']:.3f}x sha256"
        )
    print(f"write {out['write_gb_per_s']:.2f} GB/s ({write_s:.2f} s); {dest}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
