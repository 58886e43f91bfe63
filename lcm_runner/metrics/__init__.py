"""Metrics for node_exporter's textfile collector (docs/monitoring.md): the training metrics of a
node's ranks (`train`, from their telemetry) and the Slurm state (`slurm`, from sinfo/squeue).

Standard library only: it runs on the nodes from the node venv (requirements/node.lock has no
prometheus_client), beside the training processes, and must never fail or delay them.

    exposition.py  metric families -> Prometheus text format; write_atomic
    follow.py      incremental reading of the ranks' telemetry files
    train.py       per-(rank, attempt) state -> the lcm_train_* families
    slurm.py       sinfo/squeue -> the lcm_slurm_* families
    loop.py        signals, the output check, failure reporting
    cli.py         `lcm-runner metrics train|slurm`, `python -m lcm_runner.metrics`
"""
