"""The batch script's training-metrics writer (lcm_runner/templates/train.sbatch.j2, docs/monitoring.md):
with `layers.monitoring` each node's task starts `python -m lcm_runner.metrics train` beside the agent
and stops it once the agent has exited, keeping the agent's exit code; without it the script is the
same as before, line for line.

The node function of the rendered script is run by bash with a stand-in interpreter: the metrics
writer and `lcm_runner.telemetry` calls go to the real Python, the agent call is a rank that writes its
telemetry with the trainer's own writer class while the writer runs (no training process here).
"""

from __future__ import annotations

import copy
import dataclasses
import difflib
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from lcm_runner import config, render
from lcm_runner.contracts import ExitCode
from lcm_runner.metrics.cli import build_parser

ROOT = Path(__file__).resolve().parents[2]
LAB = ROOT / "inventories" / "lab"
H200 = ROOT / "inventories" / "example-h200"
WRITER_CMD = '"$LCM_PYTHON" -m lcm_runner.metrics train --run-dir "$LCM_RUN_DIR" --job-id "$SLURM_JOB_ID"'
WRITER = WRITER_CMD + " \\\n    --out "


def _cluster(inv: Path, monitoring: bool, textfile_dir: Path | None = None) -> dict:
    c = copy.deepcopy(config.load_cluster(inv))
    c["layers"]["monitoring"] = monitoring
    if textfile_dir is not None:
        c.setdefault("monitoring", {})["textfile_dir"] = str(textfile_dir)
    return c


def _cfg(name: str, **over: object) -> config.RunConfig:
    return dataclasses.replace(
        config.from_dict(yaml.safe_load((ROOT / "configs" / name).read_text())), **over
    )


def _text(inv: Path, cfgname: str, monitoring: bool, tmp_path: Path, **over: object) -> str:
    return render.sbatch_text(_cluster(inv, monitoring), _cfg(cfgname, **over), tmp_path / "run")


CASES = [
    (LAB, "lab.yml", "lcm"),
    (LAB, "lab.yml", "torchrun"),
    (H200, "h200.yml", "torchrun"),
    (H200, "h200.yml", "lcm"),
]


@pytest.mark.parametrize(("inv", "cfgname", "agent"), CASES, ids=lambda v: getattr(v, "name", v))
def test_monitoring_off_is_unchanged_and_on_adds_only_the_writer(
    inv: Path, cfgname: str, agent: str, tmp_path: Path
) -> None:
    off = _text(inv, cfgname, False, tmp_path, agent=agent)
    on = _text(inv, cfgname, True, tmp_path, agent=agent)
    for name, text in (("off", off), ("on", on)):
        script = tmp_path / f"{name}.sbatch"
        script.write_text(text)
        subprocess.run(["bash", "-n", str(script)], check=True)
    assert "lcm_runner.metrics" not in off and "metrics_pid" not in off
    assert "/var/lib/prometheus/node-exporter" not in off
    # cluster.monitoring.textfile_dir default; one file per job, kept 600 s (10 x 15 s scrapes, >= 600 s)
    out = '/var/lib/prometheus/node-exporter/lcm_train_"$SLURM_JOB_ID".prom --retain-s 600'
    assert on.count("-m lcm_runner.metrics train") == 1 and f"{WRITER}{out} &\n" in on
    removed, added = [], []
    for line in difflib.ndiff(off.splitlines(), on.splitlines()):
        if line.startswith("- "):
            removed.append(line[2:])
        elif line.startswith("+ "):
            added.append(line[2:])
    mounts_changed = any("--container-mounts=" in ln for ln in removed)
    assert removed == ["  local started rc"] + ([m for m in removed if "--container-mounts=" in m])
    assert mounts_changed == (inv == H200)  # the writer runs in the container: the dir is mounted
    for ln in added:
        assert (
            ln.lstrip().startswith("#")
            or ln == f"  {WRITER_CMD} \\"
            or ln.startswith("    --out ")
            or "metrics_pid" in ln
            or ln in ("  n=0", "  local started rc metrics_pid n")
            or "--container-mounts=" in ln
        ), ln
    # the writer starts before the agent command and is stopped after its exit code is taken
    body = on.split("lcm_node() {", 1)[1].split("\n}\n", 1)[0]
    start_at, rc_at = body.index(WRITER), body.index("  rc=$?\n")
    stop_at, ret_at = body.index('kill -TERM "$metrics_pid"'), body.index('  return "$rc"')
    assert start_at < rc_at < stop_at < ret_at
    if agent == "torchrun":  # the requeue code from the telemetry is decided before the writer stops
        assert body.index("lcm_runner.telemetry exit-code") < stop_at
    assert "requeue: exit $rc" in on and on.count("trap ") == off.count("trap ")


