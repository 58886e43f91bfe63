#!/bin/bash
# Slurm Prolog (lcm-infra): the node health check, then every executable in /etc/slurm/prolog.d
# in name order. The first failure fails the prolog (Slurm then drains the node and requeues the job).
set -u
if [[ -x /etc/slurm/lcm-healthcheck.sh && -r /etc/slurm/lcm-healthcheck.conf ]]; then
    /etc/slurm/lcm-healthcheck.sh /etc/slurm/lcm-healthcheck.conf || exit 1
fi
for hook in /etc/slurm/prolog.d/*; do
    [[ -f "$hook" && -x "$hook" ]] || continue
    "$hook" || { echo "prolog hook $hook failed" >&2; exit 1; }
done
exit 0
