"""README Measured rows of the node workflows (docs/nodes.md): the burn-in on a real H200 against the same
run's plain measurements, the lab drill that adds lab-node3 under a training job and removes it, and the
ten mixed faults in one Slurm job on the lab (tests/faults/test_mixed_faults_slurm.py)."""

from __future__ import annotations

from lcm_runner.report.readme_sources import Results, ResultsError, Row, _get, _num

H200_HEALTH = "docs/results/h200-verify/h200-gpu01.json"
H200_PROBE = "docs/results/h200-verify/h200-gpu01.probe.json"
H200_REFS = "docs/results/h200-verify/references.json"
LAB_NODES = "docs/results/lab-nodes/nodes-drill.json"
LAB_MIXED = "docs/results/faults/lab-mixed-slurm/recoveries.json"


def _check(doc: dict, rel: str, name: str) -> dict:
    for check in _get(doc, rel, "checks"):
        if check.get("name") == name:
            return check
    raise ResultsError(f"{rel}: no check named {name!r}")


def row_h200_burn_in(res: Results) -> Row:
    health, probe, refs = res.json(H200_HEALTH), res.json(H200_PROBE), res.json(H200_REFS)
    counts = {
        s: sum(1 for c in _get(health, H200_HEALTH, "checks") if c.get("status") == s)
        for s in ("pass", "fail", "skip")
    }
    gemm, copy = _check(probe, H200_PROBE, "gemm"), _check(probe, H200_PROBE, "copy")
    g_ref = _get(refs, H200_REFS, "gemm_bf16_8192_sustained_tflops")
    c_ref = _get(refs, H200_REFS, "d2d_copy_4gib_gbps")
    g, c = gemm["value"], copy["value"]
    value = (
        f"{counts['pass']} pass, {counts['fail']} fail, {counts['skip']} skipped; "
        f"GEMM {_num(g, 1)} TFLOP/s = {_num(g / g_ref, 2)}x, copy {_num(c, 0)} GB/s = {_num(c / c_ref, 2)}x"
    )
    return Row(
        "Node verify + burn-in (`verify.yml -e burn_in=true`, local connection): health checks; "
        "bf16 GEMM and HBM copy probes vs the same run's plain measurements",
        "H200",
        value,
        [H200_HEALTH, H200_PROBE, H200_REFS],
    )


def row_lab_add_node(res: Results) -> Row:
    doc = res.json(LAB_NODES)
    steps, attempts = _get(doc, LAB_NODES, "job_steps"), _get(doc, LAB_NODES, "job_attempts")
    bitwise = "bitwise" if _get(doc, LAB_NODES, "job_losses_bitwise_as_reference") else "NOT bitwise"
    add, remove = _get(doc, LAB_NODES, "add_s"), _get(doc, LAB_NODES, "remove_s")
    restarted = _get(doc, LAB_NODES, "daemons_restarted")
    value = (
        f"{_num(add, 0)} s / {_num(remove, 0)} s; the job: {steps} steps, {len(attempts)} attempt, "
        f"losses {bitwise}; {restarted} daemons restarted"
    )
    return Row(
        "Add lab-node3 to the running lab while a job trains (converge, burn-in, join by "
        "`scontrol reconfigure`) / remove it",
        "lab, real Slurm",
        value,
        [LAB_NODES],
    )


def row_lab_mixed_faults(res: Results) -> Row:
    doc = res.json(LAB_MIXED)
    faults = _get(doc, LAB_MIXED, "faults")
    if len(faults) != 10:
        raise ResultsError(
            f"{LAB_MIXED}: {len(faults)} faults recorded, 10 expected (the run did not finish)"
        )

    def span(kind: str, batch: bool | None = None) -> str:
        vals = [
            float(f["first_new_step_s"])
            for f in faults
            if f["kind"] == kind and (batch is None or bool(f.get("batch_host")) == batch)
        ]
        if not vals:
            return "-"
        lo, hi = _num(min(vals), 1), _num(max(vals), 1)
        return f"{lo} s" if lo == hi else f"{lo}-{hi} s"

    lost = sum(int(f["first_new_step"]) - int(f["last_ckpt"]) - 1 for f in faults)
    value = (
        f"rank {span('rank')}; node or partition of node 0 (the batch host) {span('node', True)} / "
        f"{span('partition', True)}, of the other node {span('node', False)} / {span('partition', False)}; "
        f"{lost} steps lost, every loss bitwise, job {_get(doc, LAB_MIXED, 'job')} COMPLETED"
    )
    return Row(
        "Ten mixed faults (4 rank, 3 node, 3 partition) in one Slurm job -> first new step each",
        "lab, real Slurm",
        value,
        [LAB_MIXED],
    )
