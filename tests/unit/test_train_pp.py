"""Pipeline parallelism, SDPA attention and per-collective communication time on CPU (gloo), tiny MoE GPT.

- From one checkpoint of a single-process run, PP=2 (2 ranks) and TP2 x PP2 x EP2 (8 ranks, DP 2) train
  the next steps like the single process: PP=2 bitwise (the stages compute the same operations in the
  same order), TP2 x PP2 x EP2 within 1e-5 relative (TP splits the matmuls' and the cross entropy's sums,
  DP averages the loss of two halves of the batch: fp32 rounding, seen ~5e-7).
- PP=2 saves and resumes bitwise (a resumed run's steps equal the uninterrupted run's).
- --use-flash-attn on CPU (SDPA's math path) trains bitwise like the unfused path at head size 16.
- The 8-rank run's step records carry the MoE all-to-all, the pipeline transfers and the gradient
  reduction, and comm_time_s is their sum.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
from trainruns import REPO, Run, _env, run_direct, run_one

from lcm_runner.telemetry import load_run, of_event, steps

pytestmark = pytest.mark.slow

TINY = [
    "--num-layers", "2", "--hidden-size", "32", "--num-attention-heads", "4", "--ffn-hidden-size", "64",
    "--seq-length", "32", "--micro-batch-size", "2", "--global-batch-size", "8", "--vocab-size", "64",
    "--num-experts", "4", "--moe-router-topk", "2", "--lr", "3e-3", "--seed", "1234", "--device", "cpu",
]  # fmt: skip
CONTINUE = ["--train-iters", "5", "--no-load-optim", "--no-load-rng"]  # steps 3-5 from the step-2 checkpoint


def one_process(run_dir: Path, argv: list[str]) -> Run:
    code, out = run_one(
        run_dir, [*argv, "--telemetry-dir", str(run_dir / "telemetry")], _env(uuid.uuid4().hex)
    )
    return Run(run_dir, [code], "", out[-6000:])


def losses(run: Run) -> dict[int, float]:
    return {s: float.fromhex(h) for s, h in run.losses().items()}


@pytest.fixture(scope="module")
def base(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A single-process checkpoint at step 2, and that process's own continuation (steps 3-5)."""
    d = tmp_path_factory.mktemp("base")
    run = one_process(
        d / "train", [*TINY, "--train-iters", "2", "--save", str(d / "ckpt"), "--save-interval", "2"]
    )
    assert run.codes == [0], run.log
    return d


@pytest.fixture(scope="module")
def single(base: Path) -> dict[int, float]:
    run = one_process(
        base / "one", [*TINY, *CONTINUE, "--load", str(base / "ckpt"), "--save", str(base / "one-ck")]
    )
    assert run.codes == [0], run.log
    out = losses(run)
    assert sorted(out) == [3, 4, 5]
    return out


def test_pp2_trains_bitwise_like_one_process(base: Path, single: dict[int, float], tmp_path: Path) -> None:
    run = run_direct(
        tmp_path, [*CONTINUE, "--load", str(base / "ckpt"), "--save", str(tmp_path / "ck"),
                   "--pipeline-model-parallel-size", "2"],
        model=TINY, save=False,
    )  # fmt: skip
    assert run.codes == [0, 0], run.log
    assert losses(run) == single
    start = of_event(run.records(), "start", rank=1)[0]
    assert (start.get("pp"), start.get("dp")) == (2, 1)


def test_tp2_pp2_ep2_on_8_ranks_matches_one_process(
    base: Path, single: dict[int, float], tmp_path: Path
) -> None:
    """With the grouped expert GEMMs (the configs' choice; 2 local experts per rank, each split over the
    expert-TP pair) continuing the single process's SequentialMLP checkpoint."""
    run = run_direct(
        tmp_path,
        [*CONTINUE, "--load", str(base / "ckpt"), "--save", str(tmp_path / "ck"),
         "--tensor-model-parallel-size", "2", "--pipeline-model-parallel-size", "2",
         "--expert-model-parallel-size", "2", "--moe-grouped-gemm"],
        model=TINY, save=False, nproc=8,
    )  # fmt: skip
    assert run.codes == [0] * 8, run.log
    got = losses(run)
    assert sorted(got) == sorted(single)
    for step, want in single.items():
        assert math.isclose(got[step], want, rel_tol=1e-5), (step, got[step], want)
    recs = run.records()
    start = of_event(recs, "start", rank=0)[0]
    assert (start.get("tp"), start.get("pp"), start.get("ep"), start.get("dp")) == (2, 2, 2, 2)
    assert start.get("experts") == "grouped"
    # communication per collective: rank 0 is on the first stage (it sends activations, receives their
    # gradients), in a TP pair, an EP pair and a DP pair
    for rec in steps(recs, rank=0):
        comm = rec.get("comm")
        assert isinstance(comm, dict), rec.data
        for name in ("fwd-bwd:ep.all_to_all_single", "fwd-bwd:pp.batch_isend_irecv", "grad:dp.all_reduce",
                     "fwd-bwd:tp.all_gather_into_tensor", "loss:pp.all_reduce"):  # fmt: skip
            assert comm.get(name, 0) > 0, (name, comm)
        assert math.isclose(rec.get("comm_time_s"), sum(comm.values()), abs_tol=1e-5)
        assert 0 < rec.get("comm_time_s") < rec.get("step_time_s")
        grad = sum(v for k, v in comm.items() if k.startswith("grad:"))
        assert math.isclose(rec.get("comm_grad_reduce_s"), grad, abs_tol=1e-5)


