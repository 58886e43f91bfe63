"""Per-node health checks (docs/health.md): parse what nvidia-smi, the kernel log, ibstat/sysfs and Fabric
Manager report, compare it with the node's expectation (/etc/lcm/node-health.json, roles/node_health) and
report every check with its value and threshold. Pure parsing and checks: no torch, no GPU library.

    expect.py        the expectation file (JSON contract, schema 1)
    gpu.py           nvidia-smi -q -x: per-GPU state and its checks
    topo.py          nvidia-smi topo -m / nvlink -s: NVLink between every GPU pair, no link down
    xid.py           kernel-log XID errors
    fabric.py        ibstat / sysfs: HCAs present, Active/LinkUp, at the spec's rate
    fabricmanager.py Fabric Manager running, its version == the driver
    report.py        Check, Report (JSON, Markdown, verdict, Slurm drain reason)
    collect.py       runs the commands on this node (timeouts, missing tools)
    cli.py           `lcm-runner health check`
"""
