"""Checkpoint integrity and the catalog without torch: digests, manifests, verification of every kind
of damage, states, retention that never drops the newest known-good checkpoint, `lcm-runner ckpt verify`."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from lcm_runner.ckpt import catalog, integrity
from lcm_runner.ckpt.cli import run_verify
from lcm_runner.contracts import LATEST_FILE, iter_dir_name


def make_ckpt(root: Path, step: int, world: int = 2, size: int = 4096, good: bool = False) -> Path:
    """A checkpoint directory as the trainer writes it: shards per rank, their sums, metadata, marker."""
    d = root / iter_dir_name(step)
    d.mkdir(parents=True)
    for r in range(world):
        (d / f"__{r}_0.distcp").write_bytes(os.urandom(size))
        integrity.write_rank_sums(d, r)
    (d / ".metadata").write_bytes(os.urandom(512))
    (d / "metadata.json").write_text(json.dumps({"sharded_backend": "torch_dist"}))
    m = integrity.build_manifest(d, world, step, integrity.DEFAULT_ALGORITHM)
    integrity.fsync_write_json(d / integrity.COMPLETE_MARKER, m)
    if good:
        catalog.mark_known_good(root, step, 5, step + 5, 1.0)
    return d


def flip(path: Path, n: int = 64) -> None:
    b = bytearray(path.read_bytes())
    off = len(b) // 2
    for i in range(n):
        b[off + i] ^= 0xFF
    path.write_bytes(bytes(b))


@pytest.mark.parametrize("algorithm", sorted(integrity.ALGORITHMS))
def test_digest_changes_with_one_flipped_byte(tmp_path: Path, algorithm: str) -> None:
    f = tmp_path / "x"
    f.write_bytes(os.urandom(3 * integrity.CHUNK + 17))  # several chunks and a tail
    before = integrity.digest(f, algorithm)
    assert integrity.digest(f, algorithm) == before
    flip(f, 1)
    assert integrity.digest(f, algorithm) != before


def test_unknown_algorithm_is_named(tmp_path: Path) -> None:
    (tmp_path / "x").write_bytes(b"a")
    with pytest.raises(ValueError, match="'md4' is not available"):
        integrity.digest(tmp_path / "x", "md4")


def test_manifest_lists_every_file_with_size_and_digest(tmp_path: Path) -> None:
    d = make_ckpt(tmp_path, 10)
    m = integrity.read_marker(d)
    assert m is not None
    assert sorted(m["files"]) == [".metadata", "__0_0.distcp", "__1_0.distcp", "metadata.json"]
    assert m["bytes"] == sum(
        f.stat().st_size for f in d.iterdir() if f.is_file() and f.name != "lcm_complete.json"
    )
    assert m["algorithm"] == integrity.DEFAULT_ALGORITHM and m["world_size"] == 2 and m["step"] == 10
    assert integrity.verify_checkpoint(d).ok


def test_manifest_refuses_a_shard_no_writer_recorded(tmp_path: Path) -> None:
    d = tmp_path / "iter_0000001"
    d.mkdir()
    for r in range(2):
        (d / f"__{r}_0.distcp").write_bytes(b"x" * 10)
        integrity.write_rank_sums(d, r)
    (d / "__1_1.distcp").write_bytes(b"late")  # written after rank 1's writer recorded its sums
    (d / ".metadata").write_bytes(b"m")
    (d / "metadata.json").write_text("{}")
    with pytest.raises(integrity.IntegrityError, match=r"__1_1\.distcp: a shard no writer recorded"):
        integrity.build_manifest(d, 2, 1, integrity.DEFAULT_ALGORITHM)


def test_manifest_refuses_a_rank_without_sums_and_missing_metadata(tmp_path: Path) -> None:
    d = tmp_path / "iter_0000001"
    d.mkdir()
    (d / "__0_0.distcp").write_bytes(b"x")
    integrity.write_rank_sums(d, 0)
    with pytest.raises(integrity.IntegrityError, match="rank 1's checksums unreadable"):
        integrity.build_manifest(d, 2, 1, integrity.DEFAULT_ALGORITHM)
    with pytest.raises(integrity.IntegrityError, match="metadata not written"):
        integrity.build_manifest(d, 1, 1, integrity.DEFAULT_ALGORITHM)


DAMAGE = {
    "flipped bytes in a shard": (lambda d: flip(d / "__1_0.distcp"), "__1_0.distcp", "mismatch"),
    "one flipped bit": (lambda d: flip(d / "__0_0.distcp", 1), "__0_0.distcp", "mismatch"),
    "missing shard": (lambda d: (d / "__0_0.distcp").unlink(), "__0_0.distcp", "missing"),
    "truncated shard": (
        lambda d: (d / "__1_0.distcp").write_bytes((d / "__1_0.distcp").read_bytes()[:100]),
        "__1_0.distcp",
        "size 100",
    ),
    "metadata rewritten": (lambda d: (d / "metadata.json").write_text("{not json"), "metadata.json", ""),
    "torch metadata flipped": (lambda d: flip(d / ".metadata", 8), ".metadata", "mismatch"),
    "marker unreadable": (
        lambda d: (d / "lcm_complete.json").write_text("{"),
        "lcm_complete.json",
        "unreadable marker",
    ),
    "marker missing": (lambda d: (d / "lcm_complete.json").unlink(), "lcm_complete.json", "incomplete"),
}


@pytest.mark.parametrize("kind", sorted(DAMAGE))
def test_every_kind_of_damage_names_the_file(tmp_path: Path, kind: str) -> None:
    damage, file, words = DAMAGE[kind]
    d = make_ckpt(tmp_path, 4)
    damage(d)
    v = integrity.verify_checkpoint(d)
    assert not v.ok
    assert v.problems[0][0] == file, v.problems
    assert words in v.problems[0][1]


def test_verification_slices_cover_every_file_once(tmp_path: Path) -> None:
    d = make_ckpt(tmp_path, 4, world=3)
    flip(d / "__2_0.distcp")
    parts = [integrity.verify_checkpoint(d, part=p, parts=3) for p in range(3)]
    assert sum(p.files_checked for p in parts) == 5  # 3 shards + 2 metadata files, each once
    assert sum(len(p.problems) for p in parts) == 1
    assert [p.ok for p in parts].count(False) == 1


def test_legacy_marker_is_complete_but_unverified(tmp_path: Path) -> None:
    d = make_ckpt(tmp_path, 4)
    (d / "lcm_complete.json").write_text(json.dumps({"step": 4, "bytes": 1, "world_size": 2}))
    v = integrity.verify_checkpoint(d)
    assert v.ok and v.legacy


def test_retention_never_drops_the_newest_known_good(tmp_path: Path) -> None:
    """The issue's case: keep_last 2 and two suspect checkpoints after the last good one."""
    for s, good in ((3600, True), (3800, True), (4000, False), (4200, False)):
        make_ckpt(tmp_path, s, good=good)
    assert catalog.newest_known_good(tmp_path) == 3800
    assert catalog.retention_plan(tmp_path, keep_last=2, latest=4200) == [3600]
    assert catalog.retention_plan(tmp_path, keep_last=1, latest=4200) == [3600, 4000]
    assert catalog.retention_plan(tmp_path, keep_last=0, latest=4200) == []  # 0: keep everything


