"""docs/scale.md: the module's 70B-on-64-H200 case computed from rates measured on these machines.

    python benchmarks/scale_model.py          # writes docs/scale.md
    python benchmarks/scale_model.py --check  # exit 1 when docs/scale.md is not what the inputs give

Every input is read from a committed result file (named in the output); nothing is typed in by hand except
the case itself (model size, GPU count, layout, bytes per parameter) and the targets.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "benchmarks"))

from _generated import write_or_check  # noqa: E402
from ckpt_throughput import from_console  # noqa: E402

OUT = REPO / "docs" / "scale.md"
CKPT_CALLS = REPO / "docs" / "results" / "h200-ckpt-throughput"
ENGINE = REPO / "docs" / "results" / "h200-engine" / "summary.json"
H200_FAULT = REPO / "docs" / "results" / "h200x2-stages" / "run-2-fault" / "stages" / "fault.json"
LAB_FAULT = REPO / "docs" / "results" / "lab-slurm" / "stages" / "fault.json"

# The case (module 09's scale-out): 70B parameters on 8 nodes x 8 H200, TP8 x PP4 x DP2, bf16 weights,
# fp32 master weights and Adam moments sharded over DP (distributed optimizer), fully parallel save: every
# rank writes 1/64 of the checkpoint.
PARAMS = 70e9
GPUS = 64
GPUS_PER_NODE = 8
BYTES_PER_PARAM = 2 + 4 + 4 + 4  # bf16 weight + fp32 master + Adam m + Adam v
TARGETS = {"checkpoint_s": 60.0, "resume_s": 120.0, "recovery_s": 300.0}


@dataclass
class Inputs:
    rank_write_gbps: float  # the best warm synchronous save of one rank
    rank_write_src: str
    node_direct_write_gbps: float
    node_direct_read_gbps: float
    disk_src: str
    rank_verify_gbps: float  # verify pass of a cold load (reads every byte from the disk)
    rank_load_gbps: float  # megatron's load after the verify (page cache)
    load_src: str
    async_blocking_s_per_gb: float
    async_src: str
    restart_floor_s: float  # fresh launch from a checkpoint on the H200 pair (process start, CUDA, NCCL)
    trainer_kill_s: float  # in-place restart by the agent on the H200 pair
    h200_fault_src: str
    slurm_node_loss_s: float  # node lost -> first new step through a Slurm requeue (CPU lab)
    slurm_detect_s: float
    lab_fault_src: str


def _rel(p: Path) -> str:
    return str(p.relative_to(REPO))


def inputs() -> Inputs:
    best, best_src, verify, load, load_src, disk, disk_src = 0.0, "", 0.0, 0.0, "", {}, ""
    for call in sorted(p for p in CKPT_CALLS.iterdir() if p.is_dir()):
        got = from_console(call)
        if got is None:
            continue
        src = _rel(call / "console.log")
        for r in (r for r in got["saves"].values() if not r["asynchronous"]):
            if r["write_gbps"] > best:  # the best save, with the disk measured beside it in its call
                best, best_src = r["write_gbps"], src
                disk, disk_src = got["disk"], _rel(call / "disk.txt")
        for r in got["loads"].values():
            # load_s is the whole resume, verify_s its first part (these calls verified, then loaded)
            if r.get("bytes") and r["verify_s"] > 0 and r["load_s"] > r["verify_s"]:
                verify, load_src = r["bytes"] / 1e9 / r["verify_s"], src
                load = r["bytes"] / 1e9 / (r["load_s"] - r["verify_s"])
    if not best or not verify or not disk:
        raise SystemExit(f"no checkpoint throughput results under {_rel(CKPT_CALLS)}")
    warm = json.loads(ENGINE.read_text())["g1"]["async_saves"][-1]
    h200 = json.loads(H200_FAULT.read_text())["metrics"]
    lab = json.loads(LAB_FAULT.read_text())["metrics"]["node_loss"]
    return Inputs(
        rank_write_gbps=best,
        rank_write_src=best_src,
        node_direct_write_gbps=disk["direct_write_gbps"],
        node_direct_read_gbps=disk["direct_read_gbps"],
        disk_src=disk_src,
        rank_verify_gbps=verify,
        rank_load_gbps=load,
        load_src=load_src,
        async_blocking_s_per_gb=warm["blocking_s"] / (warm["bytes"] / 1e9),
        async_src=f"{_rel(ENGINE)} (g1, warm async save)",
        restart_floor_s=h200["floor"]["downtime_s"],
        trainer_kill_s=h200["trainer_kill"]["downtime_s"],
        h200_fault_src=_rel(H200_FAULT),
        slurm_node_loss_s=lab["downtime_s"],
        slurm_detect_s=lab["detect_s"],
        lab_fault_src=_rel(LAB_FAULT),
    )


def model(i: Inputs) -> dict[str, float]:
    total_gb = PARAMS * BYTES_PER_PARAM / 1e9
    rank_gb = total_gb / GPUS
    node_gb = rank_gb * GPUS_PER_NODE
    nodes = GPUS // GPUS_PER_NODE
    m = {"total_gb": total_gb, "rank_gb": rank_gb, "node_gb": node_gb, "nodes": nodes}
    # save: each rank at its own measured rate, unless the storage under it is slower
    m["save_rank_bound_s"] = rank_gb / i.rank_write_gbps
    m["save_local_disk_s"] = max(m["save_rank_bound_s"], node_gb / i.node_direct_write_gbps)
    m["save_needs_aggregate_gbps"] = total_gb / TARGETS["checkpoint_s"]
    m["save_needs_node_gbps"] = node_gb / TARGETS["checkpoint_s"]
    m["async_blocking_s"] = rank_gb * i.async_blocking_s_per_gb
    # load: the verify pass reads every byte from the storage, megatron's load then reads the page cache
    read_rank_s = rank_gb / i.rank_verify_gbps + rank_gb / i.rank_load_gbps
    m["load_rank_bound_s"] = read_rank_s
    m["load_local_disk_s"] = max(read_rank_s, node_gb / i.node_direct_read_gbps + rank_gb / i.rank_load_gbps)
    # resume after a requeue: Slurm's requeue and launch (the lab's node loss minus its detection), the
    # process start with CUDA + NCCL (the H200 pair's fresh-launch floor), then the load
    launch_s = max(i.slurm_node_loss_s - i.slurm_detect_s, 0.0)
    m["resume_s"] = launch_s + i.restart_floor_s + m["load_local_disk_s"]
    budget = TARGETS["resume_s"] - launch_s - i.restart_floor_s
    # the read rate the storage must give for the resume target: the load's page-cache part stays
    m["resume_needs_aggregate_gbps"] = (
        total_gb / max(budget - rank_gb / i.rank_load_gbps, 1e-9) if budget > 0 else float("inf")
    )
    m["recovery_node_loss_s"] = i.slurm_detect_s + m["resume_s"]
    m["recovery_rank_crash_s"] = i.trainer_kill_s + m["load_local_disk_s"]
    return m


def _verdict(value: float, target: float) -> str:
    return f"{'meets' if value <= target else 'misses'} the {target:.0f} s target ({value / target:.2f}x)"


def _table(head: str, rows: list[tuple[str, str, str]]) -> str:
    return "\n".join([head, "|---|---|---|", *(f"| {a} | {b} | {c} |" for a, b, c in rows)])


def render(i: Inputs, m: dict[str, float]) -> str:
    t = TARGETS
    launch = i.slurm_node_loss_s - i.slurm_detect_s
    inputs_table = _table(
        "| rate | value | from |",
        [
            ("one rank's synchronous save (warm, shards fsynced and hashed)", f"{i.rank_write_gbps:.2f} GB/s",
             i.rank_write_src),
            ("the node disk, direct write / direct read (dd)",
             f"{i.node_direct_write_gbps:.2f} / {i.node_direct_read_gbps:.2f} GB/s", i.disk_src),
            ("a cold load's verify pass (every byte from the disk) / megatron's load after it",
             f"{i.rank_verify_gbps:.2f} / {i.rank_load_gbps:.2f} GB/s", i.load_src),
            ("async save, time the step loop is blocked", f"{i.async_blocking_s_per_gb:.3f} s per GB",
             i.async_src),
            ("fresh launch from a checkpoint on the H200 pair (process, CUDA, NCCL, its load, first step)",
             f"{i.restart_floor_s:.1f} s", i.h200_fault_src),
            ("a killed rank restarted in place by the agent (H200 pair)", f"{i.trainer_kill_s:.1f} s",
             i.h200_fault_src),
            ("node lost -> first new step through Slurm's requeue (CPU lab), of which detection",
             f"{i.slurm_node_loss_s:.1f} s, {i.slurm_detect_s:.1f} s", i.lab_fault_src),
        ],
    )  # fmt: skip
    results_table = _table(
        "| question | computed | verdict |",
        [
            (f"checkpoint <= {t['checkpoint_s']:.0f} s? ranks at their measured rate, storage unlimited",
             f"{m['save_rank_bound_s']:.1f} s", _verdict(m["save_rank_bound_s"], t["checkpoint_s"])),
            ("the same on each node's local disk (this machine's)", f"{m['save_local_disk_s']:.1f} s",
             _verdict(m["save_local_disk_s"], t["checkpoint_s"])),
            ("async save: step loop blocked", f"{m['async_blocking_s']:.2f} s",
             "the write itself overlaps training"),
            (f"resume <= {t['resume_s']:.0f} s? requeue + launch + load from local disks",
             f"{m['resume_s']:.1f} s", _verdict(m["resume_s"], t["resume_s"])),
            (f"recovery from a lost node <= {t['recovery_s']:.0f} s? detection + resume",
             f"{m['recovery_node_loss_s']:.1f} s", _verdict(m["recovery_node_loss_s"], t["recovery_s"])),
            ("recovery from a crashed rank (in-place restart + load)", f"{m['recovery_rank_crash_s']:.1f} s",
             _verdict(m["recovery_rank_crash_s"], t["recovery_s"])),
        ],
    )  # fmt: skip
    return f"""# Scale: the 70B model on 64 H200, computed from what was measured here

