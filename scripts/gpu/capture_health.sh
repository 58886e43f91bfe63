#!/usr/bin/env bash
# Capture the raw outputs the node health checks parse (tests/unit/fixtures/health/ comes from this), on a
# GPU machine: nvidia-smi -q / -q -x / topo -m / nvlink, the kernel log's XID lines, ibstat, the driver's
# version files, PCI and Fabric Manager state. Writes <OUT>/health-capture.tar.gz (OUT defaults to .cache).
# Every command's exit status is kept beside its output (<name>.rc): a failing command is a finding too.
set -uo pipefail
OUT=${OUT:-.cache}
dir=$(mktemp -d)
cap() {  # cap NAME CMD...
  local name=$1; shift
  "$@" >"$dir/$name" 2>"$dir/$name.err"
  echo $? >"$dir/$name.rc"
}
cap nvidia-smi-q.txt nvidia-smi -q
cap nvidia-smi-q.xml nvidia-smi -q -x
cap nvidia-smi-topo-m.txt nvidia-smi topo -m
cap nvidia-smi-nvlink-s.txt nvidia-smi nvlink -s
cap nvidia-smi-nvlink-status.txt nvidia-smi nvlink --status
cap nvidia-smi-query.csv nvidia-smi --query-gpu=index,name,driver_version,persistence_mode,pci.bus_id,ecc.mode.current,pcie.link.gen.current,pcie.link.gen.max,pcie.link.width.current,pcie.link.width.max,clocks_event_reasons.active --format=csv
cap proc-driver-version.txt cat /proc/driver/nvidia/version
cap sys-module-nvidia-version.txt cat /sys/module/nvidia/version
cap modinfo-nvidia.txt modinfo nvidia
cap dmesg.txt dmesg
cap journalctl-k.txt journalctl -k -b --no-pager
cap ibstat.txt ibstat
cap ibv_devinfo.txt ibv_devinfo
cap lspci-nvidia.txt lspci -d 10de: -vv
cap fabricmanager.txt systemctl status nvidia-fabricmanager --no-pager
cap fabricmanager-active.txt systemctl is-active nvidia-fabricmanager
cap nv-fabricmanager-version.txt nv-fabricmanager --version
cap os-release.txt cat /etc/os-release
cap uname.txt uname -a
cap dpkg-nvidia.txt sh -c 'dpkg -l | grep -i nvidia'
tar -C "$dir" -czf "$OUT/health-capture.tar.gz" .
ls -l "$dir" | head -60
