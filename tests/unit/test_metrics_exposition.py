"""lcm_runner.metrics.exposition: the text format read back by prometheus_client's parser and linted by
the real `promtool check metrics`; the atomic write seen by a concurrent reader."""

from __future__ import annotations

import math
import os
import random
import subprocess
import threading
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from lcm_runner.metrics.exposition import (
    Histogram,
    MetricFamily,
    format_value,
    render,
    tmp_path_for,
    write_atomic,
)

ROOT = Path(__file__).resolve().parents[2]
PROMTOOL = ROOT / ".cache" / "tools" / "bin" / "promtool"


def promtool_check(text: str) -> subprocess.CompletedProcess[str]:
    if not PROMTOOL.is_file():
        pytest.fail(f"{PROMTOOL} is missing: run scripts/bootstrap (it unpacks promtool and amtool)")
    return subprocess.run(
        [str(PROMTOOL), "check", "metrics"], input=text, capture_output=True, text=True, check=False
    )


def _samples(text: str) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for fam in text_string_to_metric_families(text)
        for s in fam.samples
    }


def _families() -> list[MetricFamily]:
    g = MetricFamily("lcm_test_value", "gauge", 'A gauge; help with a \\ backslash\nand a "newline"')
    g.add(1.5, job_id="1", rank="0")
    g.add(float("nan"), job_id="1", rank="1")
    g.add(float("inf"), job_id="1", rank="2")
    g.add(float("-inf"), job_id="1", rank="3")
    g.add(7, job_id="1", rank="4")
    g.add(1e-05, job_id="1", rank="5")
    g.add(2.0, job_id='we"ird\\job\nname', rank="6")
    c = MetricFamily("lcm_test_events_total", "counter", "A counter")
    c.add(3, job_id="1")
    h = Histogram({"job_id": "1"}, (0.05, 0.1, 1, 10))
    for v in (0.01, 0.05, 0.07, 0.5, 3, 30, 100):
        h.observe(v)
    hf = MetricFamily("lcm_test_duration_seconds", "histogram", "A histogram", [h])
    empty = MetricFamily("lcm_test_empty", "gauge", "No samples: left out")
    return [g, c, hf, empty]


def test_render_parses_back_with_prometheus_client_and_escapes() -> None:
    text = render(_families())
    got = _samples(text)

    def val(name: str, **labels: str) -> float:
        return got[(name, frozenset(labels.items()))]

    assert val("lcm_test_value", job_id="1", rank="0") == 1.5
    assert math.isnan(val("lcm_test_value", job_id="1", rank="1"))
    assert val("lcm_test_value", job_id="1", rank="2") == math.inf
    assert val("lcm_test_value", job_id="1", rank="3") == -math.inf
    assert val("lcm_test_value", job_id="1", rank="4") == 7
    assert val("lcm_test_value", job_id="1", rank="5") == 1e-05
    assert val("lcm_test_value", job_id='we"ird\\job\nname', rank="6") == 2.0  # escaped and read back
    assert val("lcm_test_events_total", job_id="1") == 3
    (fam,) = [f for f in text_string_to_metric_families(text) if f.name == "lcm_test_value"]
    assert fam.documentation == 'A gauge; help with a \\ backslash\nand a "newline"'
    assert "lcm_test_empty" not in text
    assert 'job_id="we\\"ird\\\\job\\nname"' in text
    assert " NaN\n" in text and " +Inf\n" in text and " -Inf\n" in text


def test_histogram_buckets_are_cumulative_with_sum_and_count() -> None:
    got = _samples(render(_families()))
    buckets = {
        dict(labels)["le"]: v
        for (name, labels), v in got.items()
        if name == "lcm_test_duration_seconds_bucket"
    }
    # observations 0.01 0.05 | 0.07 | 0.5 | 3 | 30 100
    assert buckets == {"0.05": 2, "0.1": 3, "1.0": 4, "10.0": 5, "+Inf": 7}
    assert got[("lcm_test_duration_seconds_count", frozenset({("job_id", "1")}))] == 7
    assert got[("lcm_test_duration_seconds_sum", frozenset({("job_id", "1")}))] == pytest.approx(133.63)


