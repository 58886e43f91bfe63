"""benchmarks/ckpt_throughput.py: a load's throughput is the checkpoint's bytes over the whole resume
(`load_s`, which contains `verify_s`), checked against the committed H200 calls' own telemetry lines."""

from __future__ import annotations

import json

import pytest
from _benchmarks import REPO, load

ct = load("ckpt_throughput")
CALLS = REPO / "docs" / "results" / "h200-ckpt-throughput"


@pytest.mark.parametrize("call", ["call-2-2026-12-03", "call-4-2026-12-03"])
def test_committed_loads_are_bytes_over_the_whole_resume(call: str) -> None:
    committed = json.loads((CALLS / call / "summary.json").read_text())
    console = ct.from_console(CALLS / call)
    assert console is not None and committed["loads"]
    for name, ld in committed["loads"].items():
        raw = console["loads"][name]  # the trainer's resume line, as printed in the call
        assert (ld["verify_s"], ld["load_s"]) == (raw["verify_s"], raw["load_s"])
        assert ld["verify_s"] < ld["load_s"] == pytest.approx(ld["read_s"], abs=1e-3)
        assert ld["read_gbps"] == pytest.approx(ld["bytes"] / 1e9 / ld["load_s"], abs=1e-3)
        assert raw["read_gbps"] == pytest.approx(ld["read_gbps"], abs=1e-3)
        direct = committed["disk"]["direct_read_gbps"]
        assert ld["of_direct_read"] == pytest.approx(ld["read_gbps"] / direct, abs=1e-3)
    assert (CALLS / call / "summary.md").read_text() == ct.markdown(committed)


def test_load_run_reads_the_resume_record(tmp_path) -> None:
    tel = tmp_path / "load-w8" / "telemetry"
    tel.mkdir(parents=True)
    rec = {"event": "resume", "rank": 0, "verify_s": 1.5, "load_s": 4.0, "step": 4}
    (tel / "rank0.jsonl").write_text(json.dumps(rec) + "\n")
    got = ct.load_run(tmp_path / "load-w8", 8_000_000_000)
    assert got == {"bytes": 8_000_000_000, "verify_s": 1.5, "load_s": 4.0, "read_s": 4.0, "read_gbps": 2.0}


def test_load_ab_summary_recomputes_from_its_telemetry() -> None:
    ab = load("ckpt_load_ab")
    call = REPO / "docs" / "results" / "h200-ckpt-load-ab"
    committed = json.loads((call / "summary.json").read_text())
    assert ab.summarise(call) == committed
    assert committed["direct_read_gbps"] == 1.4 and committed["bytes"] > 4e9
    b, c = committed["sides"]["baseline"], committed["sides"]["current"]
    assert committed["current_over_baseline"] == round(c["load_s_median"] / b["load_s_median"], 3)
