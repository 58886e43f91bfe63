#!/usr/bin/env bash
# Recovery paths of one rank on one GPU, in one call (issue 17, recovery speed):
#   bash benchmarks/restart_paths.sh OUTDIR     # a GPU machine with NVRx (>= 0.6) in .whl/ or installed
# The same trainer, shape and checkpoint (saved at step SAVE), the fault at step FAULT of attempt 0:
#   agent_kill     kill -9 of the trainer under the project's agent (lcm_runner.launch.agent): a forked
#                  restart from its pre-imported zygote, a new CUDA context, NCCL group, checkpoint load
#   agent_raise    an exception in the trainer under the agent: the process exits 1, the same restart
#   inprocess      the exception under --inprocess-restart (NVRx): the same process keeps its CUDA
#                  context and imports; NVRx aborts the NCCL group and calls the trainer again
#   agent_kill_warm / agent_raise_warm   the agent cases with --warm-ranks --host-copy: the new rank is a
#                  spare forked (and its CUDA context made) before the fault, and it restores from the
#                  host copy the dead rank left in shared memory (docs/training.md, "Fast process restarts")
# Each: fault -> first new step (and its phases from the telemetry) in OUTDIR/summary.{json,md}
# (benchmarks/restart_paths.py). About 3 minutes on one H200.
set -uo pipefail
OUTDIR=${1:?usage: restart_paths.sh OUTDIR}
mkdir -p "$OUTDIR"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
export PYTHONWARNINGS=ignore CUDA_DEVICE_MAX_CONNECTIONS=1 TORCH_CPP_LOG_LEVEL=error
REPO=$PWD
WORK=${LCM_WORK:-/tmp/lcm-restart-bench}
rm -rf "$WORK"; mkdir -p "$WORK/site"
PYPATH=$REPO${PYTHONPATH:+:$PYTHONPATH}
for w in megatron_core nvidia_resiliency_ext defusedxml; do  # defusedxml: NVRx's one pure-Python dependency
  mod=${w/megatron_core/megatron.core}
  if ! python3 -c "import $mod" 2>/dev/null && compgen -G ".whl/$w-*.whl" >/dev/null; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$WORK/site" .whl/$w-*.whl
    PYPATH=$WORK/site:$PYPATH
  fi
done
export PYTHONPATH=$PYPATH
python3 -c 'import torch, megatron.core as m, nvidia_resiliency_ext as n; print("torch", torch.__version__, "megatron-core", m.__version__, "nvrx", n.__version__)' | tee "$OUTDIR/env.txt"
STEPS=${STEPS:-10}; SAVE=${SAVE:-5}; FAULT=${FAULT:-7}
SHAPE=${SHAPE:-"--num-layers 2 --hidden-size 1024 --num-attention-heads 16 --ffn-hidden-size 4096 --seq-length 4096
  --max-position-embeddings 4096 --micro-batch-size 2 --global-batch-size 2 --num-experts 8 --moe-router-topk 2
  --vocab-size 32768 --bf16 --lr 1e-4 --use-flash-attn --moe-grouped-gemm"}
COMMON="$SHAPE --device ${DEVICE:-cuda} --train-iters $STEPS --save-interval $SAVE --keep-last 2"
port=29710
case_run() {  # name launcher fault-flags...
  local name=$1 launcher=$2; shift 2
  local d=$OUTDIR/$name; mkdir -p "$d"; port=$((port + 10))
  echo "=== $name $(date -u +%T)"
  local t0=$SECONDS
  if [ "$launcher" = agent ]; then
    timeout 300 python3 -m lcm_runner.launch.agent --nnodes 1 --node-rank 0 --nproc-per-node 1 \
      --master-addr 127.0.0.1 --master-port $port --max-restarts 2 --events "$d/agent.jsonl" $AGENT_FLAGS -- \
      $COMMON --save "$WORK/$name/ckpt" --telemetry-dir "$d/telemetry" "$@" >"$d/console.log" 2>&1
  else
    MASTER_ADDR=127.0.0.1 MASTER_PORT=$port RANK=0 LOCAL_RANK=0 WORLD_SIZE=1 timeout 300 python3 -m lcm_runner.train \
      $COMMON --save "$WORK/$name/ckpt" --telemetry-dir "$d/telemetry" "$@" >"$d/console.log" 2>&1
  fi
  echo "rc=$? wall=$((SECONDS - t0))s"
  grep -h "fault injection" "$d/console.log" | head -2
  rm -rf "$WORK/$name"
}
CASES_RUN=${CASES_RUN:-"agent_kill agent_raise inprocess"}
for c in $CASES_RUN; do
  AGENT_FLAGS=""
  case $c in
    *_warm) AGENT_FLAGS=${WARM_FLAGS:-"--warm-ranks --host-copy"} ;;  # WARM_FLAGS: one of them alone
  esac
  case $c in
    agent_kill) case_run agent_kill agent --fault-kill-at-step "$FAULT" ;;
    agent_raise) case_run agent_raise agent --fault-raise-at-step "$FAULT" ;;
    agent_kill_warm) case_run agent_kill_warm agent --fault-kill-at-step "$FAULT" ;;
    agent_raise_warm) case_run agent_raise_warm agent --fault-raise-at-step "$FAULT" ;;
    inprocess) case_run inprocess direct --fault-raise-at-step "$FAULT" --inprocess-restart ;;
    inprocess_fast)  # NVRx's intervals at 0.1 s instead of 1 s
      case_run inprocess_fast direct --fault-raise-at-step "$FAULT" --inprocess-restart --inprocess-interval-s 0.1 ;;
  esac
done
python3 "$REPO/benchmarks/restart_paths.py" "$OUTDIR"
