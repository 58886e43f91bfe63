#!/usr/bin/env bash
# The training engine on real GPUs (issue 5): baseline, save, resume, continuation check, on one H200 and
# (when two GPUs are visible) EP=2 across two. Run from the repository root on the GPU machine:
#   bash docs/results/h200-engine/run_h200.sh OUTDIR
# Needs megatron-core's cp312 wheel in .whl/ (python3 -m pip download ... megatron-core==0.19.2) unless
# megatron-core is installed. Overridable for a CPU dry run: LCM_DEVICE=cpu, LCM_MODEL="...", LCM_N, LCM_K.
set -uo pipefail
OUTDIR=${1:?usage: run_h200.sh OUTDIR}
mkdir -p "$OUTDIR"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
export PYTHONWARNINGS=ignore
if ! python3 -c "import importlib.util as u; assert u.find_spec(\"megatron\")" 2>/dev/null && ls .whl/megatron_core-*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
    .whl/megatron_core-*.whl || exit 1
  export PYTHONPATH=/tmp/site:$PWD
else
  export PYTHONPATH=$PWD
fi
DEVICE=${LCM_DEVICE:-cuda}
MODEL=${LCM_MODEL:-"--num-layers 4 --hidden-size 1024 --num-attention-heads 16 --ffn-hidden-size 4096 \
  --seq-length 4096 --micro-batch-size 2 --num-experts 8 --moe-router-topk 2 --vocab-size 32768 --bf16 \
  --lr 1e-4 --distributed-timeout-minutes 5"}
N=${LCM_N:-30}   # steps of the uninterrupted reference
K=${LCM_K:-15}   # async save here while training goes on; the first part stops at K+5
WORK=${LCM_WORK:-/tmp/lcm-h200}
rm -rf "$WORK"; mkdir -p "$WORK"
NGPU=$(python3 -c 'import torch; print(torch.cuda.device_count())')
{
  date -u; uname -r; nvidia-smi -L 2>/dev/null; nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv 2>/dev/null
  python3 -c 'import torch, sys; print("python", sys.version.split()[0], "torch", torch.__version__, "cuda", torch.version.cuda, "nccl", torch.cuda.nccl.version() if torch.cuda.is_available() else None)'
  python3 -c 'import megatron.core as m; print("megatron-core", m.__version__)' 2>&1 | tail -1
  df -h "$WORK" | tail -1
} > "$OUTDIR/env.txt" 2>&1
cat "$OUTDIR/env.txt"

launch() {  # tag nproc logname -- trainer args...
  local tag=$1 nproc=$2 name=$3; shift 4
  local dir=$WORK/$tag
  mkdir -p "$dir"
  echo "=== $tag/$name: nproc $nproc $(date -u +%T)"
  local t0=$SECONDS rc
  if [ "$nproc" = 1 ]; then
    CUDA_VISIBLE_DEVICES=0 timeout 200 python3 -m lcm_runner.train $MODEL --device "$DEVICE" "$@" \
      --telemetry-dir "$dir/telemetry-$name" >"$dir/$name.log" 2>&1
  else
    timeout 200 python3 -m torch.distributed.run --standalone --nproc-per-node "$nproc" -m lcm_runner.train \
      $MODEL --device "$DEVICE" "$@" --telemetry-dir "$dir/telemetry-$name" >"$dir/$name.log" 2>&1
  fi
  rc=$?
  echo "rc=$rc wall=$((SECONDS - t0))s"; grep -E "^step|error|Error" "$dir/$name.log" | tail -4
  return $rc
}

config() {  # tag nproc extra-args
  local tag=$1 nproc=$2; shift 2
  local ck=$WORK/$tag
  launch "$tag" "$nproc" ref -- "$@" --train-iters "$N" --save "$ck/ref-ckpt" --log-interval 5 || return 1
  launch "$tag" "$nproc" part1 -- "$@" --train-iters $((K + 5)) --save "$ck/ckpt" --save-interval "$K" \
    --async-save --log-interval 5 || return 1
  launch "$tag" "$nproc" part2 -- "$@" --train-iters "$N" --save "$ck/ckpt" --log-interval 5 || return 1
  du -sb "$ck/ref-ckpt"/iter_* "$ck/ckpt"/iter_* 2>/dev/null
}

config g1 1 && echo "g1 done"
if [ "$NGPU" -ge 2 ] || [ "$DEVICE" = cpu ]; then
  config g2ep2 2 --expert-model-parallel-size 2 && echo "g2ep2 done"
fi
python3 docs/results/h200-engine/summarize.py "$WORK" "$OUTDIR/summary.json"
tar -C "$WORK" --exclude='*ckpt*' -czf "$OUTDIR/runs.tar.gz" .
