"""Node faults on the lab's real Slurm: a compute node's container killed
outright mid-run, and a compute node cut off its network for PARTITION_S seconds.

Run from the host with the lab up with three compute nodes (a spare for the requeued job):
    LAB_COMPUTE_NODES=3 ansible-playbook site.yml
    pytest -m lab tests/faults/test_node_faults.py -s
Every test is bounded (each wait has a deadline) and puts the node back (podman start / network
connect) even when an assertion fails. The tests without the `lab` mark (nodefail and the node
watchdog with fake Slurm commands) run anywhere: `pytest tests/faults -m "not lab"`.

Measured per case (seconds after the fault, host clock; the containers share it): the survivor's
`node_lost` event (detection), its `node_down` event, the job step gone from `squeue -s`, the
requeue (Restarts + 1), the first new training step (rank 0 telemetry after its `resume`), and the
node back to idle after `podman start` / the network came back. Each case writes them to
.lab/shared/runs/faults/<case>-<job>.json (the numbers in docs/reliability-nodes.md come from there).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest
import yaml
from faultmatrix import Matrix, Row

from lcm_runner.launch import nodefail

ROOT = Path(__file__).resolve().parents[2]
LAB = Path(os.environ.get("LCM_LAB_DIR", ROOT / ".lab"))
SHARED_HOST = LAB / "shared"
CTL = os.environ.get("LCM_LAB_CONTROLLER", "lab-ctl")
RUNNER = os.environ.get("LCM_LAB_RUNNER", "/opt/lcm/venv/bin/lcm-runner")
SPEC = os.environ.get("LCM_LAB_SPEC", "/opt/lcm/cluster.yml")
NETWORK = os.environ.get("LCM_LAB_NETWORK", "lcm-lab")
PARTITION_S = float(os.environ.get("LCM_FAULT_PARTITION_S", "60"))
FORCED = os.environ.get("LCM_LAB") == "1"
WATCHDOG = ROOT / "roles" / "slurm" / "files" / "lcm-node-watchdog.sh"

HB_SLACK_S = 2.5  # detection <= hb_timeout_s + one heartbeat interval + the store poll, on a busy host
FIRST_STEP_MAX_S = 30.0  # node gone -> first new step of the requeued job
NODE_BACK_MAX_S = 60.0  # node reachable again -> idle in Slurm


# ----------------------------------------------------------------------------- helpers


def _run(argv: list[str], timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False)


def _net_identity(node: str) -> tuple[str, str]:
    """The node's address and MAC on the lab network: a reconnect keeps both, as a re-plugged cable
    does (a new MAC would leave the peers' neighbour caches pointing at the old one: seconds of stalls
    on the first connections, which real nodes do not see)."""
    fmt = '{{(index .NetworkSettings.Networks "' + NETWORK + '").IPAddress}}|'
    fmt += '{{(index .NetworkSettings.Networks "' + NETWORK + '").MacAddress}}'
    ip, _, mac = _run(["podman", "inspect", node, "--format", fmt]).stdout.strip().partition("|")
    return ip, mac


def reconnect_argv(node: str, ip: str, mac: str) -> list[str]:
    return [
        "podman",
        "network",
        "connect",
        "--ip",
        ip,
        *(["--mac-address", mac] if mac else []),
        NETWORK,
        node,
    ]


def _ctl(*argv: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return _run(["podman", "exec", CTL, *argv], timeout)


def _node_state(node: str) -> tuple[str, str]:
    out = _ctl("sinfo", "-h", "-N", "-n", node, "-o", "%T|%E").stdout.strip().splitlines()
    state, _, reason = (out[0] if out else "|").partition("|")
    return state, reason


def _wait(pred: Any, timeout: float, every: float = 0.5, what: str = "") -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = pred()
        if got:
            return got
        time.sleep(every)
    raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}")


def _jsonl(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    out = []
    for line in path.read_text(errors="replace").splitlines():
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:
            continue  # a line being written
    return out


# Runs inside lab-ctl for at most `dur` s: one JSON line per change of the job's state, restart count,
# node list or step list (0.2 s cadence), so the host learns the times without a podman exec per poll.
_POLLER = textwrap.dedent(
    """
    import json, re, subprocess, sys, time
    job, dur = sys.argv[1], float(sys.argv[2])
    end, last = time.time() + dur, None
    while time.time() < end:
        t = time.time()
        out = subprocess.run(["scontrol", "show", "job", "-o", job], capture_output=True, text=True).stdout
        f = {}
        for k, v in re.findall(r"(\\w+)=(\\S*)", out):
            f.setdefault(k, v)
        steps = subprocess.run(["squeue", "-h", "-s", "-j", job, "-o", "%i"], capture_output=True,
                               text=True).stdout.split()
        steps = [s for s in steps if s.rsplit(".", 1)[-1].isdigit()]
        cur = (f.get("JobState"), f.get("Restarts"), f.get("NodeList"), tuple(steps))
        if cur != last:
            print(json.dumps({"ts": t, "state": cur[0], "restarts": int(cur[1] or 0), "nodes": cur[2],
                              "steps": steps, "reason": f.get("Reason")}), flush=True)
            last = cur
        if f.get("JobState") in ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT"):
            break
        time.sleep(0.2)
    """
)


class Case:
    """One training job on the lab and what happens to it around one fault."""

    def __init__(self, name: str, train_iters: int = 60) -> None:
        stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime())
        self.name = name
        self.run_rel = f"runs/faults/{stamp}-{name}"
        self.run_host = SHARED_HOST / self.run_rel
        self.run_node = f"/shared/{self.run_rel}"
        cfg = yaml.safe_load((ROOT / "configs" / "lab.yml").read_text())
        cfg["name"] = f"fault-{name}"
        cfg["train_iters"] = train_iters
        self.cfg = cfg
        conf_dir = SHARED_HOST / "ci"
        conf_dir.mkdir(parents=True, exist_ok=True)
        (conf_dir / f"faults-{name}.yml").write_text(yaml.safe_dump(cfg))
        p = _ctl(
            RUNNER, "render", "-i", SPEC, "-c", f"/shared/ci/faults-{name}.yml", "--run-dir", self.run_node
        )
        assert p.returncode == 0, p.stderr
        self.sbatch = f"{self.run_node}/train_2node.sbatch"
        assert "LCM_NODE_LOST_DOWN=1" in (self.run_host / "train_2node.sbatch").read_text()
        self.job = ""
        self.poller: subprocess.Popen[str] | None = None
        self.poll_log = self.run_host / "poller.jsonl"
        self.metrics: dict[str, Any] = {"case": name}

    def submit(self) -> str:
        p = _ctl("sbatch", "--parsable", self.sbatch)
        assert p.returncode == 0, p.stderr
        self.job = p.stdout.strip().split(";")[0]
        fh = self.poll_log.open("w")
        self.poller = subprocess.Popen(
            ["podman", "exec", CTL, "python3", "-c", _POLLER, self.job, "400"],
            stdout=fh,
            stderr=subprocess.DEVNULL,
            text=True,
        )
        return self.job

    def polled(self) -> list[dict[str, Any]]:
        return _jsonl(self.poll_log)

    def nodes(self) -> list[str]:
        for rec in reversed(self.polled()):
            if rec["state"] == "RUNNING" and rec["nodes"] not in (None, "", "(null)"):
                return _ctl("scontrol", "show", "hostnames", rec["nodes"]).stdout.split()
        return []

    def telemetry(self, rank: int = 0) -> list[dict[str, Any]]:
        recs = _jsonl(self.run_host / "telemetry" / f"rank{rank}.jsonl")
        return [r for r in recs if str(r.get("job")) == self.job]

    def agent_events(self, node_rank: int) -> list[dict[str, Any]]:
        return _jsonl(self.run_host / "agents" / self.job / f"node{node_rank}.jsonl")

    def wait_mid_run(self, timeout: float = 240) -> int:
        """Until the first checkpoint is complete and two more steps ran; returns that checkpoint step."""
        save = int(self.cfg["save_interval"])

        def ready() -> int | None:
            recs = self.telemetry()
            ck = [r["step"] for r in recs if r["event"] == "ckpt_end" and r["step"] >= save]
            st = [r["step"] for r in recs if r["event"] == "step"]
            if ck and st and max(st) >= min(ck) + 2 and max(st) < min(ck) + save - 3:
                return min(ck)
            if ck and st and max(st) >= min(ck) + save - 3:
                return -1  # too late for this window; the caller waits for none other
            return None

        got = _wait(ready, timeout, 0.1, f"job {self.job}: checkpoint {save} and two more steps")
        assert got > 0, "the run raced past the kill window (steps too fast?)"
        return got

    def last_ckpt_before(self, t: float) -> int:
        return max(r["step"] for r in self.telemetry() if r["event"] == "ckpt_end" and r["ts"] < t)

    def after_fault(self, t0: float, victim: str, survivors: list[str], spare: str) -> None:
        """The assertions both cases share; fills self.metrics."""
        m = self.metrics
        hb = float(self.cfg["hb_timeout_s"])

        def first_new_step() -> dict[str, Any] | None:
            recs = self.telemetry()
            resumed = [r for r in recs if r["event"] == "resume" and r["ts"] > t0]
            if not resumed:
                return None
            steps = [r for r in recs if r["event"] == "step" and r["ts"] > resumed[0]["ts"]]
            return {"resume": resumed[0], "step": steps[0]} if steps else None

        got = _wait(first_new_step, 180, 0.2, f"job {self.job}: the first step after the requeue")
        ev0 = self.agent_events(0)
        lost = [e for e in ev0 if e["event"] == "node_lost" and e["ts"] > t0]
        down = [e for e in ev0 if e["event"] == "node_down" and e["ts"] > t0]
        polled = self.polled()
        gone = [r for r in polled if r["ts"] > t0 and not r["steps"]]
        requeued = [r for r in polled if r["ts"] > t0 and r["restarts"] >= 1]
        running = [r for r in polled if r["ts"] > t0 and r["restarts"] >= 1 and r["state"] == "RUNNING"]
        m.update(
            job=self.job,
            victim=victim,
            detect_s=round(lost[0]["ts"] - t0, 2) if lost else None,
            node_down_s=round(down[0]["ts"] - t0, 2) if down else None,
            node_down=down[0] if down else None,
            step_ended_s=round(gone[0]["ts"] - t0, 2) if gone else None,
            requeue_s=round(requeued[0]["ts"] - t0, 2) if requeued else None,
            restarted_s=round(running[0]["ts"] - t0, 2) if running else None,
            first_new_step_s=round(got["step"]["ts"] - t0, 2),
            first_new_step=got["step"]["step"],
            resumed_from=got["resume"]["step"],
            last_ckpt=self.last_ckpt_before(t0),
        )
        print(json.dumps(m, indent=1))
        assert lost, f"no node_lost event of the survivor after the fault: {ev0[-5:]}"
        assert m["detect_s"] <= hb + HB_SLACK_S, m
        assert down and down[0]["action"] == "down" and down[0]["ok"], down
        assert down[0]["node"] == victim, down
        assert requeued and gone, polled
        assert m["first_new_step"] == m["last_ckpt"] + 1 == m["resumed_from"] + 1, m
        assert m["first_new_step_s"] <= FIRST_STEP_MAX_S, m
        new_nodes = self.nodes()
        m["nodes_after"] = new_nodes
        assert victim not in new_nodes and spare in new_nodes and set(survivors) <= set(new_nodes), new_nodes
        state, reason = _node_state(victim)
        m["victim_state"] = f"{state}: {reason}"
        assert state.startswith("down") and reason.startswith(nodefail.REASON_PREFIX), (state, reason)
        for s in survivors:  # the partitioned side could not reach the controller: nobody else is down
            assert not _node_state(s)[0].startswith(("down", "drain")), (s, _node_state(s))

    def wait_done(self, timeout: float = 300) -> None:
        def ended() -> str | None:
            states = [r["state"] for r in self.polled()]
            return states[-1] if states and states[-1] in ("COMPLETED", "FAILED", "CANCELLED") else None

        assert _wait(ended, timeout, 1, f"job {self.job} to end") == "COMPLETED"

    def close(self) -> None:
        if self.job:
            _ctl("scancel", self.job)
        if self.poller is not None:
            self.poller.terminate()
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.poller.wait(10)
        out = SHARED_HOST / "runs" / "faults" / f"{self.name}-{self.job}.json"
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(self.metrics, indent=1, default=str))


def _wait_idle(node: str, timeout: float) -> float:
    t0 = time.monotonic()
    _wait(lambda: _node_state(node)[0] == "idle", timeout, 0.5, f"{node} idle")
    return time.monotonic() - t0


def _compute_nodes() -> list[str]:
    return sorted(_ctl("sinfo", "-h", "-N", "-o", "%N").stdout.split())


@pytest.fixture(scope="module")
def lab() -> list[str]:
    def unavailable(why: str) -> None:
        if FORCED:
            pytest.fail(f"LCM_LAB=1 but {why}")
        pytest.skip(why)

    if not ((LAB / "READY").exists() or FORCED) or shutil.which("podman") is None:
        unavailable("the lab is not up (.lab/READY missing; LCM_LAB=1 forces)")
    if _ctl("sinfo", "-h").returncode != 0:
        unavailable("Slurm does not answer on the lab controller")
    if _ctl("test", "-x", RUNNER).returncode != 0:
        unavailable(f"{RUNNER} is not installed on {CTL} (playbooks/runner.yml)")
    nodes = sorted(set(_compute_nodes()))
    if len(nodes) < 3:
        unavailable(f"needs 3 compute nodes (a spare), the lab has {nodes} (LAB_COMPUTE_NODES=3)")
    for n in nodes:
        _wait(lambda n=n: _node_state(n)[0] == "idle", 120, 1, f"{n} idle before the test")
    return nodes


def _victim_and_spare(case: Case, nodes: list[str]) -> tuple[str, list[str], str]:
    running = _wait(case.nodes, 240, 0.5, f"job {case.job} running")
    assert len(running) == 2, running
    spare = next(n for n in nodes if n not in running)
    return running[1], [running[0]], spare  # node rank 1 (node 0 hosts the agents' store)


# ----------------------------------------------------------------------------- lab tests


@pytest.mark.lab
def test_node_killed_requeues_on_spare_and_node_returns(
    lab: list[str], matrix: Matrix, request: pytest.FixtureRequest
) -> None:
    case = Case("kill")
    victim = ""
    try:
        case.submit()
        victim, survivors, spare = _victim_and_spare(case, lab)
        case.wait_mid_run()
        t0 = time.time()
        p = _run(["podman", "kill", "--signal", "KILL", victim])
        assert p.returncode == 0, p.stderr
        case.after_fault(t0, victim, survivors, spare)
        case.wait_done()
        # the node comes back: container start -> systemd -> munge, slurmd (registers: ReturnToService=2)
        t2 = time.time()
        assert _run(["podman", "start", victim]).returncode == 0
        back = _wait_idle(victim, NODE_BACK_MAX_S + 30)
        case.metrics["start_to_idle_s"] = round(time.time() - t2, 2)
        assert _run(["podman", "exec", victim, "test", "-w", "/shared/checkpoints"]).returncode == 0
        assert back <= NODE_BACK_MAX_S, case.metrics
        m = case.metrics
        matrix.record(
            Row(
                fault="node killed (container SIGKILL), spare idle",
                injected=f"podman kill --signal KILL {victim} after checkpoint {m['last_ckpt']} + 2 steps",
                detected_s=m["detect_s"],
                recovered=True,
                downtime_s=m["first_new_step_s"],
                steps_lost=m["first_new_step"] - m["last_ckpt"] - 1,
                good_ckpts_lost=0,
                notes=f"marked DOWN {m['node_down_s']} s, step ended {m['step_ended_s']} s, requeued onto "
                f"{','.join(m['nodes_after'])}; podman start -> idle {m['start_to_idle_s']} s",
            ),
            request,
        )
        victim = ""
    finally:
        case.close()
        if victim:  # an assertion failed before the node was started again
            _run(["podman", "start", victim])


@pytest.mark.lab
def test_partition_requeues_and_node_returns_by_itself(
    lab: list[str], matrix: Matrix, request: pytest.FixtureRequest
) -> None:
    case = Case("partition", train_iters=120)
    victim, ip, mac, healed = "", "", "", True
    try:
        case.submit()
        victim, survivors, spare = _victim_and_spare(case, lab)
        ip, mac = _net_identity(victim)
        assert ip, "no IP of the victim on the lab network"
        case.wait_mid_run()
        t0 = time.time()
        healed = False
        p = _run(["podman", "network", "disconnect", NETWORK, victim])
        assert p.returncode == 0, p.stderr
        case.after_fault(t0, victim, survivors, spare)
        # the cut side (the node1.jsonl of the first run; the spare appends its own): its agent's store
        # calls block (no RST through a missing interface); the deadman ends it with 76 within the bound
        ev1 = case.agent_events(1)
        cut_pid = next(e["pid"] for e in ev1 if e["event"] == "ready")
        ev1 = [e for e in ev1 if e["pid"] == cut_pid and e["ts"] > t0]
        exits = _wait(
            lambda: [e for e in case.agent_events(1) if e["pid"] == cut_pid and e["event"] == "exit"],
            30,
            0.5,
            "the cut-off agent's exit",
        )
        case.metrics["cut_side_exit_s"] = round(exits[0]["ts"] - t0, 2)
        case.metrics["cut_side_events"] = [
            {k: e.get(k) for k in ("event", "action", "ok", "error", "code")} for e in ev1
        ]
        stopped = [e for e in ev1 if e["event"] == "teardown"]
        case.metrics["cut_side_ranks_stopped_s"] = round(stopped[0]["ts"] - t0, 2) if stopped else None
        # deadman 2 x hb_timeout_s after the last answered store call, then two 0.5 s probes
        assert exits[0]["code"] == 76 and exits[0]["ts"] - t0 <= 2 * float(case.cfg["hb_timeout_s"]) + 3
        time.sleep(max(0.0, t0 + PARTITION_S - time.time()))
        t1 = time.time()
        p = _run(reconnect_argv(victim, ip, mac))
        assert p.returncode == 0, p.stderr
        healed = True
        addr = _run(["podman", "exec", victim, "ip", "-br", "-4", "addr", "show", "eth0"]).stdout
        assert f"{ip}/" in addr, addr  # same address and interface name as before (inventory, NCCL ifname)
        back = _wait_idle(victim, NODE_BACK_MAX_S + 30)
        case.metrics["heal_to_idle_s"] = round(time.time() - t1, 2)
        assert back <= NODE_BACK_MAX_S, case.metrics
        # and jobs run on it again
        p = _ctl("srun", "-w", victim, "-N1", "-n1", "-t", "1", "hostname", timeout=90)
        assert p.returncode == 0 and p.stdout.strip() == victim, (p.stdout, p.stderr)
        case.wait_done()
        m = case.metrics
        matrix.record(
            Row(
                fault=f"network partition of a node ({PARTITION_S:.0f} s)",
                injected=f"podman network disconnect of {victim}, reconnected with its address",
                detected_s=m["detect_s"],
                recovered=True,
                downtime_s=m["first_new_step_s"],
                steps_lost=m["first_new_step"] - m["last_ckpt"] - 1,
                good_ckpts_lost=0,
                notes=f"marked DOWN {m['node_down_s']} s, requeued onto {','.join(m['nodes_after'])}; "
                f"cut side exit 76 after {m['cut_side_exit_s']} s; "
                f"network back -> idle {m['heal_to_idle_s']} s, srun on it ran",
            ),
            request,
        )
    finally:
        case.close()
        if victim and not healed:
            _run(reconnect_argv(victim, ip, mac) if ip else ["true"])


@pytest.mark.lab
def test_node_killed_without_spare_waits_and_resumes_when_it_returns(
    lab: list[str], matrix: Matrix, request: pytest.FixtureRequest
) -> None:
    """No idle spare (the third node drained for the test): the requeued job waits (the killed node is
    DOWN) and starts again, from the last checkpoint, once the node is back."""
    case = Case("kill-nospare")
    victim, held = "", ""
    try:
        case.submit()
        victim, survivors, spare = _victim_and_spare(case, lab)
        held = spare
        p = _ctl("scontrol", "update", f"NodeName={spare}", "State=DRAIN", "Reason=test: no spare")
        assert p.returncode == 0, p.stderr
        case.wait_mid_run()
        t0 = time.time()
        assert _run(["podman", "kill", "--signal", "KILL", victim]).returncode == 0
        time.sleep(20)  # requeued, and waiting: nothing to run on
        polled = [r for r in case.polled() if r["ts"] > t0]
        assert polled and polled[-1]["state"] == "PENDING" and polled[-1]["restarts"] >= 1, polled
        state, reason = _node_state(victim)
        assert state.startswith("down") and reason.startswith(nodefail.REASON_PREFIX), (state, reason)
        t2 = time.time()
        assert _run(["podman", "start", victim]).returncode == 0

        def resumed() -> dict[str, Any] | None:
            recs = case.telemetry()
            res = [r for r in recs if r["event"] == "resume" and r["ts"] > t2]
            steps = [r for r in recs if r["event"] == "step" and res and r["ts"] > res[0]["ts"]]
            return {"resume": res[0], "step": steps[0]} if steps else None

        got = _wait(resumed, 120, 0.5, "the first step after the node returned")
        case.metrics.update(
            job=case.job,
            victim=victim,
            start_to_first_step_s=round(got["step"]["ts"] - t2, 2),
            kill_to_first_step_s=round(got["step"]["ts"] - t0, 2),
            first_new_step=got["step"]["step"],
            last_ckpt=case.last_ckpt_before(t0),
            nodes_after=case.nodes(),
        )
        print(json.dumps(case.metrics, indent=1))
        assert got["step"]["step"] == case.last_ckpt_before(t0) + 1, case.metrics
        assert set(case.nodes()) == {victim, *survivors}, case.metrics
        m = case.metrics
        matrix.record(
            Row(
                fault="node killed, no spare",
                injected=f"podman kill --signal KILL {victim}, the third node drained; podman start later",
                detected_s=None,
                recovered=True,
                downtime_s=m["start_to_first_step_s"],
                steps_lost=m["first_new_step"] - m["last_ckpt"] - 1,
                good_ckpts_lost=0,
                notes="requeued job PENDING while the node was DOWN; downtime counted from podman start "
                f"(the node back) to the first new step {m['first_new_step']} = checkpoint + 1",
            ),
            request,
        )
        victim = ""
        case.wait_done()
    finally:
        case.close()
        if victim:
            _run(["podman", "start", victim])
        if held:
            _ctl("scontrol", "update", f"NodeName={held}", "State=RESUME")


# A dedicated checkpoint filesystem inside a lab node (never the host's disk): a tmpfs mounted in the node's
# mount namespace (`podman exec --privileged`: the node's own processes have no CAP_SYS_ADMIN), sized once
# the first checkpoint is written so that the second one cannot fit.
SMALL_FS = "/mnt/lcm-ckpt-small"
FULL_DISK_HOLD_AT = 15  # after checkpoint 10, before checkpoint 20


def _node(node: str, *argv: str, privileged: bool = False) -> subprocess.CompletedProcess[str]:
    return _run(["podman", "exec", *(["--privileged"] if privileged else []), node, *argv])


def _sacct_end(job: str) -> str | None:
    """ "State|ExitCode" of the job once it has ended (None while it is pending, running or requeued)."""
    out = _ctl("sacct", "-j", job, "-X", "-n", "-P", "-o", "State,ExitCode").stdout.strip()
    state = out.split("|")[0] if out else ""
    return (
        out if state and state not in ("PENDING", "RUNNING", "REQUEUED", "COMPLETING", "RESIZING") else None
    )


@pytest.mark.lab
def test_full_checkpoint_filesystem_on_a_node_fails_the_save_and_the_requeue_resumes(
    matrix: Matrix, request: pytest.FixtureRequest
) -> None:
    """A one-node Slurm job (2 ranks) whose --save is a small tmpfs inside lab-node1 fills it during its
    second save: the ranks exit 80 (CKPT_SAVE_FAILED) with the cause in one line, the agent passes it on and
    the batch script does not requeue (a restart would fail the same way); sacct records 80; `latest` stays
    on the first checkpoint, which still verifies, and the partial one is gone. Space freed (the tmpfs
    grown, as an operator would), `scontrol requeue` resumes it from that checkpoint to the end."""
    if not ((LAB / "READY").exists() or FORCED) or shutil.which("podman") is None:
        pytest.skip("the lab is not up (.lab/READY missing; LCM_LAB=1 forces)")
    node = "lab-node1"
    _wait(lambda: _node_state(node)[0] == "idle", 120, 1, f"{node} idle before the test")
    case = Case("fulldisk")
    cfg = case.cfg
    cfg.update(nodes=1, name="fault-fulldisk")
    cfg["model"] = {**cfg["model"], "pp": 1}  # 2 ranks on one node: EP=2
    cfg["fault"] = {**cfg.get("fault", {}), "kill_node": 0}  # (the stages' drill; unused here)
    (SHARED_HOST / "ci" / "faults-fulldisk.yml").write_text(yaml.safe_dump(cfg))
    p = _ctl(RUNNER, "render", "-i", SPEC, "-c", "/shared/ci/faults-fulldisk.yml", "--run-dir", case.run_node)
    assert p.returncode == 0, p.stderr
    sbatch = case.run_host / "train_2node.sbatch"
    text = sbatch.read_text()
    hold = case.run_host / "hold"
    ckpt = f"{SMALL_FS}/checkpoints"
    for old, new in (
        (f"--save {case.run_node}/checkpoints", f"--save {ckpt}"),
        (f"--load {case.run_node}/checkpoints", f"--load {ckpt}"),
        (
            "--save-interval 10 \\\n",
            f"--save-interval 10 \\\n    --fault-hold-at-step {FULL_DISK_HOLD_AT} \\\n"
            f"    --fault-hold-file {case.run_node}/hold \\\n",
        ),
    ):
        assert old in text, old
        text = text.replace(old, new)
    sbatch.write_text(text)
    hold.write_text("held until the checkpoint filesystem is shrunk\n")
    mounted = False
    try:
        _node(node, "mkdir", "-p", SMALL_FS)
        p = _node(node, "mount", "-t", "tmpfs", "-o", "size=64m", "tmpfs", SMALL_FS, privileged=True)
        assert p.returncode == 0, p.stderr
        mounted = True
        p = _ctl("sbatch", "--parsable", f"--nodelist={node}", case.sbatch)
        assert p.returncode == 0, p.stderr
        case.job = p.stdout.strip().split(";")[0]

        def held() -> bool:
            recs = case.telemetry()
            return any(r["event"] == "ckpt_end" and r["step"] == 10 for r in recs) and any(
                r["event"] == "step" and r["step"] == FULL_DISK_HOLD_AT - 1 for r in recs
            )

        _wait(held, 240, 0.5, f"job {case.job}: checkpoint 10 written, held before step {FULL_DISK_HOLD_AT}")
        used_kb = int(_node(node, "du", "-sk", SMALL_FS).stdout.split()[0])
        size_kb = used_kb + used_kb // 2  # room for half a checkpoint more
        p = _node(node, "mount", "-o", f"remount,size={size_kb}k", SMALL_FS, privileged=True)
        assert p.returncode == 0, p.stderr
        hold.unlink()
        final = _wait(lambda: _sacct_end(case.job), 240, 1, f"job {case.job} to end")
        assert final == "FAILED|80:0", final
        recs = case.telemetry()
        failed = [r for r in recs if r["event"] == "ckpt_failed"]
        begin = [r for r in recs if r["event"] == "ckpt_begin" and r["step"] == 20]
        assert failed and failed[0]["step"] == 20 and begin, recs[-5:]
        logs = sorted((case.run_host / "logs" / case.job).glob("rank*.log"))
        ranks = "\n".join(f.read_text(errors="replace") for f in logs)
        cause = ("No space left on device", "latest stays at step 10")
        line = next((ln for ln in ranks.splitlines() if all(c in ln for c in cause)), "")
        assert line, ranks[-3000:]
        batch = (case.run_host / "logs" / f"slurm-{case.job}.out").read_text(errors="replace")
        assert "agents finished: exit 80" in batch and "requeue:" not in batch, batch[-2000:]
        listing = _node(node, "ls", ckpt).stdout.split()
        assert _node(node, "cat", f"{ckpt}/latest_checkpointed_iteration.txt").stdout.strip() == "10"
        assert [d for d in listing if d.startswith("iter_")] == ["iter_0000010"], listing
        verify = _node(node, "/opt/lcm/venv/bin/lcm-runner", "ckpt", "verify", ckpt)
        assert verify.returncode == 0 and "iter_0000010" in verify.stdout and "verified" in verify.stdout, (
            verify.stdout + verify.stderr
        )
        # an operator frees space, then requeues the job: it resumes from 10 and finishes
        p = _node(node, "mount", "-o", "remount,size=64m", SMALL_FS, privileged=True)
        assert p.returncode == 0, p.stderr
        t_free = time.time()
        p = _ctl("scontrol", "requeue", case.job)
        assert p.returncode == 0, p.stderr
        again = _wait(lambda: _sacct_end(case.job), 300, 1, f"the requeued job {case.job} to end")
        assert again == "COMPLETED|0:0", again
        after = [r for r in case.telemetry() if r["ts"] > t_free]
        resumed = [r["step"] for r in after if r["event"] == "resume"]
        first = min((r["step"] for r in after if r["event"] == "step"), default=None)
        assert resumed and set(resumed) == {10} and first == 11, (resumed, first)
        assert _node(node, "cat", f"{ckpt}/latest_checkpointed_iteration.txt").stdout.strip() == str(
            cfg["train_iters"]
        )
        case.metrics.update(
            job=case.job,
            node=node,
            fs_kb=size_kb,
            first_ckpt_kb=used_kb,
            detected_s=round(failed[0]["ts"] - begin[0]["ts"], 2),
            line=line.strip()[-300:],
            requeue_to_first_step_s=round(next(r["ts"] for r in after if r["event"] == "step") - t_free, 2),
        )
        print(json.dumps(case.metrics, indent=1))
        m = case.metrics
        matrix.record(
            Row(
                fault="checkpoint filesystem full during a save, inside a lab node (Slurm job)",
                injected=f"tmpfs inside {node} as --save, shrunk to {size_kb} KiB after the first checkpoint "
                f"({used_kb} KiB): the second save cannot fit",
                detected_s=m["detected_s"],
                recovered=True,
                downtime_s=None,
                steps_lost=0,
                good_ckpts_lost=0,
                notes=f"job FAILED 80:0 in sacct (the batch script did not requeue it); latest stayed 10 and "
                f"verifies, no partial left; space freed, `scontrol requeue` resumed from 10 (first step 11 "
                f"{m['requeue_to_first_step_s']} s after) and COMPLETED",
            ),
            request,
        )
    finally:
        hold.unlink(missing_ok=True)
        case.close()
        if mounted:
            _node(node, "umount", "-l", SMALL_FS, privileged=True)


# ----------------------------------------------------------------------------- no lab needed


class _Fake:
    def __init__(self, hosts: str = "lab-node1 lab-node2", rc: int = 0) -> None:
        self.calls: list[list[str]] = []
        self.hosts = hosts
        self.rc = rc

    def __call__(self, argv: list[str], timeout: float) -> subprocess.CompletedProcess[str]:
        self.calls.append(argv)
        if argv[:3] == ["scontrol", "show", "hostnames"]:
            return subprocess.CompletedProcess(argv, 0, self.hosts + "\n", "")
        return subprocess.CompletedProcess(argv, self.rc, "", "denied" if self.rc else "")


_ENV = {
    "LCM_NODE_LOST_DOWN": "1",
    "SLURM_JOB_ID": "42",
    "SLURM_JOB_NODELIST": "lab-node[1-2]",
    "SLURMD_NODENAME": "lab-node1",
}


def _ctld(_conf: str | None) -> tuple[str, int]:
    return ("lab-ctl", 6817)


def test_nodefail_marks_a_silent_node_down_with_the_lcm_reason() -> None:
    run = _Fake()
    probed: list[tuple[str, int]] = []

    def probe(host: str, port: int, _t: float) -> bool:
        probed.append((host, port))
        return host == "lab-ctl"  # the controller answers, the lost node does not

    out = nodefail.mark_lost(
        1, "node1 heartbeat stopped 3.2s ago", env=_ENV, run=run, probe=probe, controller=_ctld
    )
    assert probed == [("lab-node2", 6818), ("lab-ctl", 6817)]
    assert out is not None and out["action"] == "down" and out["ok"] and out["node"] == "lab-node2"
    update = run.calls[-1]
    assert update[:4] == ["scontrol", "update", "NodeName=lab-node2", "State=DOWN"]
    assert update[4].startswith("Reason=lcm: agent heartbeat lost: node1 heartbeat stopped")
    assert "job 42" in update[4] and "seen by lab-node1" in update[4]


def test_nodefail_leaves_alive_nodes_itself_and_non_slurm_runs_alone() -> None:
    run = _Fake()
    assert nodefail.mark_lost(1, "x", env={**_ENV, "LCM_NODE_LOST_DOWN": "0"}, run=run) is None
    assert nodefail.mark_lost(1, "x", env={"LCM_NODE_LOST_DOWN": "1"}, run=run) is None
    alive = nodefail.mark_lost(1, "x", env=_ENV, run=run, probe=lambda *a: True)
    assert alive is not None and alive["action"] == "alive"
    me = nodefail.mark_lost(0, "x", env=_ENV, run=run, probe=lambda *a: False)
    assert me is not None and me["action"] == "self"
    assert not [c for c in run.calls if c[:2] == ["scontrol", "update"]]


def test_nodefail_records_a_refused_update_and_never_raises() -> None:
    out = nodefail.mark_lost(
        1, "x", env=_ENV, run=_Fake(rc=1), probe=lambda *a: False, controller=lambda _: None
    )
    assert out is not None and out["action"] == "down" and not out["ok"] and "denied" in out["error"]
    out = nodefail.mark_lost(5, "x", env=_ENV, run=_Fake(), probe=lambda *a: False)
    assert out is not None and out["action"] == "error" and "node rank 5" in out["error"]


def test_nodefail_on_the_cut_off_side_tells_nobody(tmp_path: Path) -> None:
    run = _Fake()
    out = nodefail.mark_lost(1, "x", env=_ENV, run=run, probe=lambda *a: False, controller=_ctld)
    assert out is not None and out["action"] == "isolated" and out["controller"] == "lab-ctl:6817"
    assert not [c for c in run.calls if c[:2] == ["scontrol", "update"]]
    conf = tmp_path / "slurm.conf"
    conf.write_text("ClusterName=lab\nSlurmctldHost=lab-ctl(10.89.42.10)  # ctl\nSlurmctldPort=6817\n")
    assert nodefail.controller_addr(str(conf)) == ("10.89.42.10", 6817)
    conf.write_text("SlurmctldHost=ctl\nSlurmctldHost=backup\n")
    assert nodefail.controller_addr(str(conf)) == ("ctl", 6817)
    assert nodefail.controller_addr(str(tmp_path / "missing")) is None


def test_deadman_fires_only_when_armed_and_silent() -> None:
    fired: list[float] = []
    dm = nodefail.Deadman(0.3, fired.append, tick_s=0.02).start()
    time.sleep(0.5)
    assert not fired  # not armed
    dm.arm()
    for _ in range(10):
        dm.beat()
        time.sleep(0.05)
    assert not fired  # beaten
    time.sleep(0.6)
    assert fired and fired[0] >= 0.3
    dm.stop()


def _watchdog(
    tmp_path: Path, sinfo_line: str, healthy: bool = True, slurmd: bool = True, slurmd_age: int = 3600
) -> str:
    """Run the node watchdog once against fake sinfo/scontrol/systemctl; returns the calls made."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    log = tmp_path / "calls"
    for name, body in (
        ("sinfo", f"echo \"$0 $*\" >> {log}; echo '{sinfo_line}'"),
        ("scontrol", f'echo "$0 $*" >> {log}'),
        (
            "systemctl",
            # `show ... ActiveEnterTimestampMonotonic`: slurmd became active slurmd_age s ago
            f'[[ "$1" == show ]] && {{ up=$(cut -d. -f1 /proc/uptime); '
            f"echo $(((up - {slurmd_age}) * 1000000)); exit 0; }}; exit {0 if slurmd else 3}",
        ),
    ):
        f = bin_dir / name
        f.write_text(f"#!/bin/bash\n{body}\n")
        f.chmod(0o755)
    hc = tmp_path / "hc.sh"
    hc.write_text(f"#!/bin/bash\nexit {0 if healthy else 1}\n")
    hc.chmod(0o755)
    conf = tmp_path / "wd.conf"
    conf.write_text(f"LCM_WD_HOLDDOWN_S=20\nLCM_WD_NODE=lab-node2\nLCM_WD_HEALTHCHECK={hc}\n")
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}"}
    p = subprocess.run(
        ["bash", str(WATCHDOG), "--once", str(conf)], env=env, capture_output=True, text=True, timeout=30
    )
    assert p.returncode == 0, p.stderr
    return (log.read_text() if log.exists() else "") + p.stdout


