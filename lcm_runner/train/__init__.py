"""Megatron (megatron-core) MoE GPT training engine: `lcm-runner train` / `python -m lcm_runner.train`.

Modules: args (flags), model (GPTModel + DDP + optimizer), data (deterministic batches), checkpoint
(dist_checkpointing, latest pointer, keep-last), cpu_compat (CPU-only shims), telemetry (JSONL writer),
signals (SIGUSR1/SIGTERM -> save + requeue), engine (the loop), cli (subcommand registration).
"""
