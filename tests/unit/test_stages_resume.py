"""The resume stage's stop is a crash, not a cancel: SIGKILL of every rank and agent of the job at once
(nothing can catch a signal and checkpoint on the way out), then the checks that nothing was saved past
step N and that the resubmitted job resumes at N+1. The local run is slow (two fresh trainer starts);
the Slurm command lines are checked against a recorded command runner (no Slurm here)."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest
from srunlabel import labelled

from lcm_runner import telemetry
from lcm_runner.config import from_dict
from lcm_runner.launch.base import HardKill, Job, JobSpec, LaunchError
from lcm_runner.launch.slurm import SlurmLauncher, kill_job_argv
from lcm_runner.launch.torchrun import LocalLauncher
from lcm_runner.stages import resume
from lcm_runner.stages.common import Progress, StageContext
from lcm_runner.telemetry import Record

CFG = {
    "name": "ci-resume",
    "launcher": "torchrun",
    "agent": "lcm",
    "nodes": 2,
    "procs_per_node": 1,
    "train_iters": 10,
    "save_interval": 4,
    "keep_last": 2,
    "max_restarts": 1,
    "rdzv_join_timeout_s": 20,
    "hb_timeout_s": 5.0,
    "master_port": 29850,
    "model": {
        "num_layers": 1,
        "hidden_size": 32,
        "num_attention_heads": 2,
        "ffn_hidden_size": 64,
        "seq_length": 32,
        "micro_batch_size": 2,
        "global_batch_size": 4,
        "ep": 2,
        "num_experts": 2,
        "moe_router_topk": 2,
    },
    "fault": {"kill_at_step": 6, "kill_node": 1},
}


@pytest.mark.slow
def test_resume_kills_every_rank_with_sigkill_and_resumes_from_n(tmp_path: Path) -> None:
    cfg = from_dict(CFG)
    run_dir = tmp_path / "run"
    (run_dir / "telemetry").mkdir(parents=True)
    launcher = LocalLauncher(spare_nodes=0)
    ctx = StageContext(cfg, run_dir, launcher, Progress(sys.stdout), step_sleep_ms=150, timeout_s=240)
    try:
        res = resume.run(ctx)
    finally:
        launcher.close()
    print(json.dumps(res.metrics, indent=1, default=str), res.summary)
    assert res.verdict == "PASS", res.summary
    k = res.metrics["kill"]
    assert k["signal"] == "SIGKILL" and k["ranks_killed"] == 2 == k["world_size"]
    assert k["agent_exit"] == {"local0": -9, "local1": -9}  # the agents died of SIGKILL, not of a stop
    assert k["left"] == {} and k["job_ended"]
    assert k["at_step"] >= 5 and k["ckpt_before_kill"] == 4 and k["latest_after_kill"] == 4
    assert k["signal_records"] == 0 and k["requeue_exits"] == 0
    assert k["ckpt_records_after_kill"] == 0 and k["complete_dirs_past_ckpt"] == []
    # straight from the telemetry: the killed job wrote nothing once killed (a SIGKILLed rank cannot),
    # no signal record, no exit record (every exit of the trainer, even on an error, writes one)
    first = res.job_ids[0]
    kill_ts = next(e["ts"] for e in res.events if e["what"].startswith(f"killed {first}"))
    recs = [r for r in telemetry.load_run(run_dir) if r.job == first]
    assert [r for r in recs if r.ts >= kill_ts] == []
    assert not [r for r in recs if r.event in ("signal", "exit")]
    assert max(r.step or 0 for r in recs if r.event == "ckpt_end") == 4
    assert res.metrics["first_new_step"] == 5 and res.metrics["ckpt_step"] == 4
    assert "SIGKILL of every rank (2/2)" in res.summary
    ckpt = run_dir / "checkpoints" / "resume"
    assert (ckpt / "latest_checkpointed_iteration.txt").read_text().strip() == "10"  # the resumed job's


def _rec(event: str, ts: float, rank: int = 0, **data: Any) -> Record:
    return Record(ts, event, rank, 0, "r-1", dict(data))


def test_after_kill_finds_every_sign_of_a_save_on_the_way_out(tmp_path: Path) -> None:
    ck = tmp_path / "ck"
    for step, complete in ((4, True), (8, False)):
        (ck / f"iter_{step:07d}").mkdir(parents=True)
        if complete:
            (ck / f"iter_{step:07d}" / resume.COMPLETE_MARKER).write_text("{}")
    kill = HardKill(100.0)
    clean = [_rec("ckpt_end", 50.0, step=4), _rec("step", 60.0, step=5), _rec("ckpt_begin", 90.0, step=8)]
    got = resume.after_kill(clean, kill, ck, 4)
    assert got == {
        "ckpt_before_kill": 4,
        "latest_after_kill": 4,
        "signal_records": 0,
        "ckpt_records_after_kill": 0,
        "exit_records_after_kill": 0,
        "requeue_exits": 0,
        "complete_dirs_past_ckpt": [],
        "partial_dirs_past_ckpt": [8],  # an async save cut by the kill: a crash leaves that
    }
    (ck / "iter_0000008" / resume.COMPLETE_MARKER).write_text("{}")
    saved = [
        *clean,
        _rec("signal", 100.5, name="SIGTERM"),
        _rec("ckpt_end", 101.0, step=8),
        _rec("exit", 101.2, code=75),
    ]
    got = resume.after_kill(saved, kill, ck, 8)
    assert got["ckpt_before_kill"] == 4 and got["latest_after_kill"] == 8
    assert got["signal_records"] == 1 and got["ckpt_records_after_kill"] == 1 and got["requeue_exits"] == 1
    assert got["complete_dirs_past_ckpt"] == [8]


# ----------------------------------------------------------------------------- Slurm command lines

NODES = "lab-node[1-2]"
PY = "/opt/lcm/venv/bin/python"


class FakeSlurm:
    """Answers the launcher's commands like a Slurm controller would; records every argv."""

    def __init__(self, ends_after_kill: bool = True, step_filter_matches: bool = True) -> None:
        self.calls: list[list[str]] = []
        self.state = "RUNNING"
        self.ends_after_kill = ends_after_kill
        self.step_filter_matches = step_filter_matches

    def __call__(self, argv: list[str], timeout: float, check: bool, env: dict[str, str] | None) -> str:
        self.calls.append(argv)
        if argv[:3] == ["scontrol", "show", "job"]:
            return f"JobId=42 JobName=lcm-resume JobState={self.state} ExitCode=0:0 NodeList={NODES}\n"
        if argv[:3] == ["scontrol", "show", "hostnames"]:
            return "lab-node1\nlab-node2\n"
        if argv[0] == "scancel":
            self.state = "CANCELLED"
            return ""
        if argv[0] == "srun":
            found = "--node" not in " ".join(argv) or self.step_filter_matches
            if "stop-all" in argv:  # the freeze before the kill: nothing ends
                return labelled(
                    [
                        json.dumps({"ts": 1.0, "action": "stop-all", "procs": _procs(n) if found else []})
                        + "\n"
                        for n in ("lab-node1", "lab-node2")
                    ],
                    piece=64,
                )
            if self.ends_after_kill and found:
                self.state = "FAILED"  # the batch script's agents were killed: it exits, no requeue
            if "--label" not in argv:  # one node (_on_node): its answer as it is
                return json.dumps({"ts": 1.0, "action": "kill-all", "procs": _procs(NODES) if found else []})
            return labelled(
                [
                    json.dumps({"ts": 1.0, "action": "kill-all", "procs": _procs(n) if found else []}) + "\n"
                    for n in ("lab-node1", "lab-node2")
                ],
                piece=64,
            )
        raise AssertionError(f"unexpected command {argv}")