def test_retention_skips_rejected_ones_when_counting(tmp_path: Path) -> None:
    for s in (10, 20, 30):
        make_ckpt(tmp_path, s)
    catalog.mark_rejected(tmp_path, 30, "__1_0.distcp", "mismatch")
    (tmp_path / iter_dir_name(40)).mkdir()  # an incomplete save, newer than latest: in flight, kept
    assert catalog.complete_steps(tmp_path) == [10, 20]
    assert catalog.retention_plan(tmp_path, keep_last=2, latest=20) == []
    assert catalog.retention_plan(tmp_path, keep_last=1, latest=20) == [10]
    assert catalog.retention_plan(tmp_path, keep_last=1, latest=20, in_flight={10}) == []


def test_rejecting_removes_a_known_good_mark(tmp_path: Path) -> None:
    make_ckpt(tmp_path, 5, good=True)
    catalog.mark_rejected(tmp_path, 5, "__0_0.distcp", "mismatch")
    assert catalog.newest_known_good(tmp_path) is None and catalog.complete_steps(tmp_path) == []


def _verify(d: Path, capsys: pytest.CaptureFixture[str], as_json: bool = False) -> tuple[int, str]:
    import argparse

    rc = run_verify(argparse.Namespace(dir=str(d), json=as_json))
    return rc, capsys.readouterr().out


def test_ckpt_verify_reports_each_state(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    make_ckpt(tmp_path, 2, good=True)
    flip(make_ckpt(tmp_path, 4) / "__1_0.distcp")
    (tmp_path / iter_dir_name(6)).mkdir()
    catalog.write_latest_atomically(tmp_path, 4)
    rc, out = _verify(tmp_path, capsys)
    assert rc == 1
    assert "iter_0000002  verified: 4 files" in out and "(known-good)" in out
    assert "iter_0000004  damaged: __1_0.distcp: xxh3_128 mismatch" in out or "crc32 mismatch" in out
    assert "iter_0000006  incomplete" in out
    assert "PROBLEM: latest names step 4, which is damaged" in out
    assert out.rstrip().endswith("VERDICT: DAMAGED (1 damaged)")
    rc, out = _verify(tmp_path, capsys, as_json=True)
    data = json.loads(out)
    assert rc == 1 and data["latest"] == 4 and data["newest_known_good"] == 2
    assert [c["state"] for c in data["checkpoints"]] == ["verified", "damaged", "incomplete"]


def test_ckpt_verify_ok_and_missing_dir(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    make_ckpt(tmp_path, 2)
    catalog.write_latest_atomically(tmp_path, 2)
    rc, out = _verify(tmp_path, capsys)
    assert rc == 0 and out.rstrip().endswith("VERDICT: OK")
    (tmp_path / LATEST_FILE).write_text("7\n")
    rc, out = _verify(tmp_path, capsys)
    assert rc == 1 and "latest names step 7, which has no directory" in out
    assert _verify(tmp_path / "nope", capsys)[0] == 2


def test_ckpt_verify_is_a_registered_command() -> None:
    from lcm_runner.cli import build_parser

    ns = build_parser().parse_args(["ckpt", "verify", "/x"])
    assert ns.func is run_verify and ns.dir == "/x"
