"""Profile a few steps of the engine (torch.profiler) and print where a step's time goes: the top CUDA
kernels and CPU operators, and the device's busy share of the profiled window.

    python3 benchmarks/profile_step.py --out F.txt --steps 12:15 -- <lcm-runner train arguments>
"""

from __future__ import annotations

import argparse
import sys


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True)
    p.add_argument("--steps", default="12:15", help="first:last step profiled")
    ns, rest = p.parse_known_args()
    first, last = (int(x) for x in ns.steps.split(":"))
    rest = [a for a in rest if a != "--"]
    import torch
    from torch.profiler import ProfilerActivity, profile

    from lcm_runner.train import trainer as trainer_mod
    from lcm_runner.train.cli import main as train_main

    orig = trainer_mod.Trainer.train_step
    state: dict = {}

    def train_step(self, step: int, attempt: int = 0):  # type: ignore[no-untyped-def]
        if step == first:
            torch.cuda.synchronize()
            state["prof"] = profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA])
            state["prof"].__enter__()
        r = orig(self, step, attempt)
        if step == last and "prof" in state:
            torch.cuda.synchronize()
            prof = state.pop("prof")
            prof.__exit__(None, None, None)
            table = prof.key_averages().table(sort_by="cuda_time_total", row_limit=40)
            cpu = prof.key_averages().table(sort_by="cpu_time_total", row_limit=25)
            with open(ns.out, "w") as f:
                f.write(f"steps {first}..{last}\n{table}\n\n{cpu}\n")
        return r

    trainer_mod.Trainer.train_step = train_step  # type: ignore[method-assign]
    return int(train_main(rest))


if __name__ == "__main__":
    sys.exit(main())