def _procs(node: str) -> list[dict[str, Any]]:
    agent = {
        "pid": 10,
        "ppid": 1,
        "comm": "python",
        "cmdline": "python -m lcm_runner.launch.agent",
        "node": node,
    }
    rank = {"pid": 11, "ppid": 10, "comm": "lcm-trainer", "cmdline": "python -m lcm_runner.launch.agent"}
    writer = {"pid": 12, "ppid": 11, "comm": "lcm-trainer", "cmdline": "python -m lcm_runner.launch.agent"}
    return [agent, {**rank, "node": node}, {**writer, "node": node}]


def _slurm(tmp_path: Path, fake: FakeSlurm, monkeypatch: pytest.MonkeyPatch) -> tuple[SlurmLauncher, Job]:
    cfg = from_dict({**CFG, "launcher": "slurm", "python": PY})
    launcher = SlurmLauncher({}, cfg, run_cmd=fake)
    # no waiting on a fake clock: one status look
    monkeypatch.setattr(SlurmLauncher, "wait", lambda self, job, timeout_s: self.status(job))
    spec = JobSpec("resume", tmp_path, [], nodes=2, procs_per_node=1)  # world size 2
    return launcher, Job("42", spec, 0.0, tag="run/42")


def test_slurm_kill_job_is_a_sigkill_from_the_nodes_not_a_scancel(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake = FakeSlurm()
    launcher, job = _slurm(tmp_path, fake, monkeypatch)
    kill = launcher.kill_job(job)
    sruns = [c for c in fake.calls if c[0] == "srun"]
    # every process frozen on every node first, then killed: no rank sees a peer die before its SIGKILL
    assert [c[-2] for c in sruns] == ["stop-all", "kill-all"]
    assert sruns[0][:-2] == sruns[1][:-2]
    assert sruns[1:] == [
        [
            "srun",
            "--overlap",
            "--jobid=42",
            "-w",
            "lab-node1,lab-node2",
            "-N2",
            "-n2",
            "--ntasks-per-node=1",
            "--quiet",
            "--label",
            "bash",
            "-c",
            'exec "$1" -m lcm_runner.launch.procs "$2" --tag "$3" --node "$(hostname)"',
            "lcm-procs",
            PY,
            "kill-all",
            "run/42",
        ]
    ]
    assert not [c for c in fake.calls if c[0] == "scancel"]  # the job ended by itself: no SIGTERM
    assert kill.signal == "SIGKILL" and kill.job_ended and kill.left == {}
    assert kill.ranks == {"lab-node1": 1, "lab-node2": 1}  # the writer (child of a rank) is no rank
    assert kill.killed == {
        n: ["10 python", "11 lcm-trainer", "12 lcm-trainer"] for n in ("lab-node1", "lab-node2")
    }
    assert kill.ranks_killed == 2


def test_slurm_kill_job_that_does_not_end_kills_everything_then_scancels(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake = FakeSlurm(ends_after_kill=False)
    launcher, job = _slurm(tmp_path, fake, monkeypatch)
    kill = launcher.kill_job(job)
    sruns = [c for c in fake.calls if c[0] == "srun"]
    assert len(sruns) == 3  # freeze, kill (step), kill (everything)
    assert sruns[2] == kill_job_argv(PY, "42", "run/42", ["lab-node1", "lab-node2"], "kill-all")
    assert sruns[2][-6:] == [PY, "-m", "lcm_runner.launch.procs", "kill-all", "--tag", "run/42"]
    assert [c for c in fake.calls if c[0] == "scancel"] == [["scancel", "42"]]  # after the SIGKILLs
    assert kill.job_ended and set(kill.left) == {"lab-node1", "lab-node2"}


class EndsBetweenSteps(FakeSlurm):
    """The step-filtered kill finds only one node's rank and the job ends right after it: the next
    `srun --overlap --jobid` is refused like Slurm 22.05 refuses a step of a finished job."""

    def __call__(self, argv: list[str], timeout: float, check: bool, env: dict[str, str] | None) -> str:
        if argv[0] == "srun" and self.state != "RUNNING":
            self.calls.append(argv)
            raise LaunchError(f"{' '.join(argv[:6])} failed (1): srun: error: Slurm job 42 has expired")
        out = super().__call__(argv, timeout, check, env)
        if argv[0] == "srun" and "--node" in " ".join(argv):
            action = "kill-all" if "kill-all" in argv else "stop-all"
            if action == "kill-all":
                self.state = "FAILED"
            out = labelled(
                [
                    json.dumps({"ts": 1.0, "action": action, "procs": _procs("lab-node1")}) + "\n",
                    json.dumps({"ts": 1.0, "action": action, "procs": []}) + "\n",
                ],
                piece=64,
            )
        return out


def test_slurm_kill_job_that_ends_before_the_second_kill_is_no_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Containers started from the squashfs end a killed job within a second (the lab's fault stage
    met this): the fallback kill of every process finds the job gone, which is what it wanted."""
    fake = EndsBetweenSteps()
    launcher, job = _slurm(tmp_path, fake, monkeypatch)
    kill = launcher.kill_job(job)
    assert len([c for c in fake.calls if c[0] == "srun"]) == 3  # freeze, kill; the fallback refused
    assert kill.job_ended and kill.ranks_killed == 1
    assert not [c for c in fake.calls if c[0] == "scancel"]


def test_slurm_kill_job_still_raises_when_the_job_runs_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    class Broken(FakeSlurm):
        def __call__(self, argv: list[str], timeout: float, check: bool, env: dict[str, str] | None) -> str:
            if argv[0] == "srun":
                raise LaunchError("srun --overlap --jobid=42 failed (1): srun: error: Unable to create step")
            return super().__call__(argv, timeout, check, env)

    launcher, job = _slurm(tmp_path, Broken(), monkeypatch)
    with pytest.raises(LaunchError, match="Unable to create step"):
        launcher.kill_job(job)


def test_slurm_hard_cancel_is_kill_job_and_never_scancel_signal_kill(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake = FakeSlurm()
    launcher, job = _slurm(tmp_path, fake, monkeypatch)
    launcher.cancel(job, hard=True)
    assert [c[0] for c in fake.calls if c[0] in ("srun", "scancel")] == ["srun", "srun"]  # freeze, kill
    assert not [c for c in fake.calls if any(a.startswith("--signal") for a in c)]
    fake2 = FakeSlurm()
    launcher2, job2 = _slurm(tmp_path, fake2, monkeypatch)
    launcher2.cancel(job2)  # the soft cancel stays scancel (SIGTERM: the ranks may checkpoint)
    assert [c for c in fake2.calls if c[0] in ("srun", "scancel")] == [["scancel", "42"]]


def test_slurm_kill_job_of_a_job_not_running_only_scancels(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake = FakeSlurm()
    fake.state = "PENDING"
    launcher, job = _slurm(tmp_path, fake, monkeypatch)
    kill = launcher.kill_job(job)
    assert [c for c in fake.calls if c[0] in ("srun", "scancel")] == [["scancel", "42"]]
    assert kill.killed == {} and kill.job_ended and "PENDING" in kill.note


def test_slurm_kill_job_whose_step_filter_finds_no_rank_kills_every_process_at_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake = FakeSlurm(step_filter_matches=False)  # LCM_NODE is not the node's hostname there
    launcher, job = _slurm(tmp_path, fake, monkeypatch)
    kill = launcher.kill_job(job)
    sruns = [c for c in fake.calls if c[0] == "srun"]
    # freeze and kill by the step filter (nothing found), then the unfiltered kill right after
    assert [("--node" in " ".join(c)) for c in sruns] == [True, True, False]
    assert not [c for c in fake.calls if c[0] == "scancel"] and kill.job_ended
    assert kill.ranks_killed == 2 and kill.left == {}


def test_slurm_resumes_only_the_nodes_it_drained_itself(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A node the launcher drained for the fault stage is resumed; one an agent has since marked DOWN
    after a real death ("lcm: ...") is left for the node watchdog."""
    calls: list[list[str]] = []
    reasons = {"lab-node1": "lcm-fault-node-loss", "lab-node2": "lcm: agent heartbeat lost: node1"}

    def fake(argv: list[str], **_kw: Any) -> str:
        calls.append(list(argv))
        if argv[:2] == ["sinfo", "-h"]:
            return reasons[argv[argv.index("-n") + 1]] + "\n"
        return ""

    cfg = from_dict({**CFG, "launcher": "slurm", "python": PY})
    launcher = SlurmLauncher({}, cfg, run_cmd=fake)
    launcher._drained = ["lab-node1", "lab-node2"]
    launcher._resume_drained()
    resumed = [c for c in calls if c[:2] == ["scontrol", "update"]]
    assert resumed == [["scontrol", "update", "NodeName=lab-node1", "State=RESUME"]]
    assert launcher._drained == []
