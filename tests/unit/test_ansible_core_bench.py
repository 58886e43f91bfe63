"""benchmarks/ansible_core.py: a real (small) run with the locked ansible-core, the JSON it writes, and
the performance page's row built from such a file. The comparison with other releases is the benchmark's
own run (it installs them from the pip index); here only the locked one runs, nothing is installed."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from _benchmarks import load

bench = load("ansible_core")
perf = load("performance")
# benchmarks/perf_converge.py, the module instance performance.py imported (its RESULTS is patched)
converges = sys.modules[perf.ansible_core_figures.__module__]
figures = sys.modules[perf.Figure.__module__]  # benchmarks/_figures.py: _rel's REPO


def test_a_small_run_of_the_locked_release_writes_per_host_task_costs(tmp_path: Path) -> None:
    locked = bench.locked_core()
    assert bench.running_core() == locked, "the tests run under the locked ansible-core"
    rc = bench.main(["--versions", locked, "--tasks", "3", "--hosts", "2", "--repeats", "1",
                     "--results-dir", str(tmp_path)])  # fmt: skip
    assert rc == 0
    (out,) = tmp_path.glob("ansible-core-*.json")
    d = json.loads(out.read_text())
    (r,) = d["releases"]
    assert r["version"] == locked and len(r["runs"]) == 1
    assert r["wall_s"] > 0 and r["cpu_s"] > 0, "a run of ansible-playbook takes time and CPU"
    assert r["ms_per_host_task_wall"] == pytest.approx(1000 * r["wall_s"] / 6, abs=0.1)
    assert r["wall_vs_locked"] == 1.0


def test_bad_counts_are_refused() -> None:
    with pytest.raises(SystemExit, match="must be >= 1"):
        bench.main(["--tasks", "0"])


def test_the_page_row_compares_each_other_release_with_the_locked_one(tmp_path: Path, monkeypatch) -> None:
    d = {"locked": "2.19.14", "tasks": 60, "hosts": 3, "repeats": 3, "releases": [
        {"version": "2.19.14", "ms_per_host_task_wall": 125.0, "wall_vs_locked": 1.0, "cpu_vs_locked": 1.0},
        {"version": "2.18.19", "ms_per_host_task_wall": 90.0, "wall_vs_locked": 0.72, "cpu_vs_locked": 0.7},
    ]}  # fmt: skip
    (tmp_path / "ansible-core-20990101-000000.json").write_text(json.dumps(d))
    monkeypatch.setattr(converges, "RESULTS", tmp_path)
    monkeypatch.setattr(figures, "REPO", tmp_path)
    (row,) = perf.ansible_core_figures()
    assert row.name == "task cost, ansible-core 2.18.19 / the locked 2.19.14"
    assert row.value == "0.72" and row.met is None
    assert row.absolute.startswith("90 vs 125 ms wall per host-task; CPU 0.70x")


def test_the_module_cache_variant_runs_the_nodes_python_through_the_hook(tmp_path: Path, monkeypatch) -> None:
    locked = bench.locked_core()
    rc = bench.main(["--versions", locked, "--tasks", "2", "--hosts", "1", "--repeats", "1", "--module-cache",
                     "--results-dir", str(tmp_path)])  # fmt: skip
    assert rc == 0
    (out,) = tmp_path.glob("ansible-core-*.json")
    d = json.loads(out.read_text())
    plain, cached = d["releases"]
    assert (plain["version"], plain["module_cache"]) == (locked, False) and plain["wall_vs_locked"] == 1.0
    assert (cached["version"], cached["module_cache"]) == (locked, True)
    # the cached run's modules went through roles/common's hook: its cache directory has their entries
    entries = list((tmp_path / ".ansible-core-play" / "module-cache").iterdir())
    assert len(entries) >= 10
    monkeypatch.setattr(converges, "RESULTS", tmp_path)
    monkeypatch.setattr(figures, "REPO", tmp_path)
    (row,) = perf.ansible_core_figures()
    assert row.name == f"task cost, ansible-core {locked} + the nodes' module cache / the locked {locked}"
