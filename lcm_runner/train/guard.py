"""The numerical guard: a NaN or Inf loss or gradient on any rank stops that step's optimizer update
and any save (Megatron-LM's --check-for-nan-in-loss-and-grad, with a skip budget).

Per step, after the gradients are reduced and before the optimizer: one MAX all-reduce of two flags
(loss non-finite, gradient non-finite) over every rank, so all ranks skip the same step. Past
`max_skips` skipped steps in one attempt the trainer exits ExitCode.NONFINITE after rewinding `latest`
to the newest known-good checkpoint (the restart then resumes from there, not from the checkpoint it
may have been poisoned by); once it has rewound to the same checkpoint `max_rewinds` times it exits
ExitCode.NONFINITE_REPEATED (deterministic: a restart would only repeat it).
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.distributed as dist

from lcm_runner.ckpt import catalog
from lcm_runner.ckpt.integrity import fsync_write_json
from lcm_runner.contracts import ExitCode


@dataclass
class Verdict:
    bad: bool
    what: str  # "loss", "grad", "loss+grad" or ""


@dataclass
class NumericalGuard:
    max_skips: int
    max_rewinds: int
    dev: torch.device
    skipped: list[int] = field(default_factory=list)

    def check(self, loss: torch.Tensor, grads: list[torch.Tensor]) -> Verdict:
        """All ranks: is this step's loss or any gradient NaN/Inf on any rank? The flags are computed on
        the device and read once, after the all-reduce: one synchronisation per step."""
        loss_bad = ~torch.isfinite(loss).all()
        if grads:
            norms = torch._foreach_norm(grads)
            grad_bad = ~torch.isfinite(torch.stack([n.float() for n in norms])).all()
        else:
            grad_bad = torch.zeros((), dtype=torch.bool, device=loss.device)
        flags = torch.stack([loss_bad, grad_bad]).to(device=self.dev, dtype=torch.float32)
        dist.all_reduce(flags, op=dist.ReduceOp.MAX)
        loss_flag, grad_flag = (bool(x) for x in flags.tolist())
        what = "+".join(n for n, b in (("loss", loss_flag), ("grad", grad_flag)) if b)
        return Verdict(loss_flag or grad_flag, what)

    def record_skip(self, step: int) -> bool:
        """Count a skipped step; True when the budget is spent."""
        self.skipped.append(step)
        return len(self.skipped) > self.max_skips


def read_guard_state(save_dir: Path) -> dict:
    try:
        return json.loads((save_dir / catalog.GUARD_FILE).read_text())
    except (OSError, ValueError):
        return {"rewinds": {}, "history": []}


def rewind(save_dir: Path | None, step: int, max_rewinds: int) -> tuple[ExitCode, str]:
    """Rank 0, after the skip budget is spent: move `latest` back to the newest known-good checkpoint.
    Returns (exit code, one-line reason)."""
    if save_dir is None:
        return ExitCode.NONFINITE_REPEATED, "non-finite values and no --save directory to go back to"
    good = catalog.newest_known_good(save_dir)
    if good is None:
        return (
            ExitCode.NONFINITE_REPEATED,
            f"non-finite values at step {step} and no known-good checkpoint in {save_dir} to go back to",
        )
    state = read_guard_state(save_dir)
    done = int(state.setdefault("rewinds", {}).get(str(good), 0))
    if done >= max_rewinds:
        if catalog.read_latest(save_dir) != good:  # an operator resumes from known-good, not the suspect
            catalog.write_latest_atomically(save_dir, good)
        return (
            ExitCode.NONFINITE_REPEATED,
            f"non-finite values at step {step} again after {done} rewind(s) to iter {good}: "
            f"deterministic, not restarting (latest names known-good {good})",
        )
    state["rewinds"][str(good)] = done + 1
    state.setdefault("history", []).append({"ts": time.time(), "at_step": step, "to_step": good})
    previous = catalog.read_latest(save_dir)
    catalog.write_latest_atomically(save_dir, good)
    fsync_write_json(save_dir / catalog.GUARD_FILE, state)
    return (
        ExitCode.NONFINITE,
        f"non-finite values at step {step}: latest rewound from {previous} to known-good {good} "
        f"(rewind {done + 1} of {max_rewinds})",
    )
