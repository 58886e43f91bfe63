"""README Measured row of the engine against Megatron-LM's pretrain_gpt.py on one H200
(benchmarks/engine_vs_megatron.sh, docs/results/h200-engine-vs-megatron/)."""

from __future__ import annotations

from lcm_runner.report.readme_sources import Results, Row, _get, _num

VS_MEGATRON = "docs/results/h200-engine-vs-megatron/summary.json"


def row_engine_vs_megatron(res: Results) -> Row:
    doc = res.json(VS_MEGATRON)
    runs = _get(doc, VS_MEGATRON, "runs")

    def ms(name: str) -> float:
        return float(_get(runs[name], VS_MEGATRON, "median_step_ms"))

    ref = ms("megatron-lm")
    unfused, flash = ms("engine-unfused"), ms("engine-flash")
    value = (
        f"Megatron-LM {_num(ref, 1)} ms; engine unfused {_num(unfused, 1)} ms = {_num(unfused / ref, 2)}x; "
        f"engine + SDPA flash {_num(flash, 1)} ms = {_num(ref / flash, 2)}x faster"
    )
    if "engine-flash-grouped" in runs:
        fg = ms("engine-flash-grouped")
        value += f"; + grouped expert GEMMs {_num(fg, 1)} ms = {_num(ref / fg, 2)}x faster"
    return Row(
        "MoE GPT step, same shape, one run: Megatron-LM `pretrain_gpt.py` (unfused) vs the engine "
        "unfused / with `--use-flash-attn` / and `--moe-grouped-gemm` (median of steps 5-40)",
        "H200",
        value,
        [VS_MEGATRON],
    )
