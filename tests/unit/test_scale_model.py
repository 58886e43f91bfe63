"""docs/scale.md is generated from committed result files by benchmarks/scale_model.py: it is current, and
its figures follow its inputs (no number in it is typed in by hand)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from _benchmarks import load

REPO = Path(__file__).resolve().parents[2]
scale_model = load("scale_model")


def test_docs_scale_md_is_current() -> None:
    assert scale_model.main(["--check"]) == 0, "run: python benchmarks/scale_model.py"


def test_the_case_and_its_arithmetic() -> None:
    i = scale_model.inputs()
    m = scale_model.model(i)
    assert m["total_gb"] == pytest.approx(980.0) and m["rank_gb"] == pytest.approx(980 / 64)
    assert m["save_rank_bound_s"] == pytest.approx(m["rank_gb"] / i.rank_write_gbps)
    assert m["save_local_disk_s"] >= m["save_rank_bound_s"]
    assert m["save_needs_aggregate_gbps"] == pytest.approx(980 / 60)
    assert m["recovery_node_loss_s"] == pytest.approx(i.slurm_detect_s + m["resume_s"])


def test_figures_follow_the_inputs() -> None:
    i = scale_model.inputs()
    base = scale_model.model(i)
    faster = scale_model.model(dataclasses.replace(i, rank_write_gbps=2 * i.rank_write_gbps,
                                                   node_direct_read_gbps=100.0))  # fmt: skip
    assert faster["save_rank_bound_s"] == pytest.approx(base["save_rank_bound_s"] / 2)
    assert faster["resume_s"] < base["resume_s"]
    text = scale_model.render(i, base)
    assert f"{base['save_rank_bound_s']:.1f} s" in text and i.rank_write_src in text