def test_promtool_accepts_the_rendering() -> None:
    r = promtool_check(render(_families()))
    assert r.returncode == 0 and not r.stdout.strip() and not r.stderr.strip(), (r.stdout, r.stderr)


def test_promtool_check_can_fail() -> None:
    """The lint is real: a counter without _total and an unterminated label are reported."""
    bad = MetricFamily("lcm_test_events", "counter", "no _total")
    bad.add(1)
    assert promtool_check(render([bad])).returncode != 0
    assert promtool_check('lcm_x{a="1 1\n').returncode != 0


@pytest.mark.parametrize(
    ("value", "text"),
    [(float("nan"), "NaN"), (math.inf, "+Inf"), (-math.inf, "-Inf"), (3, "3"), (True, "1"), (0.1, "0.1")],
)
def test_format_value(value: float, text: str) -> None:
    assert format_value(value) == text


def test_format_value_round_trips_floats() -> None:
    rng = random.Random(7)
    for _ in range(2000):
        x = rng.uniform(-1e6, 1e6) * 10 ** rng.randint(-12, 12)
        assert float(format_value(x)) == x


def test_invalid_input_is_refused() -> None:
    dup = MetricFamily("lcm_test_dup", "gauge", "dup")
    dup.add(1, rank="0")
    dup.add(2, rank="0")
    with pytest.raises(ValueError, match="duplicate series"):
        render([dup])
    bad_label = MetricFamily("lcm_test_bad", "gauge", "bad")
    bad_label.add(1, **{"0rank": "x"})
    with pytest.raises(ValueError, match="invalid label name"):
        render([bad_label])
    with pytest.raises(ValueError, match="invalid metric name"):
        render([_with_sample(MetricFamily("lcm-test", "gauge", "x"))])
    hist = MetricFamily("lcm_test_h", "histogram", "h", [Histogram({"le": "1"}, (1,))])
    with pytest.raises(ValueError, match="reserved"):
        render([hist])
    g = _with_sample(MetricFamily("lcm_test_twice", "gauge", "x"))
    with pytest.raises(ValueError, match="rendered twice"):
        render([g, g])
    with pytest.raises(ValueError, match="strictly increasing"):
        Histogram({}, (1, 0.5))


def _with_sample(f: MetricFamily) -> MetricFamily:
    f.add(1)
    return f


# ----------------------------------------------------------------------------- atomic write


def test_write_atomic_replaces_the_file_and_leaves_no_tmp(tmp_path: Path) -> None:
    out = tmp_path / "lcm_train.prom"
    old = os.umask(0o077)  # a job's strict umask must not hide the file from node_exporter
    try:
        write_atomic(out, "a 1\n")
        write_atomic(out, "a 2\n")
    finally:
        os.umask(old)
    assert out.read_text() == "a 2\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["lcm_train.prom"]
    assert out.stat().st_mode & 0o777 == 0o644
    assert tmp_path_for(out).name == f"lcm_train.prom.{os.getpid()}.tmp"


def test_write_atomic_failure_removes_the_tmp_and_keeps_nothing_half_written(tmp_path: Path) -> None:
    target = tmp_path / "lcm_train.prom"
    target.mkdir()  # rename onto a directory fails after the tmp file was written
    with pytest.raises(OSError):
        write_atomic(target, "a 1\n")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["lcm_train.prom"]
    assert target.is_dir()


def test_a_concurrent_reader_never_sees_a_partial_file(tmp_path: Path) -> None:
    out = tmp_path / "lcm_train.prom"
    versions = [f"# {i}\n" + ("x" * 199 + "\n") * (500 + 37 * i) for i in range(4)]
    write_atomic(out, versions[0])
    seen: set[int] = set()
    bad: list[int] = []
    stop = threading.Event()

    def reader() -> None:
        while not stop.is_set():
            text = out.read_text()
            if text in versions:
                seen.add(versions.index(text))
            else:
                bad.append(len(text))

    t = threading.Thread(target=reader)
    t.start()
    try:
        for i in range(300):
            write_atomic(out, versions[i % 4])
    finally:
        stop.set()
        t.join()
    assert not bad, f"partial reads of {bad[:5]} bytes"
    assert len(seen) >= 2  # the reader did overlap the writes
    assert sorted(p.name for p in tmp_path.iterdir()) == ["lcm_train.prom"]