def test_container_mounts_the_textfile_dir_only_with_monitoring(tmp_path: Path) -> None:
    for monitoring in (False, True):
        c = _cluster(H200, monitoring, Path("/srv/textfile"))
        text = render.sbatch_text(c, _cfg("h200.yml"), tmp_path / "run")
        mounts = next(ln for ln in text.splitlines() if "--container-mounts=" in ln)
        assert ("/srv/textfile:/srv/textfile" in mounts) == monitoring
        assert ('--out /srv/textfile/lcm_train_"$SLURM_JOB_ID".prom --retain-s 600 &' in text) == monitoring


STANDIN = """#!{py}
import json, os, socket, sys, time
from pathlib import Path

with open({calls!r}, "a") as f:
    f.write(json.dumps(sys.argv[1:]) + "\\n")
if sys.argv[1:3] in (["-m", "lcm_runner.metrics"], ["-m", "lcm_runner.telemetry"]):
    os.execv({py!r}, [{py!r}] + sys.argv[1:])
# the agent: one rank writing its telemetry with the trainer's writer class
from lcm_runner.train.telemetry import TelemetryWriter

out = Path({out!r})
if os.environ["STANDIN_WAIT"] == "1":
    deadline = time.monotonic() + 30
    while not out.exists() and time.monotonic() < deadline:
        time.sleep(0.02)
    Path({marker!r}).write_text("writer running" if out.exists() else "no writer")
else:
    time.sleep(2)  # a writer that has nothing to write to says so and ends meanwhile
w = TelemetryWriter(Path(os.environ["LCM_RUN_DIR"]) / "telemetry", 0, 0, os.environ["SLURM_JOB_ID"])
w.emit("start", world_size=1, tp=1, pp=1, ep=1, dp=1, host=socket.gethostname(), local_rank=0, gpu=None)
for s in range(1, 4):
    w.emit("step", step=s, loss=1.0, local_loss=1.0, step_time_s=0.1, tokens_per_s=10.0)
w.emit("exit", code=int(os.environ["STANDIN_EXIT_RECORD"]), reason="test")
w.close()
Path({ended!r}).write_text(repr(time.time()))
sys.exit(int(os.environ["STANDIN_RC"]))
"""


def _run_node(
    tmp_path: Path, inv: Path, cfgname: str, agent: str, rc: int, exit_record: int, textfile_dir: Path
) -> tuple[int, str, float, list[list[str]]]:
    run_dir = tmp_path / "run"
    out = render.render_run(_cluster(inv, True, textfile_dir), _cfg(cfgname, agent=agent), run_dir)
    calls, marker, ended = tmp_path / "calls.jsonl", tmp_path / "marker", tmp_path / "ended"
    standin = tmp_path / "python"
    standin.write_text(
        STANDIN.format(
            py=sys.executable, calls=str(calls), out=str(textfile_dir / "lcm_train_4242.prom"),
            marker=str(marker), ended=str(ended),
        )
    )  # fmt: skip
    standin.chmod(0o755)
    env = {
        "PATH": os.environ["PATH"],
        "PYTHONPATH": str(ROOT),
        "LCM_PYTHON": str(standin),
        "LCM_RUN_DIR": str(out.run_dir),
        "SLURM_NODEID": "0",
        "SLURM_JOB_ID": "4242",
        "MASTER_ADDR": "127.0.0.1",
        "STANDIN_RC": str(rc),
        "STANDIN_EXIT_RECORD": str(exit_record),
        "STANDIN_WAIT": "1" if textfile_dir.is_dir() else "0",
    }
    func = out.sbatch.read_text().split("lcm_node() {", 1)[1].split("\n}\n", 1)[0]
    t0 = time.monotonic()
    proc = subprocess.Popen(
        ["bash", "-c", "lcm_node() {" + func + "\n}\nlcm_node"],
        env=env, start_new_session=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    try:
        log, _ = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, 9)
    elapsed = time.monotonic() - t0
    # nothing of the task is left behind: the writer is gone with it
    with pytest.raises(ProcessLookupError):
        os.killpg(proc.pid, 0)
    if marker.exists():
        assert marker.read_text() == "writer running"  # it ran beside the agent
        assert elapsed < 9, f"{elapsed:.1f} s: the writer was not stopped by SIGTERM"
    return (
        proc.returncode,
        log,
        float(ended.read_text()),
        [json.loads(ln) for ln in calls.read_text().splitlines()],
    )


