#!/bin/bash
# Slurm Epilog (lcm-infra): every executable in /etc/slurm/epilog.d in name order (e.g. the Enroot
# per-user cleanup), then the node health check. Any failure fails the epilog (Slurm drains the node).
set -u
rc=0
for hook in /etc/slurm/epilog.d/*; do
    [[ -f "$hook" && -x "$hook" ]] || continue
    "$hook" || { echo "epilog hook $hook failed" >&2; rc=1; }
done
if [[ -x /etc/slurm/lcm-healthcheck.sh && -r /etc/slurm/lcm-healthcheck.conf ]]; then
    /etc/slurm/lcm-healthcheck.sh /etc/slurm/lcm-healthcheck.conf || rc=1
fi
exit "$rc"
