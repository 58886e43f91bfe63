"""docs/performance.md is generated from committed result files by benchmarks/performance.py: it is
current, every figure names its source file, and a missed target says what limits it."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("performance", REPO / "benchmarks/performance.py")
assert _spec and _spec.loader
performance = importlib.util.module_from_spec(_spec)
sys.modules["performance"] = performance  # its dataclasses look their module up
_spec.loader.exec_module(performance)


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