@pytest.mark.parametrize(
    ("inv", "cfgname", "agent", "rc", "exit_record", "want"),
    [
        (LAB, "lab.yml", "lcm", 0, 0, 0),
        (LAB, "lab.yml", "lcm", int(ExitCode.REQUEUE), int(ExitCode.REQUEUE), int(ExitCode.REQUEUE)),
        (LAB, "lab.yml", "lcm", 3, 1, 3),
        # stock torchrun exits 1; the ranks' telemetry says requeue: the node reports 75
        (H200, "h200.yml", "torchrun", 1, int(ExitCode.REQUEUE), int(ExitCode.REQUEUE)),
    ],
    ids=["lcm-ok", "lcm-requeue", "lcm-fail", "torchrun-requeue"],
)
def test_node_runs_the_writer_beside_the_agent_and_keeps_its_exit_code(
    tmp_path: Path, inv: Path, cfgname: str, agent: str, rc: int, exit_record: int, want: int
) -> None:
    textfile_dir = tmp_path / "textfile"
    textfile_dir.mkdir()
    now = time.time()
    for name, age in (
        ("lcm_train_4241.prom", 60),  # a job that ended a minute ago: still within the retention
        ("lcm_train_4000.prom", 700),  # an old job's
        ("lcm_train_4000.prom.99.tmp", 700),  # a writer killed mid-write
        ("lcm_train.prom", 700),  # the single file of earlier versions
        ("lcm_slurm.prom", 700),  # another writer's family: never swept by this one
    ):
        (textfile_dir / name).write_text("# old\n")
        os.utime(textfile_dir / name, (now - age, now - age))
    code, log, agent_ended, calls = _run_node(tmp_path, inv, cfgname, agent, rc, exit_record, textfile_dir)
    assert code == want, log
    writer = [c for c in calls if c[:2] == ["-m", "lcm_runner.metrics"]]
    assert len(writer) == 1
    ns = build_parser().parse_args(writer[0][2:])
    assert ns.metrics_command == "train" and ns.job_id == "4242"
    assert ns.out == textfile_dir / "lcm_train_4242.prom" and Path(ns.run_dir) == tmp_path / "run"
    assert ns.retain_s == 600
    text = (textfile_dir / "lcm_train_4242.prom").read_text()
    got = {
        (s.name, frozenset(s.labels.items())): s.value
        for f in text_string_to_metric_families(text)
        for s in f.samples
    }
    lab = frozenset({"job_id": "4242", "rank": "0", "attempt": "0"}.items())
    assert got[("lcm_train_running", lab)] == 0
    assert got[("lcm_train_last_step", lab)] == 3
    # its last write came after the agent had exited (the final file written on SIGTERM)
    beat = got[("lcm_train_writer_heartbeat_timestamp_seconds", frozenset({"job_id": "4242"}.items()))]
    assert beat >= agent_ended
    # the other jobs' files: the one last written within the retention stays, the older ones (and a dead
    # writer's tmp file, and the single file of earlier versions) were swept
    assert sorted(p.name for p in textfile_dir.iterdir()) == [
        "lcm_slurm.prom",
        "lcm_train_4241.prom",
        "lcm_train_4242.prom",
    ]


def test_a_missing_textfile_dir_does_not_change_the_task(tmp_path: Path) -> None:
    code, log, _, calls = _run_node(tmp_path, LAB, "lab.yml", "lcm", 0, 0, tmp_path / "no-textfile-dir")
    assert code == 0, log
    assert log.count("not publishing metrics") == 1 and "no-textfile-dir" in log
    assert any(c[:2] == ["-m", "lcm_runner.metrics"] for c in calls)
