"""`lcm-runner probe` (registered by lcm_runner/cli.py); also `python -m lcm_runner.probes`.

    lcm-runner probe --expect FILE [--only gemm,copy,allreduce] [--json OUT] [--markdown OUT]
                     [--peers DIR] [--nnodes N --node-rank R --master ADDR:PORT]

Measures this node's GEMM throughput and copy bandwidth per local GPU and an all-reduce bus-bandwidth
sweep (this node's GPUs, or every node's with --nnodes > 1: the same command on each node at once),
compares them with the expectation file's thresholds and, with --peers, with the other nodes' last
results (docs/probes.md). Exit 0: every check passed or was skipped; 1: a check failed; 2: bad input,
nothing measured. --nnodes, --node-rank and --master default to $LCM_PROBE_NNODES,
$LCM_PROBE_NODE_RANK (else $SLURM_NODEID) and $LCM_PROBE_MASTER.
"""

from __future__ import annotations

import argparse
import datetime
import os
import sys
import time
from pathlib import Path
from typing import Any

from .expect import PROBES, Expectation, ExpectationError, allreduce_key, load_expectation, require_thresholds
from .result import FAIL, PASS, ProbeResult

PROG = "lcm-runner probe"


class ProbeUsageError(ValueError):
    """Bad command-line input (exit 2)."""


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--expect", required=True, metavar="FILE", help="the expectation JSON (docs/probes.md)")
    p.add_argument(
        "--only", metavar="LIST", help=f"comma-separated subset of {','.join(PROBES)} (default: all)"
    )
    p.add_argument("--json", dest="json_out", metavar="OUT", help="write the result as JSON here")
    p.add_argument("--markdown", dest="markdown_out", metavar="OUT", help="write a Markdown table here")
    p.add_argument(
        "--peers",
        metavar="DIR",
        help="shared directory of every node's last result (<node>.json): compare, then write ours there",
    )
    p.add_argument("--nnodes", help="nodes in the all-reduce (default $LCM_PROBE_NNODES or 1)")
    p.add_argument(
        "--node-rank", help="this node's index, 0..N-1 (default $LCM_PROBE_NODE_RANK, $SLURM_NODEID)"
    )
    p.add_argument("--master", metavar="ADDR:PORT", help="node 0's rendezvous (default $LCM_PROBE_MASTER)")
    p.add_argument(
        "--timeout", type=float, default=300.0, help="seconds the rendezvous and a collective may take (300)"
    )
    p.add_argument("--gemm-n", type=int, help="matrix size (default: the file's gemm_n on GPU, 1024 on CPU)")
    p.add_argument(
        "--copy-mib", type=int, help="copy buffer MiB (default: the file's copy_mib on GPU, 64 on CPU)"
    )
    p.add_argument(
        "--allreduce-max-mib",
        type=int,
        help="largest all-reduce MiB, a power of two (default: the file's allreduce_max_mib; 8 on CPU)",
    )
    p.set_defaults(func=run)


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    p = subparsers.add_parser(
        "probe",
        help="burn-in probes: GEMM, HBM copy, all-reduce busbw vs the expected figures (docs/probes.md)",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_arguments(p)
    return p


def _int(flag: str, text: str | None, env: str | None = None, minimum: int = 0) -> int | None:
    if text is None:
        return None
    try:
        v = int(text)
    except ValueError:
        raise ProbeUsageError(f"{flag}{f' (${env})' if env else ''}: not a whole number: {text!r}") from None
    if v < minimum:
        raise ProbeUsageError(f"{flag}: must be >= {minimum}, got {v}")
    return v


def parse_only(text: str | None) -> tuple[str, ...]:
    if not text:
        return PROBES
    chosen = [s.strip() for s in text.split(",") if s.strip()]
    if bad := [s for s in chosen if s not in PROBES]:
        raise ProbeUsageError(f"--only {','.join(bad)}: not one of {','.join(PROBES)}")
    if not chosen:
        raise ProbeUsageError("--only: empty")
    return tuple(p for p in PROBES if p in chosen)


def parse_master(text: str) -> tuple[str, int]:
    addr, sep, port = text.rpartition(":")
    addr = addr.strip("[]")
    if not sep or not addr or not port.isdigit() or not 0 < int(port) < 65536:
        raise ProbeUsageError(f"--master {text!r}: must be ADDR:PORT (node 0's address, a free port)")
    return addr, int(port)


def topology(ns: argparse.Namespace) -> tuple[int, int, tuple[str, int] | None]:
    env = os.environ
    nnodes = _int("--nnodes", ns.nnodes, None, 1) if ns.nnodes is not None else None
    if nnodes is None:
        nnodes = _int("--nnodes", env.get("LCM_PROBE_NNODES"), "LCM_PROBE_NNODES", 1) or 1
    rank_text, rank_env = ns.node_rank, None
    if rank_text is None:
        for var in ("LCM_PROBE_NODE_RANK", "SLURM_NODEID"):
            if env.get(var) is not None:
                rank_text, rank_env = env[var], var
                break
    node_rank = _int("--node-rank", rank_text, rank_env) if nnodes > 1 else 0
    master_text = ns.master or env.get("LCM_PROBE_MASTER")
    if nnodes == 1:
        return 1, 0, parse_master(master_text) if ns.master else None
    if node_rank is None:
        raise ProbeUsageError(
            f"--nnodes {nnodes}: needs --node-rank (or $LCM_PROBE_NODE_RANK, $SLURM_NODEID)"
        )
    if not 0 <= node_rank < nnodes:
        raise ProbeUsageError(f"--node-rank {node_rank}: must be within 0..{nnodes - 1} (--nnodes {nnodes})")
    if not master_text:
        raise ProbeUsageError(f"--nnodes {nnodes}: needs --master ADDR:PORT (or $LCM_PROBE_MASTER)")
    return nnodes, node_rank, parse_master(master_text)


def _sizes(ns: argparse.Namespace) -> None:
    for flag, v in (
        ("--gemm-n", ns.gemm_n),
        ("--copy-mib", ns.copy_mib),
        ("--allreduce-max-mib", ns.allreduce_max_mib),
    ):
        if v is not None and v < 1:
            raise ProbeUsageError(f"{flag}: must be >= 1, got {v}")
    m = ns.allreduce_max_mib
    if m is not None and m & (m - 1):
        raise ProbeUsageError(f"--allreduce-max-mib {m}: must be a power of two")
    if ns.timeout <= 0:
        raise ProbeUsageError(f"--timeout {ns.timeout:g}: must be > 0")


def _now() -> str:
    return datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds").replace("+00:00", "Z")


def devices_check(exp: Expectation, gpus: int, names: list[str]) -> ProbeResult:
    res = ProbeResult("devices", PASS, float(gpus), float(exp.gpu_count), "GPUs", "")
    res.details = {"expected_model": exp.gpu_model, "names": names}
    if gpus != exp.gpu_count:
        res.fail(f"expected {exp.gpu_count} GPUs ({exp.gpu_model}), this process sees {gpus}")
    else:
        res.reason = f"{gpus} GPU{'s' if gpus != 1 else ''} visible, as expected ({exp.gpu_model})"
    return res


def measure(
    exp: Expectation, only: tuple[str, ...], ns: argparse.Namespace, topo: tuple[int, int, Any]
) -> Any:
    from . import allreduce, copy, gemm
    from .report import ProbeRun
    from .timing import environment, local_devices, uses_gpu

    nnodes, node_rank, master = topo
    t0 = time.monotonic()
    devices = local_devices()
    gpu = uses_gpu(devices)
    sizes = {
        "gemm_n": ns.gemm_n or (exp.gemm_n if gpu else gemm.CPU_N),
        "copy_mib": ns.copy_mib or (exp.copy_mib if gpu else copy.CPU_MIB),
        "allreduce_max_mib": ns.allreduce_max_mib or (exp.allreduce_max_mib if gpu else None),
    }
    run = ProbeRun(
        node=exp.node,
        expectation={
            "path": exp.path,
            "gpu": {"model": exp.gpu_model, "count": exp.gpu_count},
            "thresholds": exp.thresholds,
            "peer_ratio": exp.peer_ratio,
        },
        started=_now(),
        environment=environment(devices),
        options={
            "only": list(only),
            "nnodes": nnodes,
            "node_rank": node_rank,
            "master": f"{master[0]}:{master[1]}" if master else None,
            "peers": ns.peers,
            **sizes,
        },
    )
    gpus = len(devices) if gpu else 0
    if exp.gpu_count > 0 or gpu:
        run.results.append(devices_check(exp, gpus, [d.name for d in devices] if gpu else []))
    if "gemm" in only:
        run.results.append(gemm.run(devices, sizes["gemm_n"], exp.threshold("gemm_tflops"), exp.peer_ratio))
        print(_line(run.results[-1]), flush=True)
    if "copy" in only:
        run.results.append(copy.run(devices, sizes["copy_mib"], exp.threshold("copy_gbps"), exp.peer_ratio))
        print(_line(run.results[-1]), flush=True)
    if "allreduce" in only:
        res = allreduce.run(
            gpus,
            nnodes,
            node_rank,
            master,
            sizes["allreduce_max_mib"],
            exp.threshold(allreduce_key(nnodes)),
            ns.timeout,
        )
        for line in allreduce.format_rows(res.details.get("rows", [])) if res.details.get("rows") else []:
            print(line)
        run.results.append(res)
        print(_line(res), flush=True)
    run.duration_s = round(time.monotonic() - t0, 3)
    return run


def _line(r: ProbeResult) -> str:
    from .report import summary_line

    return summary_line(r)


def run(ns: argparse.Namespace) -> int:
    try:
        only = parse_only(ns.only)
        topo = topology(ns)
        _sizes(ns)
        exp = load_expectation(ns.expect)
        require_thresholds(exp, only, topo[0])
        if ns.peers and not Path(ns.peers).is_dir():
            raise ProbeUsageError(
                f"--peers {ns.peers}: not a directory (the shared one every node writes to)"
            )
    except (ProbeUsageError, ExpectationError) as e:
        print(f"{PROG}: {e}", file=sys.stderr)
        return 2
    try:
        import torch  # noqa: F401
    except ModuleNotFoundError:
        print(
            f"{PROG}: needs torch, not installed in {sys.prefix}: "
            "pip install -e '.[train]' (or use the node venv)",
            file=sys.stderr,
        )
        return 2
    from . import peers as peers_mod
    from .report import to_markdown, write_json, write_text

    run_ = measure(exp, only, ns, topo)
    if ns.peers:
        p = peers_mod.load_peers(ns.peers, exp.node)
        peers_mod.compare(run_.results, p, exp.peer_ratio)
        run_.peers = p.to_dict()
        for r in run_.results:
            if "peers" in r.details and r.status == FAIL and "median of" in r.reason:
                print(_line(r), flush=True)
    run_.finished = _now()
    if ns.peers:
        try:
            own = peers_mod.write_own(ns.peers, exp.node, run_.to_dict())
            print(f"{PROG}: wrote {own}", flush=True)
        except OSError as e:
            print(f"{PROG}: cannot write this node's result under --peers {ns.peers}: {e}", file=sys.stderr)
            run_.results.append(
                ProbeResult("peers", FAIL, None, None, "", f"cannot write {exp.node}.json in {ns.peers}: {e}")
            )
    if ns.json_out:
        write_json(ns.json_out, run_)
    if ns.markdown_out:
        write_text(ns.markdown_out, to_markdown(run_))
    verdict = run_.status.upper()
    fails = [r.name for r in run_.results if r.status == FAIL]
    print(f"verdict: {verdict}" + (f" ({', '.join(fails)} failed)" if fails else ""), flush=True)
    return run_.exit_code()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog=PROG, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    add_arguments(ap)
    ns = ap.parse_args(argv)
    return int(ns.func(ns))