def _ago(s: int) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(time.time() - s))


@pytest.mark.skipif(sys.platform != "linux", reason="GNU date and bash")
def test_watchdog_resumes_lcm_down_and_not_responding_nodes(tmp_path: Path) -> None:
    (tmp_path / "a").mkdir()
    out = _watchdog(tmp_path / "a", f"down*|{_ago(30)}|lcm: agent heartbeat lost: node1 ...")
    assert "update NodeName=lab-node2 State=RESUME" in out and "resumed lab-node2" in out
    (tmp_path / "b").mkdir()
    assert "State=RESUME" in _watchdog(tmp_path / "b", f"down*|{_ago(1)}|Not responding")


@pytest.mark.skipif(sys.platform != "linux", reason="GNU date and bash")
@pytest.mark.parametrize(
    ("state", "age", "reason", "healthy", "slurmd"),
    [
        ("down*", 5, "lcm: agent heartbeat lost (too recent: hold-down)", True, True),
        ("down", 300, "maintenance by an admin", True, True),
        ("drained", 300, "lcm: agent heartbeat lost", True, True),
        ("idle", 300, "none", True, True),
        ("down*", 300, "Not responding", False, True),
        ("down*", 300, "Not responding", True, False),
        ("down*", 300, "Not responding", True, "just started"),  # slurmd registers by itself
    ],
)
def test_watchdog_leaves_other_nodes_alone(
    tmp_path: Path, state: str, age: int, reason: str, healthy: bool, slurmd: bool | str
) -> None:
    line = f"{state}|{_ago(age)}|{reason}"
    out = _watchdog(tmp_path, line, healthy, bool(slurmd), slurmd_age=2 if slurmd == "just started" else 3600)
    assert "State=RESUME" not in out
