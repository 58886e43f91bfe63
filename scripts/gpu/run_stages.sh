#!/usr/bin/env bash
# Run `lcm-runner all` (baseline, resume, fault, nccl-profile, report) on ONE GPU machine with the
# torchrun launcher: no Slurm there, the GPUs are split into two local "nodes" (one agent each, its
# own CUDA_VISIBLE_DEVICES half), the rendezvous is on 127.0.0.1. With a single GPU: one local node of one
# rank (the node-loss case relaunches it on a spare node label, on the same GPU). See docs/runner.md
# ("On an H200 box") and docs/megatron-lm.md.
#
#   scripts/gpu/run_stages.sh                 # wheels in .whl/, results under runs/ (and $OUT if set)
#   WHEELS=/path/to/wheels STEPS=60 scripts/gpu/run_stages.sh
#   MEGATRON_LM=/path/to/Megatron-LM scripts/gpu/run_stages.sh   # the stages on the user's pretrain_gpt.py
#
# Inputs (environment):
#   WHEELS   folder of wheels to install (lcm_runner + megatron-core + whatever the box lacks); default .whl
#   VENV     virtualenv to create (system site packages visible: the box's CUDA torch is used); .venv-gpu;
#            `none`: the box's python3 as it is, wheels installed into .cache/gpu-site
#   STEPS    train_iters (default 60; checkpoints every STEPS/3, the fault kill at STEPS/2)
#   INVENTORY  a cluster spec (inventories/<name>) to render nccl_env.sh from and check NCCL against
#   OUT      if set, the run directory is copied there at the end (the device tool brings $OUT back)
#   SAVE     save_interval (default max(5, STEPS/3))
#   CKPT_DIR the checkpoints' root (default: inside the run directory)
#   FAULT_CASES  comma-separated fault cases (default: all); ONLY: lcm-runner all --only (default: every stage)
#   RUN_DIR  one run directory to use (default: a new one under $RUNS): two calls with the same RUN_DIR
#            and different ONLY build one report (each call's stages/*.json stay; the report reads them all)
#   MEGATRON_LM  a Megatron-LM checkout, or a .tar.gz of one (extracted under $WORK): `workload: megatron-lm`
#            with MEGATRON_ARGS (default: a small MoE GPT, mock data, the local transformer implementation)
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
if [ "$GPUS" -lt 1 ]; then
  echo "run_stages.sh: no GPU listed by nvidia-smi" >&2
  exit 2
fi
if [ "$GPUS" -eq 1 ]; then NODES=1; PER_NODE=1; else NODES=2; PER_NODE=$((GPUS / 2)); fi
echo "== $GPUS GPU(s): $NODES local node(s) x $PER_NODE rank(s)"
nvidia-smi --query-gpu=index,name,driver_version,memory.total --format=csv,noheader