def test_pp2_resumes_bitwise(tmp_path: Path) -> None:
    pp2 = [*TINY, "--pipeline-model-parallel-size", "2"]
    ref = run_direct(tmp_path / "ref", ["--train-iters", "6", "--save-interval", "3"], model=pp2)
    assert ref.codes == [0, 0], ref.log
    part1 = run_direct(tmp_path / "part", ["--train-iters", "3", "--save-interval", "3"], model=pp2)
    assert part1.codes == [0, 0], part1.log
    part2 = run_direct(tmp_path / "part", ["--train-iters", "6", "--save-interval", "3"], model=pp2)
    assert part2.codes == [0, 0], part2.log
    start = of_event(part2.records(), "start", rank=0)
    assert start[-1].get("resumed_from") == 3
    resumed = {s: h for s, h in part2.losses().items() if s > 3}
    assert resumed and resumed == {s: h for s, h in ref.losses().items() if s > 3}


def test_sdpa_attention_trains_bitwise_like_unfused_on_cpu(tmp_path: Path) -> None:
    model = list(TINY)
    model[model.index("--hidden-size") + 1] = "64"  # head size 64 / 4 = 16: the softmax scale is 1/4
    argv = [*model, "--train-iters", "3"]
    unfused = one_process(tmp_path / "unfused", argv)
    fused = one_process(tmp_path / "sdpa", [*argv, "--use-flash-attn"])
    assert unfused.codes == [0] and fused.codes == [0], unfused.log + fused.log
    assert losses(fused) == losses(unfused) and len(losses(fused)) == 3
    assert of_event(load_run(tmp_path / "sdpa"), "start")[0].get("attention") == "sdpa"
    assert of_event(load_run(tmp_path / "unfused"), "start")[0].get("attention") == "unfused"


@pytest.mark.parametrize(("head_dim", "exact"), [(16, True), (8, False), (64, False)])
def test_sdpa_module_matches_unfused_module(tmp_path: Path, head_dim: int, exact: bool) -> None:
    """The core-attention modules themselves (benchmarks/attention_core.py on CPU, fp32): output and
    gradients equal where the scale is a power of 4, else within float rounding."""
    out = tmp_path / "att.json"
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONWARNINGS="ignore")
    p = subprocess.run(
        [sys.executable, str(REPO / "benchmarks" / "attention_core.py"), "--seq", "64", "--reps", "1",
         "--head-dim", str(head_dim), "--heads", "4", "--out", str(out)],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert p.returncode == 0, p.stderr[-2000:]
    diff = json.loads(out.read_text())["difference"]
    if exact:
        assert diff == {"out_max_abs": 0.0, "out_max_rel": 0.0, "grad_max_abs": 0.0}
    else:
        assert diff["out_max_rel"] < 1e-5 and diff["grad_max_abs"] < 1e-4, diff


def test_grouped_experts_train_bitwise_like_sequential_and_read_its_checkpoint(
    base: Path, single: dict[int, float], tmp_path: Path
) -> None:
    """--moe-grouped-gemm (torch._grouped_mm, lcm_runner/train/experts.py) on CPU: the same losses to the
    last bit as megatron's SequentialMLP, from scratch and continuing SequentialMLP's own checkpoint (the
    checkpoint format is SequentialMLP's)."""
    argv = [*TINY, "--train-iters", "3"]
    seq = one_process(tmp_path / "seq", argv)
    grouped = one_process(tmp_path / "grouped", [*argv, "--moe-grouped-gemm"])
    assert seq.codes == [0] and grouped.codes == [0], seq.log + grouped.log
    assert losses(grouped) == losses(seq) and len(losses(grouped)) == 3
    assert of_event(load_run(tmp_path / "grouped"), "start")[0].get("experts") == "grouped"
    assert of_event(load_run(tmp_path / "seq"), "start")[0].get("experts") == "sequential"
    cont = one_process(
        tmp_path / "cont",
        [
            *TINY,
            *CONTINUE,
            "--moe-grouped-gemm",
            "--load",
            str(base / "ckpt"),
            "--save",
            str(tmp_path / "ck"),
        ],
    )
    assert cont.codes == [0], cont.log
    assert losses(cont) == single
