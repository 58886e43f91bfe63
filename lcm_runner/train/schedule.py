"""The forward and backward passes of one step, through megatron-core's schedules.

`get_forward_backward_func()` picks the schedule from the parallel state: no pipelining (PP = 1: the
micro-batches one after the other, gradients accumulated) or 1F1B pipelining (PP > 1: warm-up forwards,
one-forward-one-backward, cool-down backwards, activations and their gradients sent between stages by
megatron's P2P communicator). The gradient reduction is not the schedule's: the trainer calls
`finalize_model_grads` itself, so it is timed and guarded separately.

The loss of a micro-batch is the mean per-token cross entropy, divided by the number of micro-batches
(megatron's legacy averaging, which the schedule applies to the returned tensor); `run()` returns this
rank's sum over its micro-batches on the last pipeline stage and zero on the others.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch


class Schedule:
    def __init__(
        self,
        built: Any,
        source: Any,
        *,
        device: torch.device,
        mask: torch.Tensor,
        position_ids: torch.Tensor,
        num_micro: int,
        micro_batch_size: int,
        seq_length: int,
        dp_rank: int,
    ) -> None:
        from megatron.core import parallel_state as ps
        from megatron.core.pipeline_parallel import get_forward_backward_func

        self.built, self.source, self.dev = built, source, device
        self.mask, self.pos = mask, position_ids
        self.num_micro, self.mbs, self.seq, self.dp_rank = num_micro, micro_batch_size, seq_length, dp_rank
        self.last_stage = ps.is_pipeline_last_stage()
        self.func = get_forward_backward_func()
        cfg = built.config
        cfg.finalize_model_grads_func = None  # the trainer reduces (and times) the gradients itself
        cfg.grad_scale_func = None  # no loss scaling: bf16 or fp32

    def run(self, step: int, poison: bool = False) -> torch.Tensor:
        """Forward and backward of every micro-batch of `step`; returns the summed loss (see module)."""
        losses: list[torch.Tensor] = []

        def forward_step(data_iterator: Iterator[int], model: Any) -> tuple[torch.Tensor, Any]:
            micro = next(data_iterator)
            # the step's global micro-batch index: the token stream does not depend on the DP layout
            batch = self.source.batch(step, 0, self.dp_rank * self.num_micro + micro)
            tokens = batch.tokens.to(self.dev, non_blocking=True)
            labels = batch.labels.to(self.dev, non_blocking=True)
            out = model(tokens, self.pos, self.mask, labels=labels)  # last stage: per-token CE [b, s]

            def loss_func(output: torch.Tensor) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
                loss = output.float().mean()
                if poison:
                    loss = loss * float("nan")  # fault injection: a NaN loss, and so NaN gradients
                losses.append(loss.detach().clone())  # the schedule divides `loss` in place
                return loss, {}

            return out, loss_func

        self.func(
            forward_step_func=forward_step,
            data_iterator=iter(range(self.num_micro)),
            model=[self.built.model],
            num_microbatches=self.num_micro,
            seq_length=self.seq,
            micro_batch_size=self.mbs,
            forward_only=False,
        )
        total = torch.zeros((), dtype=torch.float32, device=self.dev)
        for loss in losses:
            total += loss / self.num_micro
        return total
