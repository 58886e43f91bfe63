"""Megatron (megatron-core) MoE GPT training engine: `lcm-runner train` / `python -m lcm_runner.train`.

Modules: args (flags and the flag-only checks), rules (the shape and layout rules, shared with the run
config; no torch), model (GPTModel + DDP + optimizer), data (deterministic batches), checkpoint (save,
known-good; with ckpt_state: the sharded state, ckpt_load: verify and load, ckpt_errors: failures),
cpu_compat (CPU-only shims), telemetry (JSONL writer), signals (SIGUSR1/SIGTERM -> save + requeue),
guard (non-finite steps), procutil (checkpoint helper processes), distributed (device, process group),
trainer (the step loop), engine (the entry: setup, loop, exit code), cli (subcommand registration).
"""
