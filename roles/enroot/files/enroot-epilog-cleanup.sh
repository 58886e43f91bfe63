#!/bin/bash
# Slurm epilog hook (lcm-infra enroot role): remove the finished job's user's Enroot directories
# (<root>/user-<uid> for each root in LCM_ENROOT_CLEAN_ROOTS) and nothing else:
#   - only SLURM_JOB_UID's directories, never another user's;
#   - not while that user still has another job on this node (their containers may be in use);
#   - a user-<uid> that is a symlink or not a directory is left alone (no following links out).
# Usage: enroot-epilog-cleanup.sh [CONF]   env: SLURM_JOB_UID, SLURM_JOB_ID, SLURMD_NODENAME
set -u

conf="${1:-${LCM_ENROOT_CLEANUP_CONF:-/etc/enroot/lcm-epilog-cleanup.conf}}"
if [[ ! -r "$conf" ]]; then
    echo "enroot-epilog-cleanup: cannot read $conf" >&2
    exit 2
fi
# shellcheck source=/dev/null
source "$conf"
uid="${SLURM_JOB_UID:-}"
if [[ ! "$uid" =~ ^[0-9]+$ ]]; then
    echo "enroot-epilog-cleanup: SLURM_JOB_UID '${uid}' is not a numeric uid; nothing removed" >&2
    exit 2
fi

node="${SLURMD_NODENAME:-$(hostname -s)}"
if command -v squeue >/dev/null 2>&1; then
    if ! others="$(squeue --noheader --nodelist="$node" --user="$uid" --states=RUNNING,SUSPENDED,COMPLETING --format=%A 2>/dev/null)"; then
        echo "enroot-epilog-cleanup: squeue failed; keeping user $uid's directories" >&2
        exit 0
    fi
    others="$(grep -vx -- "${SLURM_JOB_ID:-}" <<<"$others" | grep -c '[0-9]')"
    if [[ "$others" -gt 0 ]]; then
        echo "enroot-epilog-cleanup: user $uid has $others other job(s) on $node; keeping their directories"
        exit 0
    fi
fi

rc=0
for root in ${LCM_ENROOT_CLEAN_ROOTS:-}; do
    dir="$root/user-$uid"
    [[ -e "$dir" || -L "$dir" ]] || continue
    if [[ -L "$dir" || ! -d "$dir" ]]; then
        echo "enroot-epilog-cleanup: $dir is not a plain directory; left alone" >&2
        continue
    fi
    rm -rf --one-file-system -- "$dir" || rc=1
done
exit "$rc"
