#!/bin/bash
# lcm-node-watchdog (lcm-infra, on every compute node): returns this node to Slurm service by itself
# after a network partition or a node loss, once it reaches the controller again and is healthy.
#
# Why: slurmctld does not ping a node that is DOWN and not responding ("down*"); it asks such a node
# to register again only every 20th ping cycle (MAX_REG_FREQUENCY; one cycle = SlurmdTimeout/3, so
# 20 x 20 s = 400 s with SlurmdTimeout=60). ReturnToService=2 takes a DOWN node back as soon as its
# slurmd registers or answers, but a healed node waits minutes for that question (docs/reliability-nodes.md).
# HealthCheckProgram cannot help: slurmctld only triggers it on nodes that respond.
#
# Every LCM_WD_INTERVAL_S seconds, when this node is DOWN (not drained) with a reason set
#   - by a surviving training agent: "lcm: ..." (lcm_runner.launch.nodefail), at least
#     LCM_WD_HOLDDOWN_S old (the requeued job gets going elsewhere first), or
#   - by slurmctld's ping: "Not responding",
# and slurmd is active (for LCM_WD_SETTLE_S s at least: a slurmd that just started registers by
# itself), the controller answers (sinfo) and the health check passes (on failure the
# check drains the node with its own "lcm-health: ..." reason, which this watchdog never touches),
# it runs `scontrol update NodeName=<me> State=RESUME`: slurmctld pings the node at once and it is
# idle a moment later. Reasons of an administrator, drains and other states are left alone.
#
# Before the resume it kills every slurmstepd left on the node (and removes their spool sockets and batch
# directories): a DOWN
# node runs no job, so these are steps of runs Slurm already ended, kept by a node cut off while it ran
# them (they retry their step completion once a minute). A requeued job keeps its id and its step ids
# start at 0 again: when it lands on the returning node, such a leftover `<job>.0` ends the new run's step
# 0 there (seen on the lab, Slurm 22.05: the new step killed 1.7 s after its launch, the job FAILED 137;
# docs/scheduler.md). It then restarts slurmd, which still counts such a run's batch job as launched.
#
# Usage: lcm-node-watchdog.sh [--once] [CONF]   (default /etc/slurm/lcm-node-watchdog.conf; env LCM_WD_CONF)
set -u

once=0
if [[ "${1:-}" == "--once" ]]; then
    once=1
    shift
fi
conf="${1:-${LCM_WD_CONF:-/etc/slurm/lcm-node-watchdog.conf}}"
if [[ -r "$conf" ]]; then
    # shellcheck source=/dev/null
    source "$conf"
fi
: "${LCM_WD_INTERVAL_S:=10}" "${LCM_WD_HOLDDOWN_S:=60}" "${LCM_WD_TIMEOUT_S:=10}" "${LCM_WD_NODE:=}"
: "${LCM_WD_SETTLE_S:=10}" "${LCM_WD_SPOOL:=/var/lib/slurm/slurmd}"
: "${LCM_WD_HEALTHCHECK:=/etc/slurm/lcm-healthcheck.sh}" "${LCM_WD_HEALTHCHECK_CONF:=/etc/slurm/lcm-healthcheck.conf}"
node="${LCM_WD_NODE:-$(hostname -s)}"

log() { echo "lcm-node-watchdog: $*"; }

kill_stale_steps() {
    local stale i found=0
    stale="$(pgrep -a -f '^slurmstepd: \[' | tr '\n' ';')"
    if [[ -n "$stale" ]]; then
        found=1
        log "killing the steps left on $node before its return: $stale"
        pkill -KILL -f '^slurmstepd: \['
        for ((i = 0; i < 20; i++)); do
            pgrep -f '^slurmstepd: \[' >/dev/null || break
            sleep 0.25
        done
    fi
    # what a killed (or crashed) stepd leaves in slurmd's spool: its sockets, and a batch step's
    # job<id> directory, whose slurm_script makes the next batch launch of that job id here fail
    # ("File exists", slurmstepd 4010: the requeued job is then held)
    local -a left=()
    mapfile -t left < <(find "$LCM_WD_SPOOL" -mindepth 1 -maxdepth 1 \( -name "${node}_[0-9]*" -o -name 'job[0-9]*' \) 2>/dev/null)
    if ((${#left[@]})); then
        found=1
        log "removing from $LCM_WD_SPOOL: ${left[*]##*/}"
        rm -rf -- "${left[@]}"
    fi
    # slurmd still counts the killed batch job as launched here (it never got that run's termination: the
    # node was cut off): the requeued job landing here again would fail as a "Duplicate jobid" and drain
    # the node. A restarted slurmd starts from nothing and registers at once.
    if ((found)); then
        log "restarting slurmd on $node (forgets the steps it ran)"
        systemctl restart slurmd || log "could not restart slurmd"
    fi
}
check_once() {
    local line state when reason since age
    # unreachable controller (still partitioned): nothing to decide, try again next round
    line="$(timeout "$LCM_WD_TIMEOUT_S" sinfo --noheader --Node --nodes="$node" --format='%T|%H|%E' 2>/dev/null |
        head -n 1)" || return 0
    [[ -n "$line" ]] || return 0
    state="${line%%|*}"
    line="${line#*|}"
    when="${line%%|*}"
    reason="${line#*|}"
    case "$state" in
        down | 'down*') ;;
        *) return 0 ;;
    esac
    case "$reason" in
        'lcm:'*)
            since="$(date -d "$when" +%s 2>/dev/null)" || since=0
            age=$(($(date +%s) - since))
            if ((age < LCM_WD_HOLDDOWN_S)); then
                return 0
            fi
            ;;
        'Not responding'*) ;;
        *) return 0 ;;
    esac
    if ! systemctl is-active --quiet slurmd; then
        log "$node is $state ($reason) but slurmd is not active: left down"
        return 0
    fi
    # slurmd that just started registers by itself (ReturnToService=2 takes the node back): let it
    since="$(systemctl show --property=ActiveEnterTimestampMonotonic --value slurmd 2>/dev/null)"
    if [[ "$since" =~ ^[0-9]+$ && "$since" -gt 0 ]]; then
        age=$(($(cut -d. -f1 /proc/uptime) - since / 1000000))
        if ((age < LCM_WD_SETTLE_S)); then
            return 0
        fi
    fi
    if [[ -x "$LCM_WD_HEALTHCHECK" ]] && ! "$LCM_WD_HEALTHCHECK" "$LCM_WD_HEALTHCHECK_CONF" >&2; then
        log "$node is $state ($reason), the controller answers, but the health check fails: left out"
        return 0
    fi
    kill_stale_steps
    if timeout "$LCM_WD_TIMEOUT_S" scontrol update NodeName="$node" State=RESUME 2>/dev/null; then
        log "resumed $node (was $state: $reason)"
    else
        # e.g. slurmd registered in the meantime (a restarted node: ReturnToService=2 took it back)
        line="$(timeout "$LCM_WD_TIMEOUT_S" sinfo --noheader --Node --nodes="$node" --format='%T' | head -n 1)"
        log "could not resume $node (was $state: $reason); now ${line:-unknown}"
    fi
}

if ((once)); then
    check_once
    exit 0
fi
while true; do
    check_once
    sleep "$LCM_WD_INTERVAL_S"
done
