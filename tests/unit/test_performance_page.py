"""docs/performance.md is generated from committed result files by benchmarks/performance.py: it is
current, every figure names its source file, and a missed target says what limits it."""

from __future__ import annotations

from pathlib import Path

from _benchmarks import load

REPO = Path(__file__).resolve().parents[2]
performance = load("performance")


def test_docs_performance_md_is_current() -> None:
    assert performance.main(["--check"]) == 0, "run: python benchmarks/performance.py"


def test_every_figure_has_a_source_or_says_it_is_not_measured() -> None:
    figures = [f for _, make in performance.SECTIONS for f in make()]
    assert len(figures) >= 10
    for f in figures:
        if f.met is None and f.value == "not measured":
            assert f.limit, f  # why not
            continue
        assert f.source and (REPO / f.source).is_file(), f
        if f.met is False:
            assert f.limit, f"{f.name}: a missed target must say what limits it"
