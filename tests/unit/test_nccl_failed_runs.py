"""lcm_runner.nccl on failed runs: each failure class is a per-rank error flag and the verdict is FAIL.

The failed-* fixtures are named, minimal edits of the real healthy H200 pair in fixtures/nccl/h200x2-socket
(fixtures/nccl/README.md, derive_failed.py); the error lines inserted are NCCL's and torch's own texts as
quoted in public issues (cited in lcm_runner/nccl/logparse.py). The healthy logs must still PASS.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from lcm_runner import config
from lcm_runner.cli import main as lcm_main
from lcm_runner.nccl import parse_text, profile_dir
from lcm_runner.report import build_report
from lcm_runner.stages.common import StageResult

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = Path(__file__).parent / "fixtures" / "nccl"
LAB_SPEC = config.load_cluster(ROOT / "inventories" / "lab")
FAILED = (
    "failed-init-stopped",
    "failed-missing-rank",
    "failed-peer-reset",
    "failed-watchdog",
    "failed-no-collective",
)
RUN_FLAGS = {"comm_error", "comm_aborted", "init_incomplete", "ranks_missing", "no_collective"}
HEALTHY = [
    FIXTURES,
    FIXTURES / "h200x2-tuning",
    FIXTURES / "h200x2-shm",
    FIXTURES / "h200x2-socket",
    ROOT / "docs" / "results" / "h200x2-stages" / "run-1" / "nccl",
]


def _flags(s: dict, code: str) -> list[dict]:
    return [f for f in s["flags"] if f["code"] == code]


@pytest.mark.parametrize("d", HEALTHY, ids=lambda p: p.name)
def test_real_healthy_logs_still_pass(d: Path) -> None:
    if not d.is_dir():
        pytest.skip(f"{d} not in this checkout")
    s = profile_dir(d)
    assert s["ok"], s["flags"]
    assert not {f["code"] for f in s["flags"]} & RUN_FLAGS
    assert all(r["collective_evidence"] and not r["comms_init_incomplete"] for r in s["ranks"])


def test_teardown_abort_of_the_healthy_pair_is_listed_not_flagged() -> None:
    # rank 1 of the real pair ends with ncclCommAbort of its default-PG communicator (torch's teardown)
    s = profile_dir(FIXTURES)
    r1 = s["ranks"][1]
    assert r1["aborted"] == ["comm 0x1c49eb20 (commId 0x56bba21116e64fad)"] and r1["errors"] == 0
    assert s["flags"] == [] and s["ok"]


def test_rank_stopped_after_init_start() -> None:
    s = profile_dir(FIXTURES / "failed-init-stopped")
    assert not s["ok"]
    (f,) = _flags(s, "init_incomplete")
    assert f["ranks"] == [1] and f["where"] == "vm:775" and f["severity"] == "error"
    assert f["comm"] == "comm 0x2116fdf0 (commId 0x44f7409955f806b8)"
    assert f["line"].endswith("commId 0x44f7409955f806b8 - Init START")
    assert "stopped mid-initialisation" in f["detail"] and "(rank 1 of 2)" in f["detail"]
    assert {x["code"] for x in s["flags"]} == {"init_incomplete"}  # rank 0 is the untouched real log
    assert s["ranks"][1]["comms_init_incomplete"] == [f["comm"]]


def test_rank_missing_from_a_communicator() -> None:
    s = profile_dir(FIXTURES / "failed-missing-rank")
    assert not s["ok"] and s["files"] == 1
    (f,) = _flags(s, "ranks_missing")
    assert f["ranks"] == [1] and f["comm"] == "commId 0x44f7409955f806b8"
    assert "no log of rank(s) 1" in f["detail"] and "seen: rank(s) 0 (vm:774)" in f["detail"]
    assert "Init START" in f["line"]


def test_peer_reset_and_abort() -> None:
    s = profile_dir(FIXTURES / "failed-peer-reset", LAB_SPEC)
    assert not s["ok"]
    (err,) = _flags(s, "comm_error")
    assert err["ranks"] == [1] and err["where"] == "vm:775"
    assert err["comm"] == "comm 0x2116fdf0 (commId 0x44f7409955f806b8)"
    assert (
        "socketProgressOpt: Call to recv from 192.0.2.2<50347> failed : Connection reset by peer"
        in err["line"]
    )
    assert "2 error line(s)" in err["detail"]  # and the proxy's "Error encountered progressing operation"
    (ab,) = _flags(s, "comm_aborted")
    assert (
        ab["ranks"] == [1]
        and ab["line"].endswith("- Abort COMPLETE")
        and "after error line(s)" in ab["detail"]
    )
    assert not any(f["ranks"] == [0] for f in s["flags"] if f["code"] in RUN_FLAGS)


def test_torch_watchdog_timeout() -> None:
    s = profile_dir(FIXTURES / "failed-watchdog")
    assert not s["ok"]
    (err,) = _flags(s, "comm_error")
    assert err["ranks"] == [0] and err["where"] == "vm:774"
    assert "Watchdog caught collective operation timeout" in err["line"]
    assert err["comm"].startswith("comm 0x26f18160") and "0(default_pg)" in err["comm"]
    assert "(torch)" in err["detail"]
    assert [f["ranks"] for f in _flags(s, "comm_aborted")] == [[0]]


def test_no_collective_after_init() -> None:
    s = profile_dir(FIXTURES / "failed-no-collective")
    assert not s["ok"]
    nc = _flags(s, "no_collective")
    assert [f["ranks"] for f in nc] == [[0], [1]] and [f["where"] for f in nc] == ["vm:774", "vm:775"]
    assert all("1 communicator(s) completed init" in f["detail"] for f in nc)
    assert all("no channel connection line" in f["detail"] and "COLL 'opCount'" in f["detail"] for f in nc)
    assert all(f["line"].endswith("- Init COMPLETE") for f in nc)
    assert {f["code"] for f in s["flags"]} == {"no_collective"}


def test_coll_opcount_lines_are_evidence_of_a_collective(tmp_path: Path) -> None:
    d = tmp_path / "nccl"
    shutil.copytree(FIXTURES / "failed-no-collective", d)
    for f, (host, comm) in {
        "nccl.vm.774.log": ("vm:774:774 [0]", "0x26f18160"),
        "nccl.vm.775.log": ("vm:775:775 [1]", "0x2116fdf0"),
    }.items():
        with (d / f).open("a") as fh:  # NCCL_DEBUG_SUBSYS=COLL's line (enqueue.cc)
            fh.write(
                f"{host} NCCL INFO AllReduce: opCount 0 sendbuff 0x7f1e00000000 recvbuff 0x7f1e00000000 "
                f"count 512 datatype 9 op 0 root 0 comm {comm} [nranks=2] stream 0x55d0c2a0\n"
            )
    s = profile_dir(d)
    assert s["ok"], s["flags"]
    assert s["ranks"][0]["collective_evidence"] == ["1 COLL opCount line(s)"]


def test_bootstrap_without_any_communicator(tmp_path: Path) -> None:
    text = "".join(
        (FIXTURES / "h200x2-nvlink-p2p.rank1.log").read_text().splitlines(keepends=True)[:3]
    )  # ... NCCL INFO Bootstrap: Using eth0:192.0.2.2<0>
    (tmp_path / "nccl.vm.1330.log").write_text(text)
    s = profile_dir(tmp_path)
    (f,) = _flags(s, "init_incomplete")
    assert (
        f["ranks"] == ["vm:1330"]
        and "no communicator init started" in f["detail"]
        and "Bootstrap" in f["line"]
    )
    assert not s["ok"]


# Error lines as NCCL 2.1x-2.2x and torch print them (the issue each is quoted from is cited in logparse.py)
ERROR_LINES = [
    "vm:775:788 [1] misc/socket.cc:49 NCCL WARN socketProgress: Connection closed by remote peer vm<42830>",
    "vm:775:788 [1] misc/socket.cc:538 NCCL WARN Net : Connection closed by remote peer vm<47861>",
    "vm:775:788 [1] misc/socket.cc:518 NCCL WARN Net : Call to recv from 192.0.2.2<58355> failed : "
    "Broken pipe",
    "vm:775:788 [1] misc/socket.cc:483 NCCL WARN socketStartConnect: Connect to 192.0.2.2<45763> failed : "
    "Connection refused",
    "vm:775:788 [1] include/socket.h:403 NCCL WARN Connect to 192.0.2.2<45763> failed : Connection timed out",
    "vm:775:788 [1] proxy.cc:1143 NCCL WARN Socket recv failed while polling for opId=0x7f6f18cb7f40",
    "vm:775:788 [1] proxy.cc:1519 NCCL WARN [Proxy Service 0] Failed to execute operation Connect from "
    "rank 0, retcode 2",
    "vm:775:788 [1] transport/net_ib.cc:1295 NCCL WARN NET/IB : Got completion from peer 192.0.2.2<55921> "
    "with status=12 opcode=1 len=0 vendor err 129 (Send)",
    "vm:775:788 [1] transport.cc:154 NCCL WARN Cuda failure 'invalid argument'",
    "[rank1]:[E1201 08:14:55.124 ProcessGroupNCCL.cpp:1664] [PG ID 0 PG GUID 0(default_pg) Rank 1] NCCL "
    "communicator was aborted on rank 1. Original reason for failure was: NCCL error: remote process exited "
    "or there was a network error, NCCL version 2.21.5 ncclRemoteError",
    "torch.distributed.DistBackendError: NCCL error in: ../torch/csrc/distributed/c10d/NCCLUtils.hpp:275, "
    "unhandled system error (run with NCCL_DEBUG=INFO for details), NCCL version 2.21.5",
]


@pytest.mark.parametrize("line", ERROR_LINES, ids=range(len(ERROR_LINES)))
def test_each_error_line_fails_the_run(tmp_path: Path, line: str) -> None:
    d = tmp_path / "nccl"
    shutil.copytree(FIXTURES / "h200x2-socket", d)
    with (d / "nccl.vm.775.log").open("a") as fh:
        fh.write(line + "\n")
    s = profile_dir(d)
    (f,) = _flags(s, "comm_error")
    assert (
        f["ranks"] == [1]
        and f["where"] == "vm:775"
        and f["line"] == (line if len(line) <= 200 else line[:197] + "...")
    )
    assert f["comm"].startswith("comm 0x2116fdf0") and not s["ok"]
    assert not _flags(s, "comm_aborted")  # no Abort line in this log


def test_retries_and_warn_source_location() -> None:
    log = parse_text(
        "vm:1:1 [0] NCCL INFO Call to connect returned Connection refused, retrying\n"
        "vm:1:1 [0] NCCL INFO Call to connect returned Connection timed out, retrying\n"
        "vm:1:1 [0] misc/ibvwrap.cc:63 NCCL WARN Failed to open libibverbs.so[.1]\n"
        "vm:1:1 [0] NCCL INFO transport/net_ib.cc:852 -> 3\n"
    )
    assert log.errors == []  # INFO retries, a benign WARN, an error-path trace line: not a failure
    assert log.warnings == ["Failed to open libibverbs.so[.1]"] and log.nccl_lines == 4


@pytest.mark.parametrize("name", FAILED)
def test_cli_exit_code_fail(name: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert lcm_main(["nccl-profile", "--parse-only", str(FIXTURES / name)]) == 1
    assert "verdict: FAIL" in capsys.readouterr().out


def test_cli_exit_code_pass_and_module_form(capsys: pytest.CaptureFixture[str]) -> None:
    assert lcm_main(["nccl-profile", "--parse-only", str(FIXTURES / "h200x2-socket")]) == 0
    assert "verdict: PASS" in capsys.readouterr().out
    r = subprocess.run(
        [sys.executable, "-m", "lcm_runner.nccl", str(FIXTURES / "failed-peer-reset")],
        capture_output=True,
        text=True,
        cwd=ROOT,
        check=False,
    )
    assert r.returncode == 1 and "[ERROR] comm_error: rank 1 (vm:775)" in r.stdout


def _report(run: Path) -> tuple[str, str, dict]:
    build_report(run)
    return (
        (run / "infra_slo.md").read_text(),
        (run / "multi_node_run.log").read_text(),
        json.loads((run / "slo.json").read_text()),
    )


def test_report_shows_fail_and_flags(tmp_path: Path) -> None:
    run = tmp_path / "run"
    summary = profile_dir(FIXTURES / "failed-peer-reset")
    res = StageResult("nccl_profile", verdict="FAIL", summary="nccl_profile fail", metrics=summary)
    res.write(run)
    md, runlog, data = _report(run)
    assert data["verdict"] == "FAIL" and data["stages"]["nccl_profile"]["verdict"] == "FAIL"
    assert "**NCCL profile verdict: FAIL**" in md
    assert "- **error** `comm_error`: rank 1 (vm:775)" in md and "`comm_aborted`" in md
    assert "NCCL profile verdict: FAIL (3 flag(s))" in runlog and "[ERROR] comm_aborted" in runlog


def test_report_from_logs_without_stage_result(tmp_path: Path) -> None:
    run = tmp_path / "run"
    shutil.copytree(FIXTURES / "failed-no-collective", run / "nccl")
    md, runlog, _ = _report(run)
    assert "**NCCL profile verdict: FAIL**" in md and "`no_collective`: rank 0 (vm:774)" in md
    assert "NCCL profile verdict: FAIL" in runlog
    shutil.rmtree(run / "nccl")
    shutil.copytree(FIXTURES / "h200x2-socket", run / "nccl")
    md, runlog, _ = _report(run)
    assert "**NCCL profile verdict: PASS** (0 flag(s))" in md and "NCCL profile verdict: PASS" in runlog
