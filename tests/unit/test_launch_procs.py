"""The tagged-process scan that every leftover check relies on: real processes, real /proc."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from lcm_runner.launch import procs


def _start(tag: str, node: str, *argv: str) -> subprocess.Popen[bytes]:
    env = {**os.environ, procs.TAG_ENV: tag, procs.NODE_ENV: node}
    return subprocess.Popen(list(argv), env=env, start_new_session=True)


def test_scan_finds_tagged_children_and_grandchildren_by_node() -> None:
    tag = f"test-procs-{os.getpid()}"
    # a shell whose child outlives nothing: both carry the tag through the environment
    a = _start(tag, "n0", "bash", "-c", "sleep 30 & wait")
    b = _start(tag, "n1", "sleep", "30")
    other = _start(tag + "-other", "n0", "sleep", "30")
    try:
        deadline = time.monotonic() + 5
        # until bash's child has exec'd sleep (between its fork and exec it is a second "bash")
        while time.monotonic() < deadline and {p.comm for p in procs.scan(tag, "n0")} != {"bash", "sleep"}:
            time.sleep(0.05)
        n0 = procs.scan(tag, "n0")
        assert {p.comm for p in n0} == {"bash", "sleep"}
        assert all(p.node == "n0" for p in n0)
        assert [p.pid for p in procs.scan(tag, "n1")] == [b.pid]
        assert len(procs.scan(tag)) == 3  # every node
        assert other.pid not in [p.pid for p in procs.scan(tag)]
        procs.kill(n0)
        assert procs.wait_gone(tag, "n0", 5.0) == []
        assert [p.pid for p in procs.scan(tag)] == [b.pid]
    finally:
        for p in (a, b, other):
            p.kill()
            p.wait()
    assert procs.scan(tag) == []


@pytest.mark.parametrize(
    ("comm", "cmdline", "trainer"),
    [
        ("lcm-trainer", "python -m lcm_runner.launch.agent --nnodes 2", True),  # forked by our agent
        ("python", "/venv/bin/python -u -m lcm_runner.train --num-layers 2", True),  # exec'd by torchrun
        ("pt_elastic", "python -m torch.distributed.run --nnodes 2 -m lcm_runner.train --x", False),
        ("python", "python -m lcm_runner.launch.agent --nnodes 2 -- --train-iters 3", False),
        ("python", "python -c from multiprocessing.spawn import spawn_main", False),
    ],
)
def test_is_trainer_tells_ranks_from_agents_and_helpers(comm: str, cmdline: str, trainer: bool) -> None:
    assert procs.Proc(1, 1, comm, cmdline, "n0").is_trainer is trainer


def test_cli_lists_and_kills_as_json() -> None:
    tag = f"test-procs-cli-{os.getpid()}"
    p = _start(tag, "n0", "sleep", "30")
    try:
        time.sleep(0.2)
        out = subprocess.run(
            [sys.executable, "-m", "lcm_runner.launch.procs", "kill-all", "--tag", tag],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        import json

        ans = json.loads(out)
        assert [q["pid"] for q in ans["procs"]] == [p.pid]
        assert p.wait(5) == -9
    finally:
        if p.poll() is None:
            p.kill()


def test_cli_stop_all_freezes_without_killing_then_kill_all_ends_them() -> None:
    """The first half of SlurmLauncher.kill_job: stopped (state T), still alive, then SIGKILL ends it."""
    import json

    tag = f"test-procs-stop-{os.getpid()}"
    p = _start(tag, "n0", "sleep", "30")
    try:
        time.sleep(0.2)

        def cli(action: str) -> dict:
            cmd = [sys.executable, "-m", "lcm_runner.launch.procs", action, "--tag", tag, "--node", "n0"]
            return json.loads(subprocess.run(cmd, capture_output=True, text=True, check=True).stdout)

        assert [q["pid"] for q in cli("stop-all")["procs"]] == [p.pid]
        time.sleep(0.1)
        from pathlib import Path

        state = Path(f"/proc/{p.pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        assert state == "T" and p.poll() is None
        assert [q["pid"] for q in cli("kill-all")["procs"]] == [p.pid]
        assert p.wait(5) == -9
    finally:
        if p.poll() is None:
            p.kill()


def test_the_agents_teardown_leaves_the_nodes_metrics_writer_to_the_node_task(tmp_path, monkeypatch) -> None:
    """The agent's leftover sweep (after a clean finish, and at every teardown) kills every tagged process
    of its node but the training-metrics writer: the batch script's node task started that one beside the
    agent and stops it with SIGTERM after the agent, which makes it write its last file (the job's final
    steps, lcm_train_running 0). The sweep used to SIGKILL it (lab job logs: `Killed ... -m
    lcm_runner.metrics train`), so a job's last steps never reached Prometheus."""
    from lcm_runner.launch.agent.config import AgentConfig
    from lcm_runner.launch.agent.events import Events
    from lcm_runner.launch.agent.ranks import Ranks

    tag, node = f"test-writer-{os.getpid()}", "n0"
    out = tmp_path / "lcm_train_1.prom"
    (tmp_path / "run" / "telemetry").mkdir(parents=True)
    writer = _start(
        tag, node, sys.executable, "-m", "lcm_runner.metrics", "train", "--run-dir", str(tmp_path / "run"),
        "--job-id", "1", "--out", str(out), "--host", node, "--interval-s", "0.2",
    )  # fmt: skip
    helper = _start(tag, node, "sleep", "60")  # a rank's helper left behind: the sweep's business
    monkeypatch.setenv(procs.TAG_ENV, tag)
    monkeypatch.setenv(procs.NODE_ENV, node)
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and not out.exists():
            time.sleep(0.05)
        assert out.exists(), "the writer never wrote its file"
        assert {p.pid: p.is_metrics_writer for p in procs.scan(tag, node)} == {
            writer.pid: True,
            helper.pid: False,
        }
        events = tmp_path / "agent.jsonl"
        ranks = Ranks(AgentConfig(nnodes=1, node_rank=0, nproc_per_node=1, master_addr="x", master_port=1),
                      Events(events, 0))  # fmt: skip
        ranks.clear_leftovers(0)
        # (the agent reaps any child of its process, here this test's: Popen cannot see the SIGKILL)
        assert [p.pid for p in procs.scan(tag, node)] == [writer.pid]
        assert writer.poll() is None, "the sweep killed the metrics writer"
        ranks.teardown(1, "a restart")
        time.sleep(0.3)
        assert writer.poll() is None, "the teardown killed the metrics writer"
        assert '"leftovers"' in events.read_text() and f"{helper.pid} sleep 60" in events.read_text()
        # the node task's SIGTERM: the writer publishes its last file and exits 0
        writer.terminate()
        assert writer.wait(timeout=10) == 0
    finally:
        for p in (writer, helper):
            if p.poll() is None:
                p.kill()
                p.wait()
    assert procs.scan(tag) == []


