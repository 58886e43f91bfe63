#!/usr/bin/env bash
# The cold resume of one checkpoint by two versions of the trainer, alternated, in one call:
#   bash benchmarks/ckpt_load_ab.sh BASELINE OUTDIR     # BASELINE: a directory holding another lcm_runner/
# One synchronous save (ckpt_throughput.sh's shape: a 4.99 GB checkpoint, 8 writers) by this checkout, then
# ROUNDS x (baseline, this checkout): the page cache of the checkpoint dropped (posix_fadvise), then a
# resume from it (`--load`, one step, nothing saved). Each resume's telemetry (verify_s, load_s: the whole
# resume) in OUTDIR/<name>/telemetry; dd's direct read beside it in OUTDIR/disk.txt; the medians and their
# ratio in OUTDIR/summary.json (benchmarks/ckpt_load_ab.py). Needs megatron-core (or its wheel in .whl/).
set -uo pipefail
BASE=${1:?usage: ckpt_load_ab.sh BASELINE OUTDIR}
OUTDIR=${2:?usage: ckpt_load_ab.sh BASELINE OUTDIR}
BASE=$(cd "$BASE" && pwd)
mkdir -p "$OUTDIR"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
export PYTHONWARNINGS=ignore CUDA_DEVICE_MAX_CONNECTIONS=1
REPO=$PWD
ROUNDS=${ROUNDS:-2}
ROOT=${CKPT_ROOT:-$REPO/.cache/ckpt-ab}
WORK=${LCM_WORK:-/tmp/lcm-ckpt-ab}
rm -rf "$WORK" "$ROOT"; mkdir -p "$WORK/site" "$ROOT"
SITE=""
if ! python3 -c "import importlib.util as u; assert u.find_spec('megatron.core')" 2>/dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$WORK/site" \
    .whl/megatron_core-*.whl || exit 1
  SITE=$WORK/site:
fi
SHAPE=${SHAPE:-"--num-layers 4 --hidden-size 1024 --num-attention-heads 16 --ffn-hidden-size 4096 --seq-length 4096
  --max-position-embeddings 4096 --micro-batch-size 2 --global-batch-size 2 --num-experts 8 --moe-router-topk 2
  --vocab-size 32768 --bf16 --lr 1e-4 --use-flash-attn --moe-grouped-gemm"}
nvidia-smi -L >"$OUTDIR/gpu.txt" 2>&1
dd if=/dev/zero of="$ROOT/dd.bin" bs=16M count=320 oflag=direct 2>/dev/null
dd if="$ROOT/dd.bin" of=/dev/null bs=16M iflag=direct 2>&1 | tail -1 | tee "$OUTDIR/disk.txt"
rm -f "$ROOT/dd.bin"
train() {  # name code-dir args...
  local name=$1 code=$2; shift 2
  echo "=== $name $(date -u +%T)"
  PYTHONPATH=$SITE$code CUDA_VISIBLE_DEVICES=0 timeout 400 python3 -m lcm_runner.train $SHAPE --device cuda \
    --telemetry-dir "$OUTDIR/$name/telemetry" "$@" >"$OUTDIR/$name.log" 2>&1
  echo "rc=$?"
  grep -h '"resume"' "$OUTDIR/$name/telemetry/"*.jsonl 2>/dev/null | cut -c1-200
}
drop_cache() {
  python3 - "$1" <<'PY'
import os, sys
for d, _, files in os.walk(sys.argv[1]):
    for f in files:
        fd = os.open(os.path.join(d, f), os.O_RDONLY)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        os.close(fd)
PY
}
train save "$REPO" --train-iters 4 --save "$ROOT/ck" --save-interval 4 --ckpt-writers 8
for r in $(seq 1 "$ROUNDS"); do
  for side in baseline current; do
    code=$REPO; [ "$side" = baseline ] && code=$BASE
    drop_cache "$ROOT/ck"
    train "$side-$r" "$code" --train-iters 5 --load "$ROOT/ck"
  done
done
rm -rf "$ROOT"
python3 "$REPO/benchmarks/ckpt_load_ab.py" "$OUTDIR"
