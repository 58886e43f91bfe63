#!/bin/sh
# runs inside the container: keytest.sh ctld|d "KEY=VALUE|KEY2=V" [cgroup.conf lines]  (base confs in /root/base)
kind=$1; line=$2; cg=$3
cp /root/base/slurm.conf /etc/slurm/slurm.conf; cp /root/base/cgroup.conf /etc/slurm/cgroup.conf
if [ -n "$line" ]; then
  for kv in $(echo "$line" | tr '|' ' '); do k=${kv%%=*}; sed -i "/^$k=/d" /etc/slurm/slurm.conf; echo "$kv" >> /etc/slurm/slurm.conf; done
fi
if [ -n "$cg" ]; then
  for kv in $(echo "$cg" | tr '|' ' '); do k=${kv%%=*}; sed -i "/^$k=/d" /etc/slurm/cgroup.conf; echo "$kv" >> /etc/slurm/cgroup.conf; done
fi
rm -rf /var/lib/slurm/slurmctld/*
if [ $kind = ctld ]; then timeout 3 slurmctld -D -i -v > /tmp/k.log 2>&1; else timeout 3 slurmd -D -v > /tmp/k.log 2>&1; fi
grep -i -E "error|warn|fatal|deprecat|obsolete|unknown|invalid|ignor|no longer|removed|defunct" /tmp/k.log | grep -v -E "state file|NOTE: Trying|agent_fini|pidfile|MailProg|Unable to register|connect failure|switches lack|TOPOLOGY|Read-only|freezer|proctrack context|initialization failed|Plugin init" | sed "s/^/    /" | sort -u | head -6
