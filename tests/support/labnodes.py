"""The lab's node faults, shared by tests/faults/test_node_faults.py (one fault per job) and
tests/faults/test_mixed_faults_slurm.py (ten in one job): podman and Slurm helpers run from the host, and
`Case`, one training job on the lab followed through a fault (a poller inside lab-ctl records the job's
state, restart count, nodes and steps every 0.2 s).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

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

HB_SLACK_S = 2.5  # detection <= hb_timeout_s + one heartbeat interval + the store poll, on a busy host
FIRST_STEP_MAX_S = 30.0  # node gone -> first new step of the requeued job
NODE_BACK_MAX_S = 60.0  # node reachable again -> idle in Slurm


# ----------------------------------------------------------------------------- helpers


def run(argv: list[str], timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False)


def net_identity(node: str) -> tuple[str, str]:
    """The node's address and MAC on the lab network: a reconnect keeps both, as a re-plugged cable
    does (a new MAC would leave the peers' neighbour caches pointing at the old one: seconds of stalls
    on the first connections, which real nodes do not see)."""
    fmt = '{{(index .NetworkSettings.Networks "' + NETWORK + '").IPAddress}}|'
    fmt += '{{(index .NetworkSettings.Networks "' + NETWORK + '").MacAddress}}'
    ip, _, mac = run(["podman", "inspect", node, "--format", fmt]).stdout.strip().partition("|")
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


def ctl(*argv: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return run(["podman", "exec", CTL, *argv], timeout)


def node_state(node: str) -> tuple[str, str]:
    out = ctl("sinfo", "-h", "-N", "-n", node, "-o", "%T|%E").stdout.strip().splitlines()
    state, _, reason = (out[0] if out else "|").partition("|")
    return state, reason


def wait(pred: Any, timeout: float, every: float = 0.5, what: str = "") -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = pred()
        if got:
            return got
        time.sleep(every)
    raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}")


def jsonl(path: Path) -> list[dict[str, Any]]:
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
POLLER = textwrap.dedent(
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
    """One training job on the lab (configs/lab.yml, `overrides` applied) and what happens to it around a
    fault; step_sleep_ms paces its steps (lcm-runner render --step-sleep-ms), poll_s bounds the poller."""

    def __init__(
        self,
        name: str,
        train_iters: int = 60,
        overrides: dict[str, Any] | None = None,
        step_sleep_ms: int = 0,
        poll_s: float = 400,
    ) -> None:
        stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime())
        self.name = name
        self.run_rel = f"runs/faults/{stamp}-{name}"
        self.run_host = SHARED_HOST / self.run_rel
        self.run_node = f"/shared/{self.run_rel}"
        cfg = yaml.safe_load((ROOT / "configs" / "lab.yml").read_text())
        cfg["name"] = f"fault-{name}"
        cfg["train_iters"] = train_iters
        cfg.update(overrides or {})
        self.cfg = cfg
        self.poll_s = poll_s
        conf_dir = SHARED_HOST / "ci"
        conf_dir.mkdir(parents=True, exist_ok=True)
        (conf_dir / f"faults-{name}.yml").write_text(yaml.safe_dump(cfg))
        pace = ["--step-sleep-ms", str(step_sleep_ms)] if step_sleep_ms else []
        p = ctl(
            RUNNER,
            "render",
            "-i",
            SPEC,
            "-c",
            f"/shared/ci/faults-{name}.yml",
            "--run-dir",
            self.run_node,
            *pace,
        )
        assert p.returncode == 0, p.stderr
        self.sbatch = f"{self.run_node}/train_2node.sbatch"
        assert "LCM_NODE_LOST_DOWN=1" in (self.run_host / "train_2node.sbatch").read_text()
        self.job = ""
        self.poller: subprocess.Popen[str] | None = None
        self.poll_log = self.run_host / "poller.jsonl"
        self.metrics: dict[str, Any] = {"case": name}

    def submit(self) -> str:
        p = ctl("sbatch", "--parsable", self.sbatch)
        assert p.returncode == 0, p.stderr
        self.job = p.stdout.strip().split(";")[0]
        fh = self.poll_log.open("w")
        self.poller = subprocess.Popen(
            ["podman", "exec", CTL, "python3", "-c", POLLER, self.job, str(self.poll_s)],
            stdout=fh,
            stderr=subprocess.DEVNULL,
            text=True,
        )
        return self.job

    def polled(self) -> list[dict[str, Any]]:
        return jsonl(self.poll_log)

    def nodes(self) -> list[str]:
        for rec in reversed(self.polled()):
            if rec["state"] == "RUNNING" and rec["nodes"] not in (None, "", "(null)"):
                return ctl("scontrol", "show", "hostnames", rec["nodes"]).stdout.split()
        return []

    def telemetry(self, rank: int = 0) -> list[dict[str, Any]]:
        recs = jsonl(self.run_host / "telemetry" / f"rank{rank}.jsonl")
        return [r for r in recs if str(r.get("job")) == self.job]

    def agent_events(self, node_rank: int) -> list[dict[str, Any]]:
        return jsonl(self.run_host / "agents" / self.job / f"node{node_rank}.jsonl")

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

        got = wait(ready, timeout, 0.1, f"job {self.job}: checkpoint {save} and two more steps")
        assert got > 0, "the run raced past the kill window (steps too fast?)"
        return got

    def last_ckpt_before(self, t: float) -> int:
        """The newest checkpoint complete before t: its ckpt_end record, or on disk its completeness marker
        (a node killed between writing `latest` and its ckpt_end record leaves a complete checkpoint
        without the record: resuming from it is right, and counts as such)."""
        logged = [r["step"] for r in self.telemetry() if r["event"] == "ckpt_end" and r["ts"] < t]
        marked = [
            int(p.parent.name.removeprefix("iter_"))
            for p in (self.run_host / "checkpoints").glob("iter_*/lcm_complete.json")
            if p.stat().st_mtime < t
        ]
        return max(logged + marked)

    def after_fault(
        self,
        t0: float,
        victim: str,
        survivors: list[str],
        spare: str,
        survivor_rank: int = 0,
        restarts_before: int = 0,
        injected: float | None = None,
        first_step_max_s: float = FIRST_STEP_MAX_S,
        detect_max_s: float | None = None,
    ) -> None:
        """The assertions every node-loss case shares; fills self.metrics. survivor_rank: the node rank
        (SLURM_NODEID) of the survivor whose agent reports the loss; restarts_before: the job's Slurm
        restart count before the fault (a job that already survived faults); injected: when the injecting
        command returned (default t0): a checkpoint completed before then is the one to resume from;
        first_step_max_s: the bound on fault -> first new step; detect_max_s: on detection (default
        hb_timeout_s + HB_SLACK_S)."""
        m = self.metrics
        hb = float(self.cfg["hb_timeout_s"])

        def first_new_step() -> dict[str, Any] | None:
            recs = self.telemetry()
            resumed = [r for r in recs if r["event"] == "resume" and r["ts"] > t0]
            if not resumed:
                return None
            steps = [r for r in recs if r["event"] == "step" and r["ts"] > resumed[0]["ts"]]
            return {"resume": resumed[0], "step": steps[0]} if steps else None

        got = wait(first_new_step, 180, 0.2, f"job {self.job}: the first step after the requeue")
        ev0 = self.agent_events(survivor_rank)
        # a peer's heartbeat gone (node_lost), or the store on node 0 gone with its node (store_error)
        lost = [e for e in ev0 if e["event"] in ("node_lost", "store_error") and e["ts"] > t0]
        down = [e for e in ev0 if e["event"] == "node_down" and e["ts"] > t0]
        polled = self.polled()
        gone = [r for r in polled if r["ts"] > t0 and not r["steps"]]
        requeued = [r for r in polled if r["ts"] > t0 and r["restarts"] > restarts_before]
        running = [
            r for r in polled if r["ts"] > t0 and r["restarts"] > restarts_before and r["state"] == "RUNNING"
        ]
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
            last_ckpt=self.last_ckpt_before(injected or t0),
        )
        print(json.dumps(m, indent=1))
        assert lost, f"no node_lost event of the survivor after the fault: {ev0[-5:]}"
        assert m["detect_s"] <= (hb + HB_SLACK_S if detect_max_s is None else detect_max_s), m
        assert down and down[0]["action"] == "down" and down[0]["ok"], down
        assert down[0]["node"] == victim, down
        assert requeued and gone, polled
        assert m["first_new_step"] == m["last_ckpt"] + 1 == m["resumed_from"] + 1, m
        assert m["first_new_step_s"] <= first_step_max_s, m
        new_nodes = self.nodes()
        m["nodes_after"] = new_nodes
        assert victim not in new_nodes and spare in new_nodes and set(survivors) <= set(new_nodes), new_nodes
        state, reason = node_state(victim)
        m["victim_state"] = f"{state}: {reason}"
        assert state.startswith("down") and reason.startswith(nodefail.REASON_PREFIX), (state, reason)
        for s in survivors:  # the partitioned side could not reach the controller: nobody else is down
            assert not node_state(s)[0].startswith(("down", "drain")), (s, node_state(s))

    def wait_done(self, timeout: float = 300) -> None:
        def ended() -> str | None:
            states = [r["state"] for r in self.polled()]
            return states[-1] if states and states[-1] in ("COMPLETED", "FAILED", "CANCELLED") else None

        assert wait(ended, timeout, 1, f"job {self.job} to end") == "COMPLETED"

    def close(self) -> None:
        if self.job:
            ctl("scancel", self.job)
        if self.poller is not None:
            self.poller.terminate()
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.poller.wait(10)
        out = SHARED_HOST / "runs" / "faults" / f"{self.name}-{self.job}.json"
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(self.metrics, indent=1, default=str))


def wait_idle(node: str, timeout: float) -> float:
    t0 = time.monotonic()
    wait(lambda: node_state(node)[0] == "idle", timeout, 0.5, f"{node} idle")
    return time.monotonic() - t0


def compute_nodes() -> list[str]:
    return sorted(ctl("sinfo", "-h", "-N", "-o", "%N").stdout.split())


def lab_nodes(minimum: int = 3) -> list[str]:
    """The lab's compute nodes, all idle; skips (fails with LCM_LAB=1) without a lab of `minimum` nodes."""

    def unavailable(why: str) -> None:
        if FORCED:
            pytest.fail(f"LCM_LAB=1 but {why}")
        pytest.skip(why)

    if not ((LAB / "READY").exists() or FORCED) or shutil.which("podman") is None:
        unavailable("the lab is not up (.lab/READY missing; LCM_LAB=1 forces)")
    if ctl("sinfo", "-h").returncode != 0:
        unavailable("Slurm does not answer on the lab controller")
    if ctl("test", "-x", RUNNER).returncode != 0:
        unavailable(f"{RUNNER} is not installed on {CTL} (playbooks/runner.yml)")
    nodes = sorted(set(compute_nodes()))
    if len(nodes) < minimum:
        spare = f" (a spare: LAB_COMPUTE_NODES={minimum})" if minimum > 2 else ""
        unavailable(f"needs {minimum} compute nodes{spare}, the lab has {nodes}")
    for n in nodes:
        wait(lambda n=n: node_state(n)[0] == "idle", 120, 1, f"{n} idle before the test")
    return nodes


def victim_and_spare(case: Case, nodes: list[str], node_rank: int = 1) -> tuple[str, list[str], str]:
    """The job's node of node_rank (default 1: node 0 also hosts the batch script, srun and the agents'
    store), the other node of the job, and an idle spare."""
    running = wait(case.nodes, 240, 0.5, f"job {case.job} running")
    assert len(running) == 2, running
    spare = next(n for n in nodes if n not in running)
    return running[node_rank], [running[1 - node_rank]], spare
