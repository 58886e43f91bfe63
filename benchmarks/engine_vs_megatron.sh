#!/usr/bin/env bash
# The training engine against Megatron-LM's own pretrain_gpt.py, in one call on one GPU (issue 14):
#   bash benchmarks/engine_vs_megatron.sh OUTDIR
# Same shape for every run (4 layers, hidden 1024, 16 heads, FFN 4096, 8 experts top-2, seq 4096, micro
# batch 2 = global batch 2, bf16, vocab 32768, no bias, learned absolute positions, dropout 0, 40 steps):
#   engine-unfused   lcm-runner's trainer, megatron-core's local spec (unfused DotProductAttention)
#   engine-flash     the same with --use-flash-attn (SDPAttention: PyTorch's fused SDPA kernels)
#   engine-bare      engine-unfused without the per-step extras (--no-measure-comm, no NaN guard), to
#                    price them
#   engine-grouped   engine-unfused with --moe-grouped-gemm (the local experts as two torch._grouped_mm
#                    GEMMs: lcm_runner/train/experts.py)
#   engine-flash-grouped  --use-flash-attn --moe-grouped-gemm
#   megatron-lm      pretrain_gpt.py of Megatron-LM core_v0.19.0 (its in-tree megatron/core), mock data,
#                    --transformer-impl local (unfused attention), the fixture command of
#                    ../shared/fixtures/megatron-lm/README.md without the save
# plus the attention core alone (fwd + bwd per layer, unfused vs SDPA, and their difference) and the grouped
# experts against the per-expert loop (benchmarks/grouped_experts_check.py: accuracy, one layer's time).
# benchmarks/engine_vs_megatron.py then writes OUTDIR/summary.json and OUTDIR/summary.md (medians of steps
# 5-40). Needs in .whl/: megatron-core's cp312 wheel (unless installed) and
# megatron-lm-core_v0.19.0.tar.gz (the offline mirror's archive).
set -uo pipefail
OUTDIR=${1:?usage: engine_vs_megatron.sh OUTDIR}
mkdir -p "$OUTDIR"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
export PYTHONWARNINGS=ignore CUDA_DEVICE_MAX_CONNECTIONS=1
REPO=$PWD
ITERS=${LCM_BENCH_ITERS:-40}
WORK=${LCM_WORK:-/tmp/lcm-bench}
rm -rf "$WORK"; mkdir -p "$WORK"
if ! python3 -c "import importlib.util as u; assert u.find_spec('megatron.core')" 2>/dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$WORK/site" \
    .whl/megatron_core-*.whl || exit 1
  ENGINE_PATH=$WORK/site:$REPO
else
  ENGINE_PATH=$REPO
fi
tar -C "$WORK" -xzf .whl/megatron-lm-core_v0.19.0.tar.gz || exit 1
MLM=$WORK/megatron-lm-core_v0.19.0
{
  date -u; nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null
  python3 -c 'import torch, sys; print("python", sys.version.split()[0], "torch", torch.__version__, "cuda", torch.version.cuda)'
  PYTHONPATH=$ENGINE_PATH python3 -c 'import megatron.core as m; print("engine megatron-core", m.__version__)' 2>&1 | tail -1
  echo "megatron-lm core_v0.19.0 (in-tree megatron/core)"
} >"$OUTDIR/env.txt" 2>&1
cat "$OUTDIR/env.txt"

SHAPE="--num-layers 4 --hidden-size 1024 --num-attention-heads 16 --ffn-hidden-size 4096 --seq-length 4096
  --max-position-embeddings 4096 --micro-batch-size 2 --global-batch-size 2 --num-experts 8 --moe-router-topk 2
  --vocab-size 32768 --bf16 --lr 1e-4 --train-iters $ITERS --log-interval 1"

engine() {  # name extra-args...
  local name=$1; shift
  echo "=== $name $(date -u +%T)"
  local t0=$SECONDS
  CUDA_VISIBLE_DEVICES=0 PYTHONPATH=$ENGINE_PATH timeout 300 python3 -m lcm_runner.train $SHAPE --device cuda \
    --telemetry-dir "$OUTDIR/$name/telemetry" "$@" >"$OUTDIR/$name.log" 2>&1
  echo "rc=$? wall=$((SECONDS - t0))s"; grep -E "^step (5|40) |rror" "$OUTDIR/$name.log" | tail -3
}

engine engine-unfused
engine engine-flash --use-flash-attn
engine engine-bare --no-measure-comm --no-check-for-nan-in-loss-and-grad
engine engine-grouped --moe-grouped-gemm
engine engine-flash-grouped --use-flash-attn --moe-grouped-gemm

echo "=== megatron-lm $(date -u +%T)"
t0=$SECONDS
(cd "$MLM" && CUDA_VISIBLE_DEVICES=0 PYTHONPATH=$MLM timeout 300 python3 -m torch.distributed.run --standalone \
  --nproc-per-node 1 pretrain_gpt.py $SHAPE --moe-token-dispatcher-type alltoall --mock-data \
  --tokenizer-type NullTokenizer --transformer-impl local --no-persist-layer-norm \
  --no-gradient-accumulation-fusion --no-masked-softmax-fusion --no-bias-gelu-fusion --no-bias-swiglu-fusion \
  --disable-bias-linear --hidden-dropout 0 --attention-dropout 0 --position-embedding-type learned_absolute \
  --eval-iters 0 --eval-interval 1000 --split 100,0,0 --distributed-backend nccl) >"$OUTDIR/megatron-lm.log" 2>&1
echo "rc=$? wall=$((SECONDS - t0))s"; grep -E "iteration +(5|40)/" "$OUTDIR/megatron-lm.log" | cut -c1-160

echo "=== attention core $(date -u +%T)"
CUDA_VISIBLE_DEVICES=0 PYTHONPATH=$ENGINE_PATH python3 benchmarks/attention_core.py --out "$OUTDIR/attention.json" \
  2>&1 | tail -5
echo "=== grouped experts vs the per-expert loop $(date -u +%T)"
CUDA_VISIBLE_DEVICES=0 PYTHONPATH=$ENGINE_PATH python3 benchmarks/grouped_experts_check.py \
  --out "$OUTDIR/grouped_experts.json" 2>&1 | tail -25
if [ "${LCM_BENCH_PROFILE:-0}" = 1 ]; then  # where a step of engine-flash goes (torch.profiler, steps 12-15)
  echo "=== profile engine-flash $(date -u +%T)"
  CUDA_VISIBLE_DEVICES=0 PYTHONPATH=$ENGINE_PATH timeout 300 python3 benchmarks/profile_step.py \
    --out "$OUTDIR/profile-engine-flash.txt" -- $SHAPE --device cuda --use-flash-attn --train-iters 16 \
    --telemetry-dir "$WORK/profile" >"$WORK/profile.log" 2>&1 || tail -5 "$WORK/profile.log"
fi
python3 benchmarks/engine_vs_megatron.py "$OUTDIR"
