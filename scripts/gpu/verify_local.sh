#!/usr/bin/env bash
# On a GPU machine, in one run: `playbooks/verify.yml -e burn_in=true` with a local connection (the node
# health checks and the probes, inventories/h200-device), and beside it the figures the machine gives to plain
# measurements that share no code with the probes (docs/results/h200-verify.md is written from this run).
#
#   WHEELS=.whl OUT=/some/dir scripts/gpu/verify_local.sh
#
# WHEELS holds ansible-core and its dependencies the machine lacks (no network there) and a tarball of the
# ansible.posix collection; lcm_runner runs from this checkout (PYTHONPATH). Results go to $OUT: verify.log, references.json, the health and probe reports.
set -uo pipefail
cd "$(dirname "$0")/../.."
WHEELS=${WHEELS:-.whl}
OUT=${OUT:-.cache/verify}
INVENTORY=${INVENTORY:-inventories/h200-device}
mkdir -p "$OUT"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
command -v nvidia-smi >/dev/null || { echo "verify_local.sh: no nvidia-smi: not a GPU machine" >&2; exit 2; }

# The machine's python3 (with its torch) runs everything; ansible-core goes into a --target folder.
site=$(mktemp -d)
python3 -m pip install -q --no-index --no-deps --target "$site" "$WHEELS"/ansible_core-*.whl \
  "$WHEELS"/resolvelib-*.whl "$WHEELS"/cryptography-*.whl "$WHEELS"/cffi-*.whl "$WHEELS"/pycparser-*.whl
# The ansible.posix collection (the json and profile callbacks), carried as a tarball of the dev venv's copy.
mkdir -p "$site/ansible_collections"
if [ -f "$WHEELS/ansible-posix-collection.tar.gz" ]; then
  tar -C "$site/ansible_collections" -xzf "$WHEELS/ansible-posix-collection.tar.gz"
fi
py=$(command -v python3)
bin=$(mktemp -d)
cat >"$bin/lcm-runner" <<EOF
#!/bin/sh
exec "$py" -m lcm_runner "\$@"
EOF
chmod +x "$bin/lcm-runner"
export PATH="$bin:$site/bin:$PATH" PYTHONPATH="$PWD:$site${PYTHONPATH:+:$PYTHONPATH}"
export ANSIBLE_CONFIG=$PWD/ansible.cfg ANSIBLE_FORCE_COLOR=false LCM_ANSIBLE_PLAYBOOK="$site/bin/ansible-playbook"
export ANSIBLE_COLLECTIONS_PATH="$site"

echo "== references (plain measurements, not the probe code)"
python3 - "$OUT/references.json" <<'EOF'
import json, subprocess, sys, time
import torch
out = {}
dev = torch.device("cuda:0")
n = 8192
a = torch.randn(n, n, device=dev, dtype=torch.bfloat16)
b = torch.randn(n, n, device=dev, dtype=torch.bfloat16)
c = torch.empty_like(a)
for _ in range(3):
    torch.matmul(a, b, out=c)
torch.cuda.synchronize()
t0 = time.perf_counter()
for _ in range(10):
    torch.matmul(a, b, out=c)
torch.cuda.synchronize()
burst = 2 * n**3 * 10 / (time.perf_counter() - t0) / 1e12
# sustained: 3 s of products after 1 s of warm-up, wall clock
t0 = time.perf_counter()
while time.perf_counter() - t0 < 1.0:
    torch.matmul(a, b, out=c)
torch.cuda.synchronize()
count, t0 = 0, time.perf_counter()
while time.perf_counter() - t0 < 3.0:
    for _ in range(10):
        torch.matmul(a, b, out=c)
    count += 10
    torch.cuda.synchronize()
sustained = 2 * n**3 * count / (time.perf_counter() - t0) / 1e12
reasons = subprocess.run(["nvidia-smi", "--query-gpu=clocks.sm,power.draw,clocks_event_reasons.active",
                          "--format=csv,noheader"], capture_output=True, text=True).stdout.strip()
del a, b, c
torch.cuda.empty_cache()
size = 4 << 30
src = torch.empty(size, dtype=torch.uint8, device=dev)
dst = torch.empty_like(src)
for _ in range(3):
    dst.copy_(src)
torch.cuda.synchronize()
t0 = time.perf_counter()
for _ in range(10):
    dst.copy_(src)
torch.cuda.synchronize()
copy = 2 * size * 10 / (time.perf_counter() - t0) / 1e9
out.update(gemm_bf16_8192_burst_tflops=round(burst, 1), gemm_bf16_8192_sustained_tflops=round(sustained, 1),
           after_sustained_smi=reasons, d2d_copy_4gib_gbps=round(copy, 1), torch=torch.__version__,
           device=torch.cuda.get_device_name(0))
json.dump(out, open(sys.argv[1], "w"), indent=2)
print(json.dumps(out, indent=2))
EOF
dd if=/dev/zero of=/tmp/lcm-dd.bin bs=16M count=256 oflag=direct 2>&1 | tail -1 | tee "$OUT/dd-direct-write.txt"
rm -f /tmp/lcm-dd.bin

echo "== playbooks/verify.yml -e burn_in=true (local connection)"
t0=$(date +%s)
ansible-playbook -i "$INVENTORY" playbooks/verify.yml -e burn_in=true -e verify_lcm_runner=lcm-runner \
  -e ansible_become=false >"$OUT/verify.log" 2>&1
echo "verify.yml rc=$? in $(( $(date +%s) - t0 )) s" | tee -a "$OUT/verify.log"
tail -25 "$OUT/verify.log"
cp runs/health/* "$OUT/" 2>/dev/null
ls -l "$OUT"

echo "== the nvidia_driver role's own checks on this machine (tests/unit/test_nvidia_gpu_host.py)"
timeout 300 python3 -m pytest -v -p no:cacheprovider tests/unit/test_nvidia_gpu_host.py 2>&1 | tail -30 | tee "$OUT/nvidia-gpu-host-tests.txt"
