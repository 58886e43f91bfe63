#!/bin/bash
# lcm-infra node health check: run by the Slurm prolog and epilog (and by hand).
# Checks, as the spec asks for them (conf file written by the slurm role):
#   GPUs  : nvidia-smi answers and lists LCM_HC_GPU_COUNT GPUs        (skipped when 0)
#   fabric: every HCA in LCM_HC_IB_HCAS has an ACTIVE port 1 at >= LCM_HC_IB_RATE_GBPS (skipped when none)
#   storage: the checkpoint mount is there (nfs: an nfs mount; existing: a mount point) and
#            LCM_HC_CHECKPOINT_DIR is a writable directory
#   health: when GPUs are expected (LCM_HC_HEALTH=1) and both LCM_HC_HEALTH_EXPECT (roles/node_health's
#           /etc/lcm/node-health.json) and LCM_HC_RUNNER exist: `lcm-runner health check --expect ... --drain`
#           (GPU state, NVLink, XIDs, Fabric Manager, HCAs; docs/health.md), bounded by LCM_HC_HEALTH_TIMEOUT_S
# On failure it prints the reasons, drains the node with them (unless LCM_HC_DRAIN=0) and exits 1.
# Usage: lcm-healthcheck.sh [CONF]   (default /etc/slurm/lcm-healthcheck.conf; env LCM_HC_CONF)
set -u

conf="${1:-${LCM_HC_CONF:-/etc/slurm/lcm-healthcheck.conf}}"
if [[ ! -r "$conf" ]]; then
    echo "lcm-healthcheck: cannot read config $conf" >&2
    exit 2
fi
# shellcheck source=/dev/null
source "$conf"
: "${LCM_HC_GPU_COUNT:=0}" "${LCM_HC_IB_HCAS:=}" "${LCM_HC_IB_RATE_GBPS:=0}" "${LCM_HC_IB_PORT:=1}"
: "${LCM_HC_STORAGE_TYPE:=lab_shared}" "${LCM_HC_MOUNTPOINT:=}" "${LCM_HC_CHECKPOINT_DIR:=}"
: "${LCM_HC_DRAIN:=1}" "${LCM_HC_SYSFS_IB:=/sys/class/infiniband}"
: "${LCM_HC_HEALTH:=0}" "${LCM_HC_HEALTH_EXPECT:=/etc/lcm/node-health.json}"
: "${LCM_HC_RUNNER:=/opt/lcm/venv/bin/lcm-runner}" "${LCM_HC_HEALTH_TIMEOUT_S:=60}"

failures=()

check_gpus() {
    [[ "$LCM_HC_GPU_COUNT" -gt 0 ]] || return 0
    if ! command -v nvidia-smi >/dev/null 2>&1; then
        failures+=("gpu: nvidia-smi not found, expected $LCM_HC_GPU_COUNT GPUs")
        return
    fi
    local listing n
    if ! listing="$(timeout 30 nvidia-smi -L 2>&1)"; then
        failures+=("gpu: nvidia-smi failed: ${listing//$'\n'/ }")
        return
    fi
    n="$(grep -c '^GPU [0-9]' <<<"$listing")"
    if [[ "$n" -ne "$LCM_HC_GPU_COUNT" ]]; then
        failures+=("gpu: nvidia-smi lists $n GPUs, expected $LCM_HC_GPU_COUNT")
    fi
}

check_fabric() {
    local hca port_dir state rate
    for hca in $LCM_HC_IB_HCAS; do
        port_dir="$LCM_HC_SYSFS_IB/$hca/ports/$LCM_HC_IB_PORT"
        if [[ ! -d "$port_dir" ]]; then
            failures+=("fabric: $hca port $LCM_HC_IB_PORT not present")
            continue
        fi
        state="$(<"$port_dir/state")"
        if [[ "$state" != *ACTIVE* ]]; then
            failures+=("fabric: $hca port $LCM_HC_IB_PORT state '${state}', expected ACTIVE")
        fi
        # e.g. "400 Gb/sec (4X NDR)"
        rate="$(<"$port_dir/rate")"
        rate="${rate%% *}"
        rate="${rate%%.*}"
        if [[ "$LCM_HC_IB_RATE_GBPS" -gt 0 && "${rate:-0}" -lt "$LCM_HC_IB_RATE_GBPS" ]]; then
            failures+=("fabric: $hca rate ${rate} Gb/s, expected >= $LCM_HC_IB_RATE_GBPS")
        fi
    done
}

check_storage() {
    local fstype
    if [[ -z "$LCM_HC_MOUNTPOINT" || ! -d "$LCM_HC_MOUNTPOINT" ]]; then
        failures+=("storage: mountpoint '$LCM_HC_MOUNTPOINT' missing")
        return
    fi
    case "$LCM_HC_STORAGE_TYPE" in
        nfs)
            fstype="$(findmnt -n -o FSTYPE --mountpoint "$LCM_HC_MOUNTPOINT" 2>/dev/null | head -n1)"
            if [[ "$fstype" != nfs* ]]; then
                failures+=("storage: $LCM_HC_MOUNTPOINT is not an NFS mount (fstype '${fstype:-none}')")
            fi
            ;;
        existing)
            if ! mountpoint -q "$LCM_HC_MOUNTPOINT"; then
                failures+=("storage: $LCM_HC_MOUNTPOINT is not mounted")
            fi
            ;;
        lab_shared) ;;
        *) failures+=("storage: unknown storage type '$LCM_HC_STORAGE_TYPE'") ;;
    esac
    if [[ ! -d "$LCM_HC_CHECKPOINT_DIR" ]]; then
        failures+=("storage: checkpoint dir '$LCM_HC_CHECKPOINT_DIR' missing")
    elif [[ ! -w "$LCM_HC_CHECKPOINT_DIR" ]]; then
        failures+=("storage: checkpoint dir '$LCM_HC_CHECKPOINT_DIR' not writable")
    fi
}

check_health() {
    [[ "$LCM_HC_HEALTH" == 1 ]] || return 0
    [[ -r "$LCM_HC_HEALTH_EXPECT" && -x "$LCM_HC_RUNNER" ]] || return 0
    local out rc names drain=()
    [[ "$LCM_HC_DRAIN" == 1 ]] && drain=(--drain)
    out="$(timeout "$LCM_HC_HEALTH_TIMEOUT_S" "$LCM_HC_RUNNER" health check --expect "$LCM_HC_HEALTH_EXPECT" \
        "${drain[@]}" 2>&1)"
    rc=$?
    case $rc in
        0) ;;
        1)
            names="$(awk '$1 == "FAIL" {sub(/:$/, "", $2); printf "%s%s", sep, $2; sep=","}' <<<"$out")"
            failures+=("health: ${names:-lcm-runner health check failed}")
            ;;
        124) failures+=("health: lcm-runner health check timed out after ${LCM_HC_HEALTH_TIMEOUT_S}s") ;;
        *) failures+=("health: lcm-runner health check exited $rc: $(tail -n1 <<<"$out")") ;;
    esac
}

check_gpus
check_fabric
check_storage
check_health

if [[ ${#failures[@]} -eq 0 ]]; then
    exit 0
fi
reason="lcm-health: $(IFS=';'; echo "${failures[*]}")"
echo "$reason" >&2
if [[ "$LCM_HC_DRAIN" == 1 ]]; then
    node="${SLURMD_NODENAME:-$(hostname -s)}"
    scontrol update NodeName="$node" State=DRAIN Reason="${reason:0:250}" >&2 ||
        echo "lcm-healthcheck: could not drain $node" >&2
fi
exit 1