if [ "$VENV" = none ]; then
  # the box's python3 itself (e.g. a python3 that is already a virtualenv, whose packages a nested
  # --system-site-packages venv would not see); the wheels go to a folder on PYTHONPATH
  PY=$(command -v python3)
  if compgen -G "$WHEELS/*.whl" >/dev/null; then
    "$PY" -m pip install --quiet --no-index --no-deps --target .cache/gpu-site "$WHEELS"/*.whl
    export PYTHONPATH="$PWD/.cache/gpu-site${PYTHONPATH:+:$PYTHONPATH}"
  fi
else
  if [ ! -x "$VENV/bin/python" ]; then
    python3 -m venv --system-site-packages "$VENV"
  fi
  PY="$VENV/bin/python"
  if compgen -G "$WHEELS/*.whl" >/dev/null; then
    # --no-deps: the box's own torch (CUDA build) stays; the wheels bring what is missing
    "$PY" -m pip install --quiet --no-index --no-deps --find-links "$WHEELS" "$WHEELS"/*.whl
  fi
fi
if ! "$PY" -c 'import lcm_runner' 2>/dev/null; then
  # this checkout, without installing it: every process the runner starts inherits PYTHONPATH
  export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
fi
LCM_RUNNER=("$PY" -m lcm_runner)
MLM_DIR=""
if [ -n "${MEGATRON_LM:-}" ]; then
  if [ -f "$MEGATRON_LM" ]; then  # an archive of the checkout (the offline mirror's)
    WORK=${WORK:-/tmp/lcm-megatron}
    rm -rf "$WORK" && mkdir -p "$WORK" && tar -C "$WORK" -xzf "$MEGATRON_LM"
    MLM_DIR=$(find "$WORK" -mindepth 2 -maxdepth 2 -name pretrain_gpt.py -printf '%h\n' | head -1)
  else
    MLM_DIR=$(cd "$MEGATRON_LM" && pwd)
  fi
  [ -f "$MLM_DIR/pretrain_gpt.py" ] || { echo "run_stages.sh: no pretrain_gpt.py in $MEGATRON_LM" >&2; exit 2; }
  echo "== workload megatron-lm: $MLM_DIR"
fi
MLM_DIR="$MLM_DIR" "$PY" - <<'PYCHECK'
import os, sys, torch, lcm_runner  # noqa: F401
assert torch.cuda.is_available(), "torch sees no CUDA device"
if os.environ["MLM_DIR"]:
    sys.path.insert(0, os.environ["MLM_DIR"])  # its in-tree megatron/core, as pretrain_gpt.py sees it
import megatron.core
print(f"torch {torch.__version__} cuda {torch.version.cuda} nccl {torch.cuda.nccl.version()}; "
      f"megatron-core {megatron.core.__version__} ({megatron.core.__file__})")
PYCHECK
# The user's Megatron-LM arguments (the runner adds --save/--load/--save-interval/--train-iters/
# --log-interval/--exit-signal-handler/--distributed-backend and says so). The default: a small MoE GPT
# (88M parameters: its checkpoint, about 1 GB with the optimizer state, writes in seconds) with the flags
# Megatron-LM core_v0.19.0 ran with on these machines (docs/machines.md).
MEGATRON_ARGS=${MEGATRON_ARGS:-"--num-layers 4 --hidden-size 512 --num-attention-heads 8 --ffn-hidden-size 2048
  --seq-length 4096 --max-position-embeddings 4096 --micro-batch-size 2 --global-batch-size $((2 * GPUS))
  --num-experts 8 --moe-router-topk 2 --moe-token-dispatcher-type alltoall --vocab-size 32768 --bf16
  --lr 1e-4 --min-lr 1e-5 --lr-decay-style cosine --mock-data --tokenizer-type NullTokenizer
  --transformer-impl local --no-persist-layer-norm --no-gradient-accumulation-fusion
  --no-masked-softmax-fusion --no-bias-gelu-fusion --no-bias-swiglu-fusion --disable-bias-linear
  --hidden-dropout 0 --attention-dropout 0 --position-embedding-type learned_absolute --eval-iters 0
  --eval-interval 100000 --split 100,0,0 --seed 1234"}

CFG=$(mktemp --suffix=.yml)
MLM_DIR="$MLM_DIR" MEGATRON_ARGS="$MEGATRON_ARGS" SAVE="${SAVE:-}" CKPT_DIR="${CKPT_DIR:-}" FAULT_CASES="${FAULT_CASES:-}" \
"$PY" - "$CFG" "$GPUS" "$PER_NODE" "$STEPS" "$SEQ_LENGTH" "$MBS" "$NODES" <<'PYCFG'
import os, sys, yaml
out, gpus, per_node, steps = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
seq, mbs, nodes = int(sys.argv[5]), int(sys.argv[6]), int(sys.argv[7])
save = int(os.environ["SAVE"]) if os.environ.get("SAVE") else max(5, steps // 3)
mlm = os.environ.get("MLM_DIR", "")
cfg = {
    "name": f"h200-local-{gpus}gpu" + ("-megatron-lm" if mlm else ""),
    "launcher": "torchrun",
    "agent": "lcm",
    "nodes": nodes,
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
        "moe_grouped_gemm": True,
    },
    "fault": {"kill_at_step": save + save // 2, "kill_node": nodes - 1},
}
if os.environ.get("FAULT_CASES"):
    cfg["fault"]["cases"] = os.environ["FAULT_CASES"].split(",")
if os.environ.get("CKPT_DIR"):
    cfg["checkpoint_dir"] = os.environ["CKPT_DIR"]
if mlm:  # the user's own trainer: the model is in its arguments, not in `model`
    del cfg["model"]
    cfg["workload"] = {"kind": "megatron-lm", "path": mlm, "args": os.environ["MEGATRON_ARGS"].split()}
yaml.safe_dump(cfg, open(out, "w"), sort_keys=False)
print(open(out).read())
PYCFG

RUNS=${RUNS:-runs}
mkdir -p "$RUNS"
ARGS=(all -c "$CFG" --launcher torchrun --spare-nodes 1 --timeout 1200)
if [ -n "${RUN_DIR:-}" ]; then ARGS+=(--run-dir "$RUN_DIR"); else ARGS+=(--runs-root "$RUNS"); fi
[ -n "${INVENTORY:-}" ] && ARGS+=(-i "$INVENTORY")
[ -n "${ONLY:-}" ] && ARGS+=(--only "$ONLY")
set +e
"${LCM_RUNNER[@]}" "${ARGS[@]}" 2>&1 | tee "$RUNS/last-gpu-all.log"
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
