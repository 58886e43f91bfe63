#!/usr/bin/env bash
# Run `lcm-runner all` (baseline, resume, fault, nccl-profile, report) on ONE GPU machine with the
# torchrun launcher: no Slurm there, the GPUs are split into two local "nodes" (one agent each, its
# own CUDA_VISIBLE_DEVICES half), the rendezvous is on 127.0.0.1. See docs/runner.md ("On an H200 box").
#
#   scripts/gpu/run_stages.sh                 # wheels in .whl/, results under runs/ (and $OUT if set)
#   WHEELS=/path/to/wheels STEPS=60 scripts/gpu/run_stages.sh
#
# Inputs (environment):
#   WHEELS   folder of wheels to install (lcm_runner + megatron-core + whatever the box lacks); default .whl
#   VENV     virtualenv to create (system site packages visible: the box's CUDA torch is used); .venv-gpu
#   STEPS    train_iters (default 60; checkpoints every STEPS/3, the fault kill at STEPS/2)
#   INVENTORY  a cluster spec (inventories/<name>) to render nccl_env.sh from and check NCCL against
#   OUT      if set, the run directory is copied there at the end (the device tool brings $OUT back)
set -euo pipefail
cd "$(dirname "$0")/../.."

WHEELS=${WHEELS:-.whl}
VENV=${VENV:-.venv-gpu}
STEPS=${STEPS:-60}
SEQ_LENGTH=${SEQ_LENGTH:-4096}
MBS=${MBS:-2}
# The lent dev GPUs share an NVSwitch host: NVLink multicast (NVLS) stays off there. Production
# NVSwitch systems enable it (NCCL_NVLS_ENABLE=1 from the spec).
export NCCL_NVLS_ENABLE=${NCCL_NVLS_ENABLE:-0} TORCH_SYMM_MEM_DISABLE_MULTICAST=${TORCH_SYMM_MEM_DISABLE_MULTICAST:-1}
export NVSHMEM_DISABLE_NVLS=${NVSHMEM_DISABLE_NVLS:-1}

command -v nvidia-smi >/dev/null || { echo "run_stages.sh: nvidia-smi not found: this script is for a GPU machine" >&2; exit 2; }
GPUS=$(nvidia-smi -L | grep -c '^GPU ')
if [ "$GPUS" -lt 2 ]; then
  echo "run_stages.sh: $GPUS GPU(s): the stages need at least 2 (two local nodes of >= 1 GPU)" >&2
  exit 2
fi
PER_NODE=$((GPUS / 2))
echo "== $GPUS GPU(s): 2 local nodes x $PER_NODE rank(s)"
nvidia-smi --query-gpu=index,name,driver_version,memory.total --format=csv,noheader

if [ ! -x "$VENV/bin/python" ]; then
  python3 -m venv --system-site-packages "$VENV"
fi
PY="$VENV/bin/python"
if compgen -G "$WHEELS/*.whl" >/dev/null; then
  # --no-deps: the box's own torch (CUDA build) stays; the wheels bring what is missing
  "$PY" -m pip install --quiet --no-index --no-deps --find-links "$WHEELS" "$WHEELS"/*.whl
else
  echo "run_stages.sh: no wheels in $WHEELS; installing this checkout (no dependencies)" >&2
  "$PY" -m pip install --quiet --no-deps --no-build-isolation -e .
fi
"$PY" - <<'PYCHECK'
import torch, megatron.core, lcm_runner  # noqa: F401
assert torch.cuda.is_available(), "torch sees no CUDA device"
print(f"torch {torch.__version__} cuda {torch.version.cuda} nccl {torch.cuda.nccl.version()}; "
      f"megatron-core {megatron.core.__version__}")
PYCHECK

CFG=$(mktemp --suffix=.yml)
"$PY" - "$CFG" "$GPUS" "$PER_NODE" "$STEPS" "$SEQ_LENGTH" "$MBS" <<'PYCFG'
import sys, yaml
out, gpus, per_node, steps = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
seq, mbs = int(sys.argv[5]), int(sys.argv[6])
save = max(5, steps // 3)
cfg = {
    "name": f"h200-local-{gpus}gpu",
    "launcher": "torchrun",
    "agent": "lcm",
    "nodes": 2,
    "gpus_per_node": per_node,
    "procs_per_node": per_node,
    "train_iters": steps,
    "save_interval": save,
    "keep_last": 2,
    "max_restarts": 2,
    "rdzv_join_timeout_s": 60,
    "hb_timeout_s": 5.0,
    "master_port": 29500,
    "python": sys.executable,
    # the model measured on an H200 pair (docs/machines.md): EP=2 alltoall, 8 experts top-2, bf16
    "model": {
        "num_layers": 4, "hidden_size": 1024, "num_attention_heads": 16, "ffn_hidden_size": 4096,
        "seq_length": seq, "micro_batch_size": mbs, "global_batch_size": mbs * gpus,
        "tp": 1, "pp": 1, "ep": 2, "num_experts": 8, "moe_router_topk": 2, "bf16": True,
    },
    "fault": {"kill_at_step": save + save // 2, "kill_node": 1},
}
yaml.safe_dump(cfg, open(out, "w"), sort_keys=False)
print(open(out).read())
PYCFG

RUNS=${RUNS:-runs}
mkdir -p "$RUNS"
ARGS=(all -c "$CFG" --launcher torchrun --runs-root "$RUNS" --spare-nodes 1 --timeout 1200)
[ -n "${INVENTORY:-}" ] && ARGS+=(-i "$INVENTORY")
set +e
"$VENV/bin/lcm-runner" "${ARGS[@]}" 2>&1 | tee "$RUNS/last-gpu-all.log"
rc=${PIPESTATUS[0]}
set -e
RUN_DIR=$(grep -m1 '^run dir: ' "$RUNS/last-gpu-all.log" | cut -d' ' -f3-)
cp "$CFG" "$RUN_DIR/run.yml" 2>/dev/null || true
if [ -n "${OUT:-}" ] && [ -n "$RUN_DIR" ]; then
  mkdir -p "$OUT"
  # everything but the checkpoints (GBs) comes back
  tar -C "$(dirname "$RUN_DIR")" --exclude=checkpoints -cf - "$(basename "$RUN_DIR")" | tar -C "$OUT" -xf -
  cp "$RUNS/last-gpu-all.log" "$OUT/"
fi
echo "== lcm-runner all exited $rc; run dir $RUN_DIR"
exit "$rc"
