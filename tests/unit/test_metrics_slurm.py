"""lcm_runner.metrics.slurm and `metrics slurm`: sinfo/squeue output in the formats the collector asks
for (`sinfo -h -N -o '%N|%R|%T'`, `squeue -h -a -r -o '%P|%T'`) -> the lcm_slurm_* metrics; a failing
or missing command gives `lcm_slurm_collect_success 0`, never a dead collector.

Slurm does not run here: the end-to-end tests put executables named sinfo and squeue first on PATH
that print the fixtures only when called with exactly the collector's arguments (any other format
makes them fail, and the collection with them)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from lcm_runner.metrics import exposition, slurm

ROOT = Path(__file__).resolve().parents[2]
PROMTOOL = ROOT / ".cache" / "tools" / "bin" / "promtool"

# sinfo -h -N -o '%N|%R|%T' of a cluster with two partitions (gpu01 is in both): long states in lower
# case with Slurm's suffix flags (* not responding, ~ powered off, # powering up).
SINFO = """\
gpu01|gpu|idle
gpu02|gpu|allocated
gpu03|gpu|mixed
gpu04|gpu|down*
gpu05|gpu|drained
gpu06|gpu|draining
gpu07|gpu|idle~
gpu08|gpu|drained*
gpu09|gpu|completing
gpu10|gpu|idle*
gpu11|gpu|reserved
gpu12|gpu|idle#
gpu01|debug|idle
"""
# squeue -h -a -r -o '%P|%T': one line per job (array elements each), upper-case states
SQUEUE = """\
gpu|RUNNING
gpu|RUNNING
gpu|PENDING
gpu|PENDING
gpu|PENDING
gpu,debug|PENDING
gpu|COMPLETING
"""


def test_parse_sinfo_base_states_and_responding() -> None:
    nodes, partitions = slurm.parse_sinfo(SINFO)
    assert partitions == ["gpu", "debug"]
    assert len(nodes) == 12  # gpu01 once although it is in two partitions
    state = {n: (s.state, s.up) for n, s in nodes.items()}
    assert state == {
        "gpu01": ("idle", True),
        "gpu02": ("allocated", True),
        "gpu03": ("mixed", True),
        "gpu04": ("down", False),
        "gpu05": ("drained", False),
        "gpu06": ("draining", True),  # still running its jobs
        "gpu07": ("idle", True),  # powered off, not down
        "gpu08": ("drained", False),
        "gpu09": ("completing", True),
        "gpu10": ("idle", False),  # not responding
        "gpu11": ("reserved", True),
        "gpu12": ("idle", True),
    }


@pytest.mark.parametrize(
    ("text", "want"),
    [
        ("IDLE", ("idle", True)),
        ("down~", ("down", False)),
        ("mixed+drain", ("draining", True)),
        ("idle+drain*", ("drained", False)),
        ("drain", ("drained", False)),
        ("fail", ("fail", False)),
        ("allocated@", ("allocated", True)),
    ],
)
def test_base_state(text: str, want: tuple[str, bool]) -> None:
    state, responding = slurm.base_state(text)
    assert (state, responding and state not in slurm.NOT_UP) == want


def test_parse_squeue_counts_per_partition_and_state() -> None:
    jobs = slurm.parse_squeue(SQUEUE)
    assert jobs == {
        ("gpu", "running"): 2,
        ("gpu", "pending"): 3,
        ("gpu,debug", "pending"): 1,
        ("gpu", "completing"): 1,
    }


@pytest.mark.parametrize("bad", ["gpu01|gpu", "gpu01|gpu|idle|extra", "gpu01||idle", "|gpu|idle"])
def test_a_line_of_another_shape_is_a_failure(bad: str) -> None:
    with pytest.raises(slurm.SlurmCollectError, match="unexpected line"):
        slurm.parse_sinfo(SINFO + bad + "\n")


def _parse(text: str) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for f in text_string_to_metric_families(text)
        for s in f.samples
    }


def _promtool(text: str) -> None:
    if not PROMTOOL.is_file():
        pytest.fail(f"{PROMTOOL} is missing: run scripts/bootstrap (it unpacks promtool and amtool)")
    r = subprocess.run([str(PROMTOOL), "check", "metrics"], input=text, capture_output=True, text=True)
    assert r.returncode == 0 and not (r.stdout + r.stderr).strip(), (r.stdout, r.stderr)


def _check_full(text: str) -> None:
    got = _parse(text)
    _promtool(text)
    assert got[("lcm_slurm_collect_success", frozenset())] == 1
    assert got[("lcm_slurm_collect_timestamp_seconds", frozenset())] > 1e9
    nodes = {dict(ls)["state"]: v for (n, ls), v in got.items() if n == "lcm_slurm_nodes"}
    assert nodes == {
        "idle": 4, "allocated": 1, "mixed": 1, "completing": 1, "down": 1, "drained": 2, "draining": 1,
        "reserved": 1,
    }  # fmt: skip
    up = {dict(ls)["slurm_node"]: v for (n, ls), v in got.items() if n == "lcm_slurm_node_up"}
    assert len(up) == 12 and {k for k, v in up.items() if v == 0} == {"gpu04", "gpu05", "gpu08", "gpu10"}
    jobs = {
        (dict(ls)["partition"], dict(ls)["state"]): v for (n, ls), v in got.items() if n == "lcm_slurm_jobs"
    }
    assert jobs == {
        ("gpu", "running"): 2, ("gpu", "pending"): 3, ("gpu", "completing"): 1,
        ("gpu,debug", "pending"): 1, ("debug", "pending"): 0, ("debug", "running"): 0,
    }  # fmt: skip


def test_families_render_parse_and_pass_promtool() -> None:
    nodes, partitions = slurm.parse_sinfo(SINFO)
    state = slurm.SlurmState(nodes, partitions, slurm.parse_squeue(SQUEUE))
    _check_full(exposition.render(slurm.build_families(state, time.time())))


# ----------------------------------------------------------------------------- the command


def _fake_bin(tmp_path: Path, sinfo: str | None, squeue: str | None, sinfo_rc: int = 0) -> Path:
    """sinfo/squeue stand-ins that answer only the collector's exact argv; None: not installed."""
    d = tmp_path / "bin"
    d.mkdir(exist_ok=True)
    for name, argv, out, rc in (
        ("sinfo", slurm.SINFO_ARGV, sinfo, sinfo_rc),
        ("squeue", slurm.SQUEUE_ARGV, squeue, 0),
    ):
        if out is None:
            continue
        (d / f"{name}.out").write_text(out)
        script = d / name
        script.write_text(
            f"#!{sys.executable}\n"
            "import sys\n"
            f"if sys.argv[1:] != {list(argv[1:])!r}:\n"
            "    sys.exit(f'unexpected arguments {sys.argv[1:]}')\n"
            f"if {rc}:\n"
            "    sys.exit('slurm_load_partitions: Unable to contact slurm controller (connect failure)')\n"
            f"sys.stdout.write(open({str(d / f'{name}.out')!r}).read())\n"
        )
        script.chmod(0o755)
    return d


