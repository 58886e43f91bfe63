#!/usr/bin/env bash
# Checkpoint throughput of the project's trainer against the disk it writes to, in one call (issue 17):
#   bash benchmarks/ckpt_throughput.sh OUTDIR            # a GPU machine (or DEVICE=cpu SHAPE=... anywhere)
# Through the device tool: OUTDIR outside $OUT, then `tar -C OUTDIR/.. -czf $OUT/ckpt.tgz <OUTDIR's name>`
# (the telemetry folders are deeper than the tool brings back). About 7-8 minutes on one H200.
# 1. The disk beside the checkpoints: dd of $DD_GIB GiB with 16 MiB blocks, oflag=direct (write) and
#    iflag=direct (read), and a buffered write + conv=fdatasync.
# 2. The trainer (lcm_runner.train, one rank) at the engine benchmark's shape (4 layers, hidden 1024, 8
#    experts, vocab 32768, bf16: a 4.99 GB checkpoint with the optimizer state) saving at steps 2 and 4:
#    synchronously with 1, 2, 4, 8 and 16 writer threads per rank (--ckpt-writers), then asynchronously with
#    megatron-core's forked writer (mcore) and with NVRx's persistent worker (nvrx, when its wheel is in
#    .whl/). Every save is the project's full path: shards fsynced, each file hashed by its writer,
#    verified set, marker, `latest`.
# 3. Load: the page cache of a finished checkpoint dropped (posix_fadvise DONTNEED, no root needed), then a
#    resume from it (verify every file + megatron's load) for the 1-writer and the $LOAD_WRITERS-writer
#    checkpoints.
# benchmarks/ckpt_throughput.py then writes OUTDIR/summary.json and OUTDIR/summary.md.
set -uo pipefail
OUTDIR=${1:?usage: ckpt_throughput.sh OUTDIR}
mkdir -p "$OUTDIR"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
export PYTHONWARNINGS=ignore CUDA_DEVICE_MAX_CONNECTIONS=1
REPO=$PWD
DEVICE=${DEVICE:-cuda}
DD_GIB=${DD_GIB:-5}
WRITERS=${WRITERS:-"1 2 4 8 16"}
ASYNC_WRITERS=${ASYNC_WRITERS:-8}
LOAD_WRITERS=${LOAD_WRITERS:-8}
ASYNC=${ASYNC:-1}  # 0: the synchronous saves and loads only (a call split in two)
ROOT=${CKPT_ROOT:-$REPO/.cache/ckpt-bench}
WORK=${LCM_WORK:-/tmp/lcm-ckpt-bench}
rm -rf "$WORK" "$ROOT"; mkdir -p "$WORK/site" "$ROOT"
PYPATH=$REPO
if ! python3 -c "import importlib.util as u; assert u.find_spec('megatron.core')" 2>/dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$WORK/site" \
    .whl/megatron_core-*.whl || exit 1
  PYPATH=$WORK/site:$REPO
fi
if compgen -G ".whl/nvidia_resiliency_ext-*.whl" >/dev/null \
  && ! python3 -c "import nvidia_resiliency_ext" 2>/dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$WORK/site" \
    .whl/nvidia_resiliency_ext-*.whl || echo "nvrx wheel did not install"
  PYPATH=$WORK/site:$REPO
fi
export PYTHONPATH=$PYPATH
{
  date -u
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null
  python3 -c 'import torch, sys; print("python", sys.version.split()[0], "torch", torch.__version__)'
  python3 -c 'import megatron.core as m; print("megatron-core", m.__version__)' 2>&1 | tail -1
  python3 -c 'import nvidia_resiliency_ext as n; print("nvidia-resiliency-ext", n.__version__)' 2>&1 | tail -1
  echo "cpus $(nproc); $(free -g | awk '/^Mem/ {print "memory " $2 " GiB"}')"
  echo "checkpoint filesystem: $(df -hT "$ROOT" | tail -1)"
} >"$OUTDIR/env.txt" 2>&1
cat "$OUTDIR/env.txt"

