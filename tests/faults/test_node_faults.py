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

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import yaml
from faultmatrix import Matrix, Row
from labnodes import (
    FORCED,
    LAB,
    NETWORK,
    NODE_BACK_MAX_S,
    PARTITION_S,
    RUNNER,
    SHARED_HOST,
    SPEC,
    Case,
    ctl,
    lab_nodes,
    net_identity,
    node_state,
    reconnect_argv,
    run,
    victim_and_spare,
    wait,
    wait_idle,
)

from lcm_runner.launch import nodefail

WATCHDOG = Path(__file__).resolve().parents[2] / "roles" / "slurm" / "files" / "lcm-node-watchdog.sh"


@pytest.fixture(scope="module")
def lab() -> list[str]:
    return lab_nodes(3)


# ----------------------------------------------------------------------------- lab tests


@pytest.mark.lab
@pytest.mark.parametrize("node_rank", [1, 0], ids=["node1", "node0"])
def test_node_killed_requeues_on_spare_and_node_returns(
    lab: list[str], matrix: Matrix, request: pytest.FixtureRequest, node_rank: int
) -> None:
    """node_rank 1: a node that runs trainer ranks only; node_rank 0: the job's first node, which also runs
    the batch script, srun and the agents' store (the survivor, node rank 1, sees the store go)."""
    case = Case("kill" if node_rank else "kill-node0")
    victim = ""
    try:
        case.submit()
        victim, survivors, spare = victim_and_spare(case, lab, node_rank)
        case.wait_mid_run()
        t0 = time.time()
        p = run(["podman", "kill", "--signal", "KILL", victim])
        assert p.returncode == 0, p.stderr
        case.after_fault(t0, victim, survivors, spare, survivor_rank=1 - node_rank)
        case.wait_done()
        # the node comes back: container start -> systemd -> munge, slurmd (registers: ReturnToService=2)
        t2 = time.time()
        assert run(["podman", "start", victim]).returncode == 0
        back = wait_idle(victim, NODE_BACK_MAX_S + 30)
        case.metrics["start_to_idle_s"] = round(time.time() - t2, 2)
        assert run(["podman", "exec", victim, "test", "-w", "/shared/checkpoints"]).returncode == 0
        assert back <= NODE_BACK_MAX_S, case.metrics
        m = case.metrics
        matrix.record(
            Row(
                fault="node killed (container SIGKILL), spare idle"
                + ("" if node_rank else ": node 0 (batch script, srun, store)"),
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
            run(["podman", "start", victim])


@pytest.mark.lab
def test_partition_requeues_and_node_returns_by_itself(
    lab: list[str], matrix: Matrix, request: pytest.FixtureRequest
) -> None:
    case = Case("partition", train_iters=120)
    victim, ip, mac, healed = "", "", "", True
    try:
        case.submit()
        victim, survivors, spare = victim_and_spare(case, lab)
        ip, mac = net_identity(victim)
        assert ip, "no IP of the victim on the lab network"
        case.wait_mid_run()
        t0 = time.time()
        healed = False
        p = run(["podman", "network", "disconnect", NETWORK, victim])
        assert p.returncode == 0, p.stderr
        case.after_fault(t0, victim, survivors, spare)
        # the cut side (the node1.jsonl of the first run; the spare appends its own): its agent's store
        # calls block (no RST through a missing interface); the deadman ends it with 76 within the bound
        ev1 = case.agent_events(1)
        cut_pid = next(e["pid"] for e in ev1 if e["event"] == "ready")
        ev1 = [e for e in ev1 if e["pid"] == cut_pid and e["ts"] > t0]
        exits = wait(
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
        p = run(reconnect_argv(victim, ip, mac))
        assert p.returncode == 0, p.stderr
        healed = True
        addr = run(["podman", "exec", victim, "ip", "-br", "-4", "addr", "show", "eth0"]).stdout
        assert f"{ip}/" in addr, addr  # same address and interface name as before (inventory, NCCL ifname)
        back = wait_idle(victim, NODE_BACK_MAX_S + 30)
        case.metrics["heal_to_idle_s"] = round(time.time() - t1, 2)
        assert back <= NODE_BACK_MAX_S, case.metrics
        # and jobs run on it again
        p = ctl("srun", "-w", victim, "-N1", "-n1", "-t", "1", "hostname", timeout=90)
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
            run(reconnect_argv(victim, ip, mac) if ip else ["true"])


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
        victim, survivors, spare = victim_and_spare(case, lab)
        held = spare
        p = ctl("scontrol", "update", f"NodeName={spare}", "State=DRAIN", "Reason=test: no spare")
        assert p.returncode == 0, p.stderr
        case.wait_mid_run()
        t0 = time.time()
        assert run(["podman", "kill", "--signal", "KILL", victim]).returncode == 0
        time.sleep(20)  # requeued, and waiting: nothing to run on
        polled = [r for r in case.polled() if r["ts"] > t0]
        assert polled and polled[-1]["state"] == "PENDING" and polled[-1]["restarts"] >= 1, polled
        state, reason = node_state(victim)
        assert state.startswith("down") and reason.startswith(nodefail.REASON_PREFIX), (state, reason)
        t2 = time.time()
        assert run(["podman", "start", victim]).returncode == 0

        def resumed() -> dict[str, Any] | None:
            recs = case.telemetry()
            res = [r for r in recs if r["event"] == "resume" and r["ts"] > t2]
            steps = [r for r in recs if r["event"] == "step" and res and r["ts"] > res[0]["ts"]]
            return {"resume": res[0], "step": steps[0]} if steps else None

        got = wait(resumed, 120, 0.5, "the first step after the node returned")
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
            run(["podman", "start", victim])
        if held:
            ctl("scontrol", "update", f"NodeName={held}", "State=RESUME")


# A dedicated checkpoint filesystem inside a lab node (never the host's disk): a tmpfs mounted in the node's
# mount namespace (`podman exec --privileged`: the node's own processes have no CAP_SYS_ADMIN), sized once
# the first checkpoint is written so that the second one cannot fit.
SMALL_FS = "/mnt/lcm-ckpt-small"
FULL_DISK_HOLD_AT = 15  # after checkpoint 10, before checkpoint 20


def _node(node: str, *argv: str, privileged: bool = False) -> subprocess.CompletedProcess[str]:
    return run(["podman", "exec", *(["--privileged"] if privileged else []), node, *argv])


def _sacct_end(job: str) -> str | None:
    """ "State|ExitCode" of the job once it has ended (None while it is pending, running or requeued)."""
    out = ctl("sacct", "-j", job, "-X", "-n", "-P", "-o", "State,ExitCode").stdout.strip()
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
    wait(lambda: node_state(node)[0] == "idle", 120, 1, f"{node} idle before the test")
    case = Case("fulldisk")
    cfg = case.cfg
    cfg.update(nodes=1, name="fault-fulldisk")
    cfg["model"] = {**cfg["model"], "pp": 1}  # 2 ranks on one node: EP=2
    cfg["fault"] = {**cfg.get("fault", {}), "kill_node": 0}  # (the stages' drill; unused here)
    (SHARED_HOST / "ci" / "faults-fulldisk.yml").write_text(yaml.safe_dump(cfg))
    p = ctl(RUNNER, "render", "-i", SPEC, "-c", "/shared/ci/faults-fulldisk.yml", "--run-dir", case.run_node)
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
        p = ctl("sbatch", "--parsable", f"--nodelist={node}", case.sbatch)
        assert p.returncode == 0, p.stderr
        case.job = p.stdout.strip().split(";")[0]

        def held() -> bool:
            recs = case.telemetry()
            return any(r["event"] == "ckpt_end" and r["step"] == 10 for r in recs) and any(
                r["event"] == "step" and r["step"] == FULL_DISK_HOLD_AT - 1 for r in recs
            )

        wait(held, 240, 0.5, f"job {case.job}: checkpoint 10 written, held before step {FULL_DISK_HOLD_AT}")
        used_kb = int(_node(node, "du", "-sk", SMALL_FS).stdout.split()[0])
        size_kb = used_kb + used_kb // 2  # room for half a checkpoint more
        p = _node(node, "mount", "-o", f"remount,size={size_kb}k", SMALL_FS, privileged=True)
        assert p.returncode == 0, p.stderr
        hold.unlink()
        final = wait(lambda: _sacct_end(case.job), 240, 1, f"job {case.job} to end")
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
        p = ctl("scontrol", "requeue", case.job)
        assert p.returncode == 0, p.stderr
        again = wait(lambda: _sacct_end(case.job), 300, 1, f"the requeued job {case.job} to end")
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


def test_nodefail_probes_the_node_address_from_slurm_conf(tmp_path: Path) -> None:
    conf = tmp_path / "slurm.conf"
    conf.write_text(
        "NodeName=lab-node1 NodeAddr=10.89.42.11 CPUs=2 State=UNKNOWN\n"
        "NodeName=lab-node[2-3] NodeAddr=10.89.42.[12-13] CPUs=2 State=UNKNOWN  # paired in order\n"
        "NodeName=lab-node[4-8] CPUs=2 State=FUTURE\n"
        "NodeName=odd[1-2] NodeAddr=10.0.0.1 CPUs=2\n"  # one address for two names: not an answer
    )
    assert nodefail.node_addr("lab-node1", str(conf)) == "10.89.42.11"
    assert nodefail.node_addr("lab-node3", str(conf)) == "10.89.42.13"
    assert nodefail.node_addr("lab-node5", str(conf)) is None
    assert nodefail.node_addr("odd2", str(conf)) is None
    assert nodefail.node_addr("lab-node1", str(tmp_path / "missing")) is None
    probed: list[tuple[str, int]] = []

    def probe(host: str, port: int, _t: float) -> bool:
        probed.append((host, port))
        return host == "lab-ctl"

    def addr(host: str, _conf: str | None) -> str | None:
        return nodefail.node_addr(host, str(conf))

    run = _Fake()
    out = nodefail.mark_lost(1, "x", env=_ENV, run=run, probe=probe, controller=_ctld, address=addr)
    assert probed == [("10.89.42.12", 6818), ("lab-ctl", 6817)]  # the address: no name lookup
    assert out is not None and out["action"] == "down" and out["node"] == "lab-node2"
    assert out["addr"] == "10.89.42.12" and run.calls[-1][2] == "NodeName=lab-node2"


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
    tmp_path: Path,
    sinfo_line: str,
    healthy: bool = True,
    slurmd: bool = True,
    slurmd_age: int = 3600,
    real_procs: bool = False,
) -> str:
    """Run the node watchdog once against fake sinfo/scontrol/systemctl; returns the calls made. pgrep and
    pkill are stand-ins too (this machine's own slurmstepd processes, the lab's included, must never be
    touched), unless real_procs: the caller then runs it inside a PID namespace of its own."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    log = tmp_path / "calls"
    fakes = [] if real_procs else [("pgrep", f'echo "$0 $*" >> {log}; exit 1'), ("pkill", "exit 1")]
    for name, body in (
        *fakes,
        ("sinfo", f"echo \"$0 $*\" >> {log}; echo '{sinfo_line}'"),
        ("scontrol", f'echo "$0 $*" >> {log}'),
        (
            "systemctl",
            # `show ... ActiveEnterTimestampMonotonic`: slurmd became active slurmd_age s ago
            f'echo "$0 $*" >> {log}; [[ "$1" == show ]] && {{ up=$(cut -d. -f1 /proc/uptime); '
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
    spool = tmp_path / "spool"
    conf.write_text(
        f"LCM_WD_HOLDDOWN_S=20\nLCM_WD_NODE=lab-node2\nLCM_WD_HEALTHCHECK={hc}\nLCM_WD_SPOOL={spool}\n"
    )
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}"}
    argv = ["bash", str(WATCHDOG), "--once", str(conf)]
    if real_procs:
        # a PID namespace of its own: left-over steps (real processes titled as slurmstepd titles itself, one
        # ignoring SIGTERM) and a process that only looks alike, then the watchdog, then who is left
        script = (
            "set -u; (exec -a 'slurmstepd: [41.0]' sleep 300) & "
            "(trap '' TERM; exec -a 'slurmstepd: [41.batch]' sleep 300) & "
            "(exec -a 'not-slurmstepd: [41.0]' sleep 300) & sleep 0.3; \"$@\"; echo LEFT:; "
            "ps -eo args= | grep -F '[41.' | grep -v grep"
        )
        argv = ["unshare", "--pid", "--fork", "--mount-proc", "bash", "-c", script, "_", *argv]
    p = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=30)
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


@pytest.mark.skipif(
    sys.platform != "linux" or os.geteuid() != 0 or shutil.which("unshare") is None,
    reason="needs root and unshare (a PID namespace of its own)",
)
def test_watchdog_kills_the_steps_left_on_the_node_before_its_return(tmp_path: Path) -> None:
    spool = tmp_path / "spool"
    spool.mkdir()
    for name in ("lab-node2_41.0", "lab-node2_41.batch", "cred_state"):
        (spool / name).write_text("")
    (spool / "job00041").mkdir()
    (spool / "job00041" / "slurm_script").write_text("#!/bin/bash\n")  # a killed batch step's leftovers
    out = _watchdog(tmp_path, f"down*|{_ago(30)}|lcm: agent heartbeat lost: ...", real_procs=True)
    assert "killing the steps left on lab-node2 before its return" in out, out
    assert "slurmstepd: [41.0]" in out and "slurmstepd: [41.batch]" in out, out  # both named in the log
    left = out.split("LEFT:", 1)[1].splitlines()
    assert [ln.split(" 300")[0] for ln in left if ln.strip()] == ["not-slurmstepd: [41.0]"], out
    assert sorted(f.name for f in spool.iterdir()) == ["cred_state"]
    assert "removing from" in out and "job00041" in out
    assert out.index("killing the steps") < out.index("resumed lab-node2")
    assert "systemctl restart slurmd" in out  # slurmd forgets the killed batch job (no "Duplicate jobid")
    # a node with nothing left: nothing killed, resumed as before
    (tmp_path / "b").mkdir()
    out = _watchdog(tmp_path / "b", f"down*|{_ago(30)}|lcm: agent heartbeat lost: ...")
    assert "pgrep -a -f" in out and "killing" not in out and "resumed lab-node2" in out
    assert "restart slurmd" not in out


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
