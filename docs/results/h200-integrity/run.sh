#!/usr/bin/env bash
# Checkpoint integrity and the numerical guard on one H200 (issue 10), the engine's 4.99 GB model:
#   bash docs/results/h200-integrity/run.sh OUTDIR
# 1. benchmarks/checksum.py on a 5 GB file on the local disk (each algorithm vs the write).
# 2. part1: 14 steps, async saves at 6 and 12, sync save at 14: the writers' hash time per save.
# 3. 64 bytes flipped in iter 14's shard; part2 resumes: rejected -> falls back to 12; verify + load time;
#    steps 13-14 of part2 vs part1 (bitwise).
# 4. part3: NaN on steps 18-21 (> 3 skips) -> exit 77, latest rewound to known-good; part4 (attempt 1)
#    finishes from there; lcm-runner ckpt verify on the directory.
# Needs megatron-core's cp312 wheel in .whl/ unless installed. NVLink multicast stays off.
set -uo pipefail
OUTDIR=${1:?usage: run.sh OUTDIR}
mkdir -p "$OUTDIR"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
export PYTHONWARNINGS=ignore
if ! python3 -c "import importlib.util as u; assert u.find_spec('megatron')" 2>/dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
    .whl/megatron_core-*.whl || exit 1
  export PYTHONPATH=/tmp/site:$PWD
else
  export PYTHONPATH=$PWD
fi
MODEL=${LCM_MODEL:-"--num-layers 4 --hidden-size 1024 --num-attention-heads 16 --ffn-hidden-size 4096 \
  --seq-length 4096 --micro-batch-size 2 --num-experts 8 --moe-router-topk 2 --vocab-size 32768 --bf16 \
  --lr 1e-4 --distributed-timeout-minutes 5"}
DEVICE=${LCM_DEVICE:-cuda}
WORK=${LCM_WORK:-/tmp/lcm-integrity}
rm -rf "$WORK"; mkdir -p "$WORK"
CK=$WORK/ckpt
{
  date -u; nvidia-smi -L 2>/dev/null
  python3 -c 'import torch, sys; print("python", sys.version.split()[0], "torch", torch.__version__)'
  python3 -c 'import xxhash; print("xxhash", xxhash.VERSION)' 2>&1 | tail -1
  df -h "$WORK" | tail -1
} > "$OUTDIR/env.txt" 2>&1
cat "$OUTDIR/env.txt"

echo "=== checksum benchmark $(date -u +%T)"
python3 benchmarks/checksum.py --gb 5 --dir "$WORK" --out "$OUTDIR"

run() {  # name attempt -- args
  local name=$1 attempt=$2; shift 3
  echo "=== $name (attempt $attempt) $(date -u +%T)"
  local t0=$SECONDS rc
  TORCHELASTIC_RESTART_COUNT=$attempt CUDA_VISIBLE_DEVICES=0 timeout 240 python3 -m lcm_runner.train $MODEL \
    --device "$DEVICE" --save "$CK" --ckpt-good-after-steps 2 --keep-last 3 --log-interval 1 \
    --telemetry-dir "$WORK/telemetry" "$@" >"$WORK/$name.log" 2>&1
  rc=$?
  echo "rc=$rc wall=$((SECONDS - t0))s"
  grep -E "^lcm-train|^step|rror" "$WORK/$name.log" | tail -12
  return 0
}

run part1 0 -- --train-iters 14 --save-interval 6 --async-save
python3 - "$CK" <<'PY'
import sys, pathlib
f = pathlib.Path(sys.argv[1]) / "iter_0000014" / "__0_0.distcp"
with open(f, "r+b") as fh:
    fh.seek(f.stat().st_size // 2); blk = bytearray(fh.read(64)); fh.seek(f.stat().st_size // 2)
    fh.write(bytes(x ^ 0xFF for x in blk))
print("flipped 64 bytes in", f)
PY
python3 -m lcm_runner.cli ckpt verify "$CK" | tee "$OUTDIR/verify-damaged.txt"
run part2 0 -- --train-iters 16
run part3 0 -- --train-iters 24 --save-interval 4 --fault-nan-steps 18,19,20,21 --fault-nan-attempts 1
run part4 1 -- --train-iters 24 --save-interval 4 --fault-nan-steps 18,19,20,21 --fault-nan-attempts 1
python3 -m lcm_runner.cli ckpt verify "$CK" | tee "$OUTDIR/verify-end.txt"
mkdir -p "$OUTDIR/telemetry"
cp "$WORK"/*.log "$OUTDIR/" ; cp "$WORK"/telemetry/*.jsonl "$OUTDIR/telemetry/" 2>/dev/null
ls "$CK" > "$OUTDIR/ckpt-listing.txt"
echo "done $(date -u +%T)"