Generated by `python benchmarks/scale_model.py` from the result files named below (`--check` in the
tests keeps it current). The case: {PARAMS / 1e9:.0f}B parameters on {m["nodes"]:.0f} nodes x \
{GPUS_PER_NODE} H200 (TP8 x PP4 x DP2), bf16 weights, fp32 master weights and Adam moments sharded over
DP (distributed optimizer), every rank writing 1/{GPUS} of the checkpoint: {BYTES_PER_PARAM} bytes per
parameter = **{m["total_gb"]:.0f} GB** per checkpoint, {m["rank_gb"]:.1f} GB per rank, \
{m["node_gb"]:.0f} GB per node.

## Inputs (measured)

{inputs_table}

## Results

{results_table}

## What the storage must give

- Checkpoint in {t["checkpoint_s"]:.0f} s: **{m["save_needs_aggregate_gbps"]:.1f} GB/s** of aggregate \
write bandwidth ({m["save_needs_node_gbps"]:.2f} GB/s per node). One rank's measured rate \
({i.rank_write_gbps:.2f} GB/s) is enough per rank; this machine's disk ({i.node_direct_write_gbps:.2f} \
GB/s direct) is not enough per node, so the checkpoint needs a parallel filesystem (or node-local NVMe \
RAID) of at least that bandwidth.
- Resume in {t["resume_s"]:.0f} s: **{m["resume_needs_aggregate_gbps"]:.1f} GB/s** of aggregate read \
bandwidth, after the requeue and launch ({launch:.1f} s) and the process start ({i.restart_floor_s:.1f} s), \
measured.

## Where the model breaks

- The per-rank rates come from one H200 machine writing to its own disk (one rank); 64 ranks on a shared
  filesystem contend for its metadata and bandwidth, which is the storage figure above, not measured here.
- The per-rank save rate is the best measured so far (issue 17: 4-16 writers per rank and NVRx are not
  measured yet); a faster rank only helps where the storage keeps up.
- The launch time is the CPU lab's Slurm requeue (Slurm 22.05, SlurmdTimeout and the requeue delay of
  the lab's spec); a production controller with 8 nodes adds the scheduler's cycle and the node's boot
  checks (prolog, health check) not measured here.
- The fresh-launch floor was measured for a 0.36B model and includes that model's own small load; 70B
  adds model construction and NCCL communicator set-up for TP8 x PP4 x DP2 over InfiniBand (none here).
- Lost work (on average half a save interval of steps) is not in the recovery figure; with async saves
  the interval can be short because the step loop pays only the blocking part.
"""


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--check", action="store_true", help="compare with docs/scale.md instead of writing it")
    a = ap.parse_args(argv)
    i = inputs()
    text = render(i, model(i))
    return write_or_check(OUT, text, REPO, "python benchmarks/scale_model.py", a.check)


if __name__ == "__main__":
    sys.exit(main())
