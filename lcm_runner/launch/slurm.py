"""Slurm launcher: runs on the controller and drives jobs with sbatch/squeue/scontrol/scancel, and acts
on nodes the way an operator does, with `srun --overlap --jobid=<job> -w <node>` (a step inside the
running job, on that node only) running `python -m lcm_runner.launch.procs`.

The batch script is the one rendered from lcm_runner/templates/train.sbatch.j2 (lcm_runner.render):
one agent per node through srun; the script requeues the job itself when the agents exit
REQUEUE (75, checkpointed after a signal) or NODE_LOST (76, a peer node vanished); the codes are
lcm_runner.contracts.REQUEUE_REASONS. `submit` renders the script from the JobSpec alone.

Over ~300 lines: one Launcher implementation (submit, follow, kill, node loss) over sbatch/scontrol/srun;
srunout.py and nodefail.py hold the parts with their own concern.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import re
import subprocess
import time
from pathlib import Path
from typing import Any

from lcm_runner.config import RunConfig
from lcm_runner.launch import procs, srunout
from lcm_runner.launch.base import HardKill, Job, JobSpec, JobState, JobStatus, LaunchError, count_ranks

_STATES = {
    "PENDING": JobState.PENDING,
    "REQUEUED": JobState.PENDING,
    "REQUEUE_HOLD": JobState.PENDING,
    "REQUEUE_FED": JobState.PENDING,
    "CONFIGURING": JobState.RUNNING,
    "RUNNING": JobState.RUNNING,
    "COMPLETING": JobState.RUNNING,
    "SUSPENDED": JobState.RUNNING,
    "STOPPED": JobState.RUNNING,
    "RESIZING": JobState.RUNNING,
    "COMPLETED": JobState.COMPLETED,
    "CANCELLED": JobState.CANCELLED,
    "PREEMPTED": JobState.CANCELLED,
}  # everything else (FAILED, NODE_FAIL, TIMEOUT, OUT_OF_MEMORY, BOOT_FAIL, DEADLINE) is FAILED


def parse_scontrol(text: str) -> dict[str, str]:
    """`scontrol show job -o` output (one line of Key=Value) -> dict."""
    out: dict[str, str] = {}
    for m in re.finditer(r"(\w[\w:/]*)=(\S*)", text):
        out.setdefault(m.group(1), m.group(2))
    return out


def state_of(fields: dict[str, str]) -> JobStatus:
    raw = fields.get("JobState", "UNKNOWN")
    state = _STATES.get(raw, JobState.FAILED)
    code = fields.get("ExitCode", "0:0")
    return JobStatus(
        state, {"batch": int(code.split(":")[0] or 0)}, f"{raw} exit {code} {fields.get('Reason', '')}"
    )


SCONTROL_RETRY_S = 60.0  # how long a job query that slurmctld did not answer is asked again


class SlurmLauncher:
    name = "slurm"

    def __init__(self, cluster: dict[str, Any], cfg: RunConfig, run_cmd: Any = None) -> None:
        self.cluster = cluster
        self.cfg = cfg
        self._run_cmd = run_cmd or _run
        self._seq = itertools.count(1)
        self._drained: list[str] = []
        self._started: list[Job] = []

    # --- helpers ---------------------------------------------------------------------------------
    def _sh(
        self, *argv: str, timeout: float = 60.0, check: bool = True, env: dict[str, str] | None = None
    ) -> str:
        return self._run_cmd(list(argv), timeout=timeout, check=check, env=env)

    def _fields(self, job: Job) -> dict[str, str]:
        """The job's `scontrol show job` fields; {} once slurmctld says the id is invalid (the record is
        gone). Any other failure (a busy controller's "Socket timed out", an unreachable slurmctld) is
        asked again for up to SCONTROL_RETRY_S, then a LaunchError: never mistaken for a gone job (seen
        on the lab, 2026-12-02: a timed-out query ended a running job's fault case)."""
        deadline = time.monotonic() + SCONTROL_RETRY_S
        while True:
            try:
                out = self._sh("scontrol", "show", "job", "-o", job.id, check=False, timeout=30.0)
            except LaunchError as exc:  # the command itself timed out
                out = str(exc)
            if "Invalid job id" in out:
                return {}
            if "JobId=" in out:
                return parse_scontrol(out)
            if time.monotonic() >= deadline:
                raise LaunchError(
                    f"scontrol show job {job.id}: no answer from slurmctld: {out.strip()[-300:]}"
                )
            time.sleep(1.0)

    def _hostnames(self, nodelist: str) -> list[str]:
        if not nodelist or nodelist in ("(null)", "None"):
            return []
        return self._sh("scontrol", "show", "hostnames", nodelist).split()

    def _on_node(self, job: Job, node: str, action: str) -> dict[str, Any]:
        """Run the process tool on one node: inside the running job (--overlap), else as a tiny new job."""
        tool = [self.cfg.python, "-m", "lcm_runner.launch.procs", action, "--tag", job.tag]
        if self.status(job).state == JobState.RUNNING:
            argv = ["srun", "--overlap", f"--jobid={job.id}", "-w", node, "-N1", "-n1", "--quiet", *tool]
        else:
            argv = ["srun", "-w", node, "-N1", "-n1", "--quiet", "-t", "1", *self._partition(), *tool]
        out = self._sh(*argv, timeout=60.0)
        line = next((ln for ln in reversed(out.splitlines()) if ln.startswith("{")), "")
        if not line:
            raise LaunchError(f"{action} on {node}: no answer from lcm_runner.launch.procs: {out[-300:]}")
        return json.loads(line)

    def _partition(self) -> list[str]:
        return ["-p", self.cfg.partition] if self.cfg.partition else []

    # --- submit / follow -------------------------------------------------------------------------
    def submit(self, spec: JobSpec) -> Job:
        """Render the batch script of `spec` (lcm_runner.render.sbatch_for: everything about the launch
        comes from the JobSpec) and sbatch it."""
        from lcm_runner.render import RenderError, check, sbatch_for

        spec.validate()
        problems = check(self.cluster, self.cfg)  # the run config this launcher serves, as it is
        if problems:
            raise RenderError("the run config does not fit the cluster spec:\n  - " + "\n  - ".join(problems))
        profile = spec.env.get("NCCL_DEBUG") == "INFO"
        text = sbatch_for(self.cluster, spec, nccl_profile=profile, job_name=f"lcm-{spec.name}")
        n = next(self._seq)
        path = spec.run_dir / "sbatch" / f"{spec.name}-{n}.sbatch"
        path.parent.mkdir(parents=True, exist_ok=True)
        (spec.run_dir / "logs").mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
        env = {**os.environ, **{k: v for k, v in spec.env.items() if not k.startswith("NCCL_DEBUG")}}
        submitted = time.time()
        out = self._sh("sbatch", "--parsable", str(path), env=env).strip()
        job_id = out.split(";")[0]
        if not job_id.isdigit():
            raise LaunchError(f"sbatch did not return a job id: {out!r}")
        job = Job(job_id, spec, submitted, tag=f"{spec.run_dir.name}/{job_id}")
        self._started.append(job)
        return job

    def status(self, job: Job) -> JobStatus:
        f = self._fields(job)
        if not f:
            return JobStatus(JobState.FAILED, {}, "job record gone (MinJobAge passed?)")
        st = state_of(f)
        if st.state == JobState.RUNNING:
            job.nodes = self._hostnames(f.get("NodeList", "")) or job.nodes
            job.touched = list(dict.fromkeys([*job.touched, *job.nodes]))
        return st

    def wait(self, job: Job, timeout_s: float) -> JobStatus:
        deadline = time.monotonic() + timeout_s
        st = self.status(job)
        while not st.state.finished and time.monotonic() < deadline:
            time.sleep(0.5)
            st = self.status(job)
        return st

    def cancel(self, job: Job, hard: bool = False) -> None:
        """scancel: Slurm sends SIGCONT+SIGTERM to every process of the job, SIGKILL after KillWait (the
        ranks catch SIGTERM and checkpoint). hard: `kill_job`. `scancel --signal=KILL --full` does not
        do for that: slurmctld ends the job the ordinary way, SIGTERM first (the lab run of 2026-11-30,
        docs/results/lab-slurm: every rank logged SIGTERM, saved step 12 and exited 75)."""
        if hard:
            self.kill_job(job)
            return
        self._sh("scancel", job.id, check=False)
        self.wait(job, 60.0)

    def kill_job(self, job: Job) -> HardKill:
        """kill -9 every agent and rank of the job from the nodes, all nodes in one `srun --overlap` step
        (the mechanism of `kill_trainer`, lcm_runner.launch.procs kill-all), restricted to the job step's
        processes (LCM_NODE, set by the batch script's node function): the batch shell stays, sees its
        agents killed (no requeue code) and ends the job, and no node's ranks are signalled by Slurm
        while another node's kill is on its way. Fewer ranks found than the job has: every process of
        the job at once. Not ended within 30 s: every process again, then scancel.

        The kill is two steps: every process of the job SIGSTOPped on every node, then SIGKILLed. The
        nodes' tasks of one step do not start at the same instant; with one SIGKILL step, the ranks of a
        node reached later saw their peers' sockets close and exited on their own first (the lab,
        2026-12-02: 2 of 4 ranks "killed"). Frozen processes keep their sockets open, so no rank notices
        anything before its SIGKILL, and none can run a handler: SIGSTOP cannot be caught."""
        st = self.status(job)
        if st.state != JobState.RUNNING or not job.nodes:
            was = st.state.value
            if not st.state.finished:
                self._sh("scancel", job.id, check=False)  # nothing of it runs: no rank to signal
            st = self.wait(job, 60.0)
            return HardKill(time.time(), job_ended=st.state.finished, note=f"job was {was}: nothing to kill")
        nodes = list(job.nodes)
        ts = time.time()
        try:
            stopped = self._on_nodes(job, nodes, "stop-all", step_only=True)
        except LaunchError:
            stopped = []  # the SIGKILL step below still ends it; only the freeze was lost
        answers = self._on_nodes_while_running(job, nodes, "kill-all", step_only=True)
        killed = procs.union([procs.Proc(**p) for ans in (*stopped, *answers) for p in ans["procs"]])
        if count_ranks(killed) < job.spec.world_size:
            # the step filter missed ranks (LCM_NODE is not the hostname there?): at once, every
            # process of the job, the batch shell too (it then ends the job without a requeue)
            more = self._on_nodes_while_running(job, nodes, "kill-all")
            killed = procs.union(killed + [procs.Proc(**p) for ans in more for p in ans["procs"]])
        st = self.wait(job, 30.0)
        left: list[procs.Proc] = []
        if not st.state.finished:
            # something outside the step's processes keeps it alive: every process of the job, then cancel
            with contextlib.suppress(LaunchError):
                again = [
                    procs.Proc(**p) for ans in self._on_nodes(job, nodes, "kill-all") for p in ans["procs"]
                ]
                left = [p for p in again if p.node]  # the batch shell (no LCM_NODE) was meant to stay
            self._sh("scancel", job.id, check=False)
            st = self.wait(job, 60.0)
        by_node, left_by_node = _by_node(killed), _by_node(left)
        return HardKill(
            ts,
            killed={n: [f"{p.pid} {p.comm}" for p in ps] for n, ps in by_node.items()},
            ranks={n: count_ranks(ps) for n, ps in by_node.items()},
            left={n: [f"{p.pid} {p.comm}" for p in ps] for n, ps in left_by_node.items()},
            job_ended=st.state.finished,
        )

    def _on_nodes(
        self, job: Job, nodes: list[str], action: str, step_only: bool = False
    ) -> list[dict[str, Any]]:
        """The process tool on several nodes of the running job at once: one task per node in one
        `srun --overlap` step; one JSON answer per node. step_only: only processes whose LCM_NODE is the
        node's hostname (the batch script's node function exports it; the batch shell has none)."""
        argv = kill_job_argv(self.cfg.python, job.id, job.tag, nodes, action, step_only)
        out = self._sh(*argv, timeout=60.0)
        answers = [a for a in srunout.answers(out) if "procs" in a]  # --label: whole answers per task
        if len(answers) != len(nodes):
            raise LaunchError(
                f"{action} on {','.join(nodes)}: {len(answers)} answer(s) from lcm_runner.launch.procs, "
                f"{len(nodes)} expected: {out[-300:]}"
            )
        return answers

    def _on_nodes_while_running(
        self, job: Job, nodes: list[str], action: str, step_only: bool = False
    ) -> list[dict[str, Any]]:
        """_on_nodes, where a job that ended meanwhile is no error: a step cannot join a finished job
        (srun: "Slurm job N has expired"), and there is nothing left to act on. With containers that
        start from the squashfs, a job whose ranks were just killed ends within a second. Slurm then
        also ends the acting step itself (srun exits 143, "STEP N.M ... FAILED": its answer is lost) while
        the job is still COMPLETING: that too is a job ending, waited for (10 s) before it is an error."""
        try:
            return self._on_nodes(job, nodes, action, step_only)
        except LaunchError:
            deadline = time.monotonic() + 10.0
            while True:
                if self.status(job).state.finished or self._fields(job).get("JobState") == "COMPLETING":
                    return []
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)

    # --- faults ----------------------------------------------------------------------------------
    def kill_trainer(self, job: Job, node: str) -> float:
        ans = self._on_node(job, node, "kill-trainer")
        if not ans["procs"]:
            raise LaunchError(f"job {job.id}: no trainer process on {node} to kill")
        return float(ans["ts"])

    def kill_node(self, job: Job, node: str) -> float:
        ans = self._on_node(job, node, "kill-all")
        if not ans["procs"]:
            raise LaunchError(f"job {job.id}: nothing of the job runs on {node}")
        return float(ans["ts"])

    def processes_left(self, job: Job, node: str) -> list[str]:
        ans = self._on_node(job, node, "list")
        return [f"{p['pid']} {p['comm']}: {p['cmdline'][:120]}" for p in ans["procs"]]

    def cleanup(self, job: Job) -> None:
        self._resume_drained()
        for node in job.all_nodes():
            self._on_node(job, node, "kill-all")

    def _resume_drained(self) -> None:
        """Resume the nodes this launcher drained, unless something else has marked them since (an
        agent's "lcm: ..." DOWN after a real node death, an operator): those stay as they are."""
        for node in self._drained:
            reason = self._sh("sinfo", "-h", "-N", "-n", node, "-o", "%E", check=False).strip()
            if reason and reason != "lcm-fault-node-loss":
                continue
            self._sh("scontrol", "update", f"NodeName={node}", "State=RESUME", check=False)
        self._drained.clear()

    def spare_nodes(self, job: Job) -> list[str]:
        out = self._sh("sinfo", "-h", "-N", "-t", "idle", "-o", "%N", *self._partition(), check=False)
        return [n for n in out.split() if n not in job.nodes]

    def relaunch(self, job: Job, exclude: list[str]) -> Job:
        """After a node loss: drain the lost node when a spare is idle (the requeue lands there), let
        the batch script requeue the job (survivors exit NODE_LOST); requeue it here if it ended
        otherwise; start it now rather than after Slurm's requeue delay; wait until it runs again."""
        if self.spare_nodes(job):
            for node in exclude:
                self._sh(
                    "scontrol",
                    "update",
                    f"NodeName={node}",
                    "State=DRAIN",
                    "Reason=lcm-fault-node-loss",
                    check=False,
                )
                self._drained.append(node)
        restarts = int(self._fields(job).get("Restarts", "0") or 0)
        bound = job.spec.join_timeout_s + job.spec.hb_timeout_s + 60.0
        deadline = time.monotonic() + bound
        while time.monotonic() < deadline:
            f = self._fields(job)
            if int(f.get("Restarts", "0") or 0) > restarts or f.get("JobState") in ("PENDING", "REQUEUED"):
                break
            if f.get("JobState") in ("FAILED", "COMPLETED", "CANCELLED", "NODE_FAIL", "TIMEOUT"):
                self._sh("scontrol", "requeue", job.id)
                break
            time.sleep(0.2)
        else:
            raise LaunchError(f"job {job.id} neither requeued nor ended within {bound:.0f}s of the node loss")
        # No `StartTime=now`: Slurm keeps the old credential revoked on the nodes for AuthInfo's
        # cred_expire (slurm_cred_expire); a requeued job forced to start earlier is killed as
        # "non-startable: Job credential revoked". The delay is a Slurm setting, not a launcher one.
        deadline = time.monotonic() + 300.0
        while time.monotonic() < deadline:
            st = self.status(job)
            if st.state == JobState.RUNNING and job.nodes:
                self._resume_drained()  # replaced: the node is back in service (and checkable)
                return job
            f = self._fields(job)
            if int(f.get("Restarts", "0") or 0) > restarts and f.get("JobState") in (
                "FAILED",
                "CANCELLED",
                "NODE_FAIL",
                "BOOT_FAIL",
            ):
                raise LaunchError(
                    f"job {job.id} was requeued but its next start failed ({f.get('JobState')}, "
                    f"{f.get('Reason', '')}); see slurmctld.log"
                )
            time.sleep(0.2)
        raise LaunchError(f"job {job.id} was requeued but did not start again within 300s")

    def close(self) -> None:
        for job in self._started:
            if not self.status(job).state.finished:
                self._sh("scancel", job.id, check=False)


def _by_node(found: list[procs.Proc]) -> dict[str, list[procs.Proc]]:
    out: dict[str, list[procs.Proc]] = {}
    for p in found:
        out.setdefault(p.node or "(no LCM_NODE)", []).append(p)
    return out


def kill_job_argv(
    python: str, job_id: str, tag: str, nodes: list[str], action: str, step_only: bool = False
) -> list[str]:
    """`srun --overlap` of lcm_runner.launch.procs on every node of a running job (one task each)."""
    n = len(nodes)
    head = ["srun", "--overlap", f"--jobid={job_id}", "-w", ",".join(nodes), f"-N{n}", f"-n{n}"]
    head += ["--ntasks-per-node=1", "--quiet", "--label"]  # pieces of each task's answer: srunout
    if not step_only:
        return [*head, python, "-m", "lcm_runner.launch.procs", action, "--tag", tag]
    script = 'exec "$1" -m lcm_runner.launch.procs "$2" --tag "$3" --node "$(hostname)"'
    return [*head, "bash", "-c", script, "lcm-procs", python, action, tag]


def _run(argv: list[str], timeout: float, check: bool, env: dict[str, str] | None) -> str:
    try:
        p = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, env=env, check=False)
    except FileNotFoundError as e:
        raise LaunchError(f"{argv[0]} not found: the slurm launcher runs on the Slurm controller") from e
    except subprocess.TimeoutExpired as e:
        raise LaunchError(f"{' '.join(argv[:4])} timed out after {timeout:.0f}s") from e
    if check and p.returncode != 0:
        raise LaunchError(
            f"{' '.join(argv[:6])} failed ({p.returncode}): {(p.stderr or p.stdout).strip()[-400:]}"
        )
    return p.stdout + p.stderr if not check else p.stdout


__all__ = ["Path", "SlurmLauncher", "kill_job_argv", "parse_scontrol", "state_of"]