_PDEATHSIG_CHILD = (
    "import ctypes, signal, subprocess, sys\n"
    "child = subprocess.Popen([sys.executable, '-c', "
    "'import ctypes, signal, time; ctypes.CDLL(None).prctl(1, signal.SIGKILL, 0, 0, 0); "
    "print(flush=True); time.sleep(30)'], stdout=subprocess.PIPE)\n"
    "child.stdout.readline()\n"
    "print(child.pid, flush=True)\n"
    "child.wait()\n"
)


_KILLER = """
import json, os, subprocess, sys
from lcm_runner.launch import procs
cpu, attempts, child = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
os.sched_setaffinity(0, {cpu})
os.nice(19)  # as scripts/test's CPU track: the killer is preempted between two kills
out = []
for i in range(attempts):
    tag = f"test-procs-freeze-{os.getpid()}-{i}"
    env = {**os.environ, procs.TAG_ENV: tag, procs.NODE_ENV: "n0"}
    agent = subprocess.Popen([sys.executable, "-c", child], env=env, start_new_session=True,
                             stdout=subprocess.PIPE)
    rank = int(agent.stdout.readline())
    found = procs.scan(tag, "n0")
    dead = procs.freeze_then_kill(found, (agent.pid,))
    out.append({"found": sorted(p.pid for p in found), "dead": sorted(p.pid for p in dead),
                "expected": sorted([agent.pid, rank]), "agent_exit": agent.wait(5),
                "left": [p.pid for p in procs.wait_gone(tag, "n0", 5.0)]})
print(json.dumps(out))
"""


def test_freeze_then_kill_counts_a_rank_that_its_agents_death_kills() -> None:
    """An agent and its rank, the rank with PR_SET_PDEATHSIG SIGKILL (as the agent forks them), killed
    with the agent's group by a killer at nice 19 that shares one CPU with a busy process (the CI's
    load). Both are reported killed. Killing the group first and the rank next, as before, missed the
    rank in 29 of 30 attempts so (it died of its agent's death and was reaped between the two kills: CI
    2026-12-07, "SIGKILL of every rank (0/2)")."""
    import json

    cpu = min(os.sched_getaffinity(0))
    busy = subprocess.Popen(
        [sys.executable, "-c", f"import os; os.sched_setaffinity(0, {{{cpu}}})\nwhile True: pass"]
    )
    try:
        out = subprocess.run(
            [sys.executable, "-c", _KILLER, str(cpu), "4", _PDEATHSIG_CHILD],
            capture_output=True,
            text=True,
            timeout=120,
            check=True,
        ).stdout
    finally:
        busy.kill()
        busy.wait()
    results = json.loads(out)
    assert len(results) == 4
    for r in results:
        assert r["found"] == r["expected"] == r["dead"], r
        assert r["agent_exit"] == -9 and r["left"] == [], r


def test_freeze_then_kill_leaves_out_what_was_gone_before_it() -> None:
    tag = f"test-procs-freeze-gone-{os.getpid()}"
    p = _start(tag, "n0", "sleep", "30")
    q = _start(tag, "n0", "sleep", "30")
    try:
        time.sleep(0.2)
        found = procs.scan(tag, "n0")
        assert {x.pid for x in found} == {p.pid, q.pid}
        q.kill()
        q.wait()  # exited (and reaped) before the kill: not one of its victims
        assert [x.pid for x in procs.freeze_then_kill(found)] == [p.pid]
        assert p.wait(5) == -9
    finally:
        for x in (p, q):
            if x.poll() is None:
                x.kill()
                x.wait()