# 1. the disk
dd_rate() {  # dd args... -> the GB/s figure dd prints (decimal GB)
  dd "$@" 2>&1 | awk '/copied/ {for (i = 1; i <= NF; i++) if ($i ~ /^[GM]B\/s$/) print $(i-1), $i}' | tail -1
}
{
  echo "direct_write $(dd_rate if=/dev/zero of="$ROOT/dd.bin" bs=16M count=$((DD_GIB * 64)) oflag=direct)"
  echo "direct_read $(dd_rate if="$ROOT/dd.bin" of=/dev/null bs=16M iflag=direct)"
  rm -f "$ROOT/dd.bin"
  echo "buffered_fdatasync_write $(dd_rate if=/dev/zero of="$ROOT/dd.bin" bs=16M count=$((DD_GIB * 64)) conv=fdatasync)"
  rm -f "$ROOT/dd.bin"
} | tee "$OUTDIR/disk.txt"

SHAPE=${SHAPE:-"--num-layers 4 --hidden-size 1024 --num-attention-heads 16 --ffn-hidden-size 4096 --seq-length 4096
  --max-position-embeddings 4096 --micro-batch-size 2 --global-batch-size 2 --num-experts 8 --moe-router-topk 2
  --vocab-size 32768 --bf16 --lr 1e-4 --use-flash-attn --moe-grouped-gemm"}

train() {  # name iters extra-args...
  local name=$1 iters=$2; shift 2
  echo "=== $name $(date -u +%T)"
  local t0=$SECONDS
  CUDA_VISIBLE_DEVICES=0 timeout 400 python3 -m lcm_runner.train $SHAPE --device "$DEVICE" --train-iters "$iters" \
    --telemetry-dir "$OUTDIR/$name/telemetry" "$@" >"$OUTDIR/$name.log" 2>&1
  echo "rc=$? wall=$((SECONDS - t0))s"
  grep -h '"ckpt_end"\|"resume"' "$OUTDIR/$name/telemetry/"*.jsonl 2>/dev/null | cut -c1-260
}
drop_cache() {  # the page cache of every file under a directory (clean pages: written and fsynced)
  python3 - "$1" <<'PY'
import os, sys
n = 0
for d, _, files in os.walk(sys.argv[1]):
    for f in files:
        fd = os.open(os.path.join(d, f), os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            n += 1
        finally:
            os.close(fd)
print(f"page cache dropped for {n} files")
PY
}

# 2. saves (and 3. loads of two of them)
for w in $WRITERS; do
  train "sync-w$w" 4 --save "$ROOT/sync-w$w" --save-interval 2 --keep-last 1 --ckpt-writers "$w"
  if [ "$w" = 1 ] || [ "$w" = "$LOAD_WRITERS" ]; then
    drop_cache "$ROOT/sync-w$w"
    train "load-w$w" 5 --load "$ROOT/sync-w$w"  # no --save: nothing written after the resume
  fi
  rm -rf "$ROOT/sync-w$w"
done
if [ "$ASYNC" = 1 ]; then
train "async-mcore-w$ASYNC_WRITERS" 4 --save "$ROOT/async-mcore" --save-interval 2 --keep-last 1 \
  --ckpt-writers "$ASYNC_WRITERS" --async-save --ckpt-async-strategy mcore
rm -rf "$ROOT/async-mcore"
if python3 -c "import nvidia_resiliency_ext" 2>/dev/null; then
  train "async-nvrx-w$ASYNC_WRITERS" 4 --save "$ROOT/async-nvrx" --save-interval 2 --keep-last 1 \
    --ckpt-writers "$ASYNC_WRITERS" --async-save --ckpt-async-strategy nvrx
  rm -rf "$ROOT/async-nvrx"
fi
fi
rm -rf "$ROOT"
python3 "$REPO/benchmarks/ckpt_throughput.py" "$OUTDIR"