def _run(tmp_path: Path, bindir: Path, *extra: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    out = tmp_path / "tf" / "lcm_slurm.prom"
    out.parent.mkdir(exist_ok=True)
    env = {"PATH": f"{bindir}:/usr/bin:/bin", "PYTHONPATH": str(ROOT)}
    argv = [sys.executable, "-m", "lcm_runner.metrics", "slurm", "--out", str(out), *extra]
    return subprocess.run(argv, capture_output=True, text=True, env=env, timeout=timeout)


def test_once_end_to_end_with_the_collectors_own_arguments(tmp_path: Path) -> None:
    r = _run(tmp_path, _fake_bin(tmp_path, SINFO, SQUEUE), "--once")
    assert r.returncode == 0 and not r.stderr, r.stderr
    _check_full((tmp_path / "tf" / "lcm_slurm.prom").read_text())


@pytest.mark.parametrize(
    ("sinfo", "squeue", "sinfo_rc", "why"),
    [
        (SINFO, SQUEUE, 1, "Unable to contact slurm controller"),
        (None, SQUEUE, 0, "sinfo: not found"),
        (SINFO, None, 0, "squeue: not found"),
        (SINFO + "garbage\n", SQUEUE, 0, "unexpected line 'garbage'"),
    ],
)
def test_a_failing_collection_publishes_success_0(
    tmp_path: Path, sinfo: str | None, squeue: str | None, sinfo_rc: int, why: str
) -> None:
    r = _run(tmp_path, _fake_bin(tmp_path, sinfo, squeue, sinfo_rc), "--once")
    assert r.returncode == 0
    assert len(r.stderr.strip().splitlines()) == 1 and why in r.stderr, r.stderr
    text = (tmp_path / "tf" / "lcm_slurm.prom").read_text()
    _promtool(text)
    got = _parse(text)
    assert got[("lcm_slurm_collect_success", frozenset())] == 0
    assert {n for n, _ in got} == {"lcm_slurm_collect_success", "lcm_slurm_collect_timestamp_seconds"}


def test_missing_output_directory_is_one_line_and_exit_0(tmp_path: Path) -> None:
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT)}
    out = tmp_path / "nope" / "lcm_slurm.prom"
    argv = [sys.executable, "-m", "lcm_runner.metrics", "slurm", "--out", str(out), "--once"]
    r = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=30)
    assert r.returncode == 0 and len(r.stderr.strip().splitlines()) == 1 and "nope" in r.stderr


FAILED, OK = "\nlcm_slurm_collect_success 0\n", "\nlcm_slurm_collect_success 1\n"


def test_the_service_loop_keeps_going_through_failures_and_stops_on_sigterm(tmp_path: Path) -> None:
    bindir = _fake_bin(tmp_path, SINFO, SQUEUE, sinfo_rc=1)
    out = tmp_path / "tf" / "lcm_slurm.prom"
    out.parent.mkdir()
    env = {"PATH": f"{bindir}:/usr/bin:/bin", "PYTHONPATH": str(ROOT)}
    argv = [sys.executable, "-m", "lcm_runner.metrics", "slurm", "--out", str(out), "--interval-s", "0.2"]
    proc = subprocess.Popen(argv, env=env, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and not (out.exists() and FAILED in out.read_text()):
            time.sleep(0.05)
        assert FAILED in out.read_text()
        _fake_bin(tmp_path, SINFO, SQUEUE, sinfo_rc=0)  # the controller answers again
        while time.monotonic() < deadline and OK not in out.read_text():
            time.sleep(0.05)
        assert OK in out.read_text() and proc.poll() is None
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=5) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.stderr is not None
    assert len(proc.stderr.read().strip().splitlines()) == 1  # the failure, said once
    _check_full(out.read_text())
    assert os.listdir(out.parent) == ["lcm_slurm.prom"]
