"""The fault matrix's table (lcm_runner.report.faults)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from lcm_runner.report.faults import load_rows, main, table


def _rows(tmp_path: Path, rows: list[dict]) -> Path:
    p = tmp_path / "matrix.jsonl"
    p.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return p


ROW = {
    "fault": "damaged shard",
    "injected": "64 bytes | flipped",
    "detected_s": 1.234,
    "recovered": True,
    "downtime_s": None,
    "steps_lost": 0,
    "good_ckpts_lost": 0,
    "notes": "fell back",
}


def test_table_has_a_row_per_fault_and_the_last_run_wins(tmp_path: Path) -> None:
    p = _rows(tmp_path, [ROW, {**ROW, "detected_s": 2.0}, {**ROW, "fault": "nan", "recovered": False}])
    rows = load_rows(p)
    assert [r["fault"] for r in rows] == ["damaged shard", "nan"]
    text = table(rows)
    assert "| damaged shard | 64 bytes \\| flipped | 2.00 s | yes | - | 0 | 0 | fell back |" in text
    assert "| nan |" in text and "no (stops, by design)" in text
    assert text.rstrip().endswith("0 good checkpoints lost.")


def test_a_loss_is_called_out(tmp_path: Path) -> None:
    text = table([{**ROW, "steps_lost": 3}])
    assert text.rstrip().endswith("LOSS in: damaged shard")


def test_cli_refuses_bad_lines(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    p = tmp_path / "m.jsonl"
    p.write_text("{nope\n")
    assert main([str(p)]) == 2
    assert "m.jsonl:1: not JSON" in capsys.readouterr().err
    out = tmp_path / "t.md"
    assert main([str(_rows(tmp_path, [ROW])), "--out", str(out)]) == 0 and "damaged shard" in out.read_text()
