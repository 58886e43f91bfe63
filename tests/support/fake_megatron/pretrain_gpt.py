"""A CPU stand-in for Megatron-LM core_v0.19.0's `pretrain_gpt.py` (see README.md next to this file).

From the outside it behaves like the real script: Megatron's flag names (a subset; anything else is
argparse's error, exit 2), its console lines (iteration line, save/load lines, exit messages), its
torch_dist checkpoint layout (torch DCP `__<rank>_0.distcp` + `.metadata`, then `metadata.json`, then
`latest_checkpointed_iteration.txt`) and its `--exit-signal-handler` / `--exit-interval` exits. Inside it
is a tiny MLP language model on synthetic tokens, data parallel over gloo. Each quoted message names
the Megatron source it comes from.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import signal
import sys
import time
from datetime import datetime
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch import nn

MCORE_VERSION = "0.19.1"  # megatron/core/package_info.py of the core_v0.19.0 archive
TRACKER = "latest_checkpointed_iteration.txt"  # checkpointing.get_checkpoint_tracker_filename
STEP_SLEEP_S = float(os.environ.get("FAKE_MEGATRON_STEP_SLEEP_S", "0.05"))
_TOKENIZERS = ["BertWordPieceLowerCase", "BertWordPieceCase", "GPT2BPETokenizer", "SentencePieceTokenizer",
               "GPTSentencePieceTokenizer", "HuggingFaceTokenizer", "Llama2Tokenizer", "TikTokenizer",
               "MultimodalTokenizer", "NullTokenizer", "NullMultimodalTokenizer", "SFTTokenizer"]  # fmt: skip


def build_parser() -> argparse.ArgumentParser:
    """Megatron's names and defaults (arguments.py, training/config/*.py, core transformer_config.py)."""
    p = argparse.ArgumentParser(description="Megatron-LM Arguments", allow_abbrev=False)
    a = p.add_argument
    for name in ("num-layers", "hidden-size", "num-attention-heads", "ffn-hidden-size", "seq-length",
                 "max-position-embeddings", "micro-batch-size", "global-batch-size", "vocab-size",
                 "train-iters", "save-interval", "exit-interval", "num-experts", "eval-interval",
                 "lr-decay-iters"):  # fmt: skip
        a(f"--{name}", type=int, default=None)
    a("--log-interval", type=int, default=100)
    a("--eval-iters", type=int, default=100)
    a("--seed", type=int, default=1234)
    a("--moe-router-topk", type=int, default=2)
    a("--lr-warmup-iters", type=int, default=0)
    for name in ("tensor-model-parallel-size", "pipeline-model-parallel-size", "expert-model-parallel-size"):
        a(f"--{name}", type=int, default=1)
    a("--lr", type=float, default=None)
    a("--min-lr", type=float, default=0.0)
    a("--weight-decay", type=float, default=0.01)
    a("--clip-grad", type=float, default=1.0)
    a("--adam-beta1", type=float, default=0.9)
    a("--adam-beta2", type=float, default=0.999)
    a("--adam-eps", type=float, default=1e-08)
    a("--hidden-dropout", type=float, default=0.1)
    a("--attention-dropout", type=float, default=0.1)
    a("--lr-decay-style", default="linear", choices=["constant", "linear", "cosine"])
    a("--save", default=None)
    a("--load", default=None)
    a("--split", default=None)
    a("--tokenizer-type", default=None, choices=_TOKENIZERS)
    a("--distributed-backend", default="nccl", choices=["nccl", "gloo"])
    a("--transformer-impl", default="transformer_engine",
      choices=["local", "transformer_engine", "inference_optimized"])  # fmt: skip
    a("--moe-token-dispatcher-type", default="allgather", choices=["allgather", "alltoall", "flex"])
    a("--position-embedding-type", default="learned_absolute",
      choices=["learned_absolute", "rope", "mrope", "relative", "none"])  # fmt: skip
    a("--ckpt-format", default="torch_dist", choices=["torch_dist"])  # the only format the fake writes
    a("--exit-signal", type=lambda s: signal.Signals[s], default=signal.SIGTERM)
    for name in ("exit-signal-handler", "async-save", "use-persistent-ckpt-worker", "mock-data", "bf16",
                 "use-distributed-optimizer", "no-persist-layer-norm"):  # fmt: skip
        a(f"--{name}", action="store_true")
    a("--disable-bias-linear", dest="add_bias_linear", action="store_false")
    for name in ("masked-softmax", "bias-gelu", "bias-swiglu", "gradient-accumulation"):
        a(f"--no-{name}-fusion", dest=f"{name.replace('-', '_')}_fusion", action="store_false")
    return p


def rank0_print(msg: str) -> None:  # utils.print_rank_0
    if dist.get_rank() == 0:
        print(msg, flush=True)


def last_print(msg: str) -> None:  # utils.print_rank_last
    if dist.get_rank() == dist.get_world_size() - 1:
        print(msg, flush=True)


def now() -> str:
    return datetime.now().strftime("%Y-%m-%d %H:%M:%S.%f")


def print_datetime(what: str) -> None:  # training.print_datetime (barrier, then rank 0)
    dist.barrier()
    rank0_print(f"[{what}] datetime: {now()} ")


def log_timer(name: str, ms: float) -> None:  # core/timers.py Timers.log: logger.info on the last rank
    lo, hi = torch.tensor([ms], dtype=torch.float64), torch.tensor([ms], dtype=torch.float64)
    dist.all_reduce(lo, op=dist.ReduceOp.MIN)
    dist.all_reduce(hi, op=dist.ReduceOp.MAX)
    if dist.get_rank() == dist.get_world_size() - 1:
        line = "{}: ({:.2f}, {:.2f})".format((name + " ").ljust(48, "."), lo.item(), hi.item())
        head = "INFO:megatron.core.timers:(min, max) time across ranks (ms):"
        print(f"{head}\n    {line}", file=sys.stderr, flush=True)


def validate(args: argparse.Namespace) -> None:
    """arguments.validate_args + the microbatch calculator (num_microbatches_calculator.py)."""
    args.rank, args.world_size = int(os.getenv("RANK", "0")), int(os.getenv("WORLD_SIZE", "1"))
    mp = args.tensor_model_parallel_size * args.pipeline_model_parallel_size
    assert args.world_size % mp == 0, (
        f"world size ({args.world_size}) is not divisible by total_model_size (total_model_size={mp})"
    )
    args.data_parallel_size = args.world_size // mp
    rank0 = args.rank == 0
    if rank0:
        print(f"using world size: {args.world_size}, data-parallel size: {args.data_parallel_size}, "
              "context-parallel size: 1, hierarchical context-parallel sizes: None, "
              f"tensor-model-parallel size: {args.tensor_model_parallel_size}, "
              f"pipeline-model-parallel size: {args.pipeline_model_parallel_size}", flush=True)  # fmt: skip
        print("Number of virtual stages per pipeline stage: None", flush=True)
    for req in ("num_layers", "hidden_size", "num_attention_heads", "seq_length", "micro_batch_size",
                "train_iters", "lr"):  # fmt: skip
        assert getattr(args, req) is not None, f"--{req.replace('_', '-')} is required"
    if args.global_batch_size is None:
        args.global_batch_size = args.micro_batch_size * args.data_parallel_size
        if rank0:
            print(f"setting global batch size to {args.global_batch_size}", flush=True)
    if args.max_position_embeddings is None:
        args.max_position_embeddings = args.seq_length
    assert args.max_position_embeddings >= args.seq_length, (
        f"max_position_embeddings ({args.max_position_embeddings}) must be greater than "
        f"or equal to seq_length ({args.seq_length})."
    )
    if args.save is not None:
        assert args.save_interval is not None
        assert args.save_interval > 0
    if args.async_save and not args.use_persistent_ckpt_worker:
        args.async_save = False  # arguments.py: warn_rank_0 (a UserWarning pretrain_gpt.py filters out)
    if rank0:
        if args.bf16:
            print("accumulate and all-reduce gradients in fp32 for bfloat16 data type.", flush=True)
        print(f"using {torch.bfloat16 if args.bf16 else torch.float} for parameters ...", flush=True)
        print("------------------------ arguments ------------------------", flush=True)
        lines = ["  {} {} {}".format(k, "." * (48 - len(k)), v) for k, v in vars(args).items()]
        for line in sorted(lines, key=lambda x: x.lower()):
            print(line, flush=True)
        print("-------------------- end of arguments ---------------------", flush=True)
    per_step = args.micro_batch_size * args.data_parallel_size
    assert args.global_batch_size % per_step == 0, (
        f"global batch size ({args.global_batch_size}) is not divisible by micro batch size "
        f"({args.micro_batch_size}) times data parallel size ({args.data_parallel_size})"
    )
    args.num_microbatches = args.global_batch_size // per_step
    if rank0:
        print("INFO:megatron.core.num_microbatches_calculator:setting number of microbatches to "
              f"constant {args.num_microbatches}", file=sys.stderr, flush=True)  # fmt: skip


class TinyLM(nn.Module):
    """Embedding + learned positions + `num_layers` pre-norm MLP blocks, output tied to the embedding.
    Dims are Megatron's, scaled down to stay fast on a CPU (the vocabulary is kept, so the loss starts
    near ln(vocab) like the real run's)."""

    def __init__(self, args: argparse.Namespace) -> None:
        super().__init__()
        h, f = min(args.hidden_size, 64), min(args.ffn_hidden_size or 4 * args.hidden_size, 128)
        self.embedding = nn.Embedding(args.vocab_size, h)
        self.position = nn.Embedding(args.max_position_embeddings, h)
        bias = args.add_bias_linear
        self.layers = nn.ModuleList(
            nn.Sequential(nn.LayerNorm(h), nn.Linear(h, f, bias=bias), nn.GELU(), nn.Linear(f, h, bias=bias))
            for _ in range(args.num_layers)
        )
        self.final_layernorm = nn.LayerNorm(h)
        for p in self.parameters():
            if p.dim() > 1:
                nn.init.normal_(p, std=0.02)  # init_method_std

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.embedding(tokens) + self.position(torch.arange(tokens.shape[1]))
        for layer in self.layers:
            x = x + layer(x)
        return self.final_layernorm(x) @ self.embedding.weight.t()


def micro_batch(args: argparse.Namespace, iteration: int, mb: int, dp_rank: int) -> torch.Tensor:
    """The samples of one micro-batch, as MegatronPretrainingSampler hands them out: global sample index
    = consumed samples + microbatch * (mbs * dp) + dp_rank * mbs + j. A sample depends only on its index
    and --seed: a first token, then next = (7 * token + 13 + noise in 0..3) mod vocab."""
    seq = min(args.seq_length, 64)
    mbs = args.micro_batch_size
    first = iteration * args.global_batch_size + (mb * args.data_parallel_size + dp_rank) * mbs
    rows = []
    for k in range(first, first + mbs):
        g = torch.Generator().manual_seed(args.seed * 1_000_003 + k)
        noise = torch.randint(0, 4, (seq,), generator=g)
        toks = [int(torch.randint(0, args.vocab_size, (1,), generator=g))]
        for n in noise.tolist():
            toks.append((7 * toks[-1] + 13 + n) % args.vocab_size)
        rows.append(toks)
    return torch.tensor(rows)


class Trainer:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.model = TinyLM(args)
        self.params = list(self.model.parameters())
        self.exp_avg = [torch.zeros_like(p) for p in self.params]
        self.exp_avg_sq = [torch.zeros_like(p) for p in self.params]
        self.iteration, self.consumed = 0, 0
        self.pending: int | None = None  # an async save whose finalization is due
        self.warned_async = False

    def lr(self, steps: int) -> float:  # optimizer_param_scheduler.OptimizerParamScheduler.get_lr
        a = self.args
        decay, warm = a.lr_decay_iters or a.train_iters, a.lr_warmup_iters
        if warm > 0 and steps <= warm:
            return a.lr * steps / warm
        if a.lr_decay_style == "constant":
            return a.lr
        if steps > decay:
            return a.min_lr
        ratio = (steps - warm) / (decay - warm)
        coeff = 1.0 - ratio if a.lr_decay_style == "linear" else 0.5 * (math.cos(math.pi * ratio) + 1.0)
        return a.min_lr + coeff * (a.lr - a.min_lr)

    def train_step(self) -> tuple[float, float]:
        """Forward/backward over the micro-batches, grads averaged over all ranks (model-parallel peers
        of one dp rank compute the same batch), clip, AdamW. Returns (lm loss, grad norm before clip)."""
        a, tp = self.args, self.args.tensor_model_parallel_size
        dp_rank = (a.rank // tp) % a.data_parallel_size
        for p in self.params:
            p.grad = None
        loss_sum = torch.zeros(1)
        for mb in range(a.num_microbatches):
            tokens = micro_batch(a, self.iteration, mb, dp_rank)
            logits = self.model(tokens[:, :-1])
            loss = nn.functional.cross_entropy(logits.flatten(0, 1), tokens[:, 1:].flatten())
            (loss / a.num_microbatches).backward()
            loss_sum += loss.detach()
        flat = torch.cat([p.grad.reshape(-1) for p in self.params] + [loss_sum / a.num_microbatches])
        dist.all_reduce(flat)
        flat /= a.world_size
        offset = 0
        for p in self.params:
            p.grad.copy_(flat[offset : offset + p.numel()].view_as(p))
            offset += p.numel()
        norm = float(torch.nn.utils.clip_grad_norm_(self.params, a.clip_grad))
        lr, b1, b2, step = self.lr(self.iteration), a.adam_beta1, a.adam_beta2, self.iteration + 1
        with torch.no_grad():
            for p, m, v in zip(self.params, self.exp_avg, self.exp_avg_sq, strict=True):
                if p.dim() > 1:  # Megatron: no weight decay on biases and norms
                    p.mul_(1.0 - lr * a.weight_decay)
                m.mul_(b1).add_(p.grad, alpha=1 - b1)
                v.mul_(b2).addcmul_(p.grad, p.grad, value=1 - b2)
                denom = (v / (1 - b2**step)).sqrt_().add_(a.adam_eps)
                p.addcdiv_(m, denom, value=-lr / (1 - b1**step))
        time.sleep(STEP_SLEEP_S)
        return float(flat[-1]), norm

    def state(self) -> dict[str, Any]:
        sd: dict[str, Any] = {f"model.{k}": v for k, v in self.model.state_dict().items()}
        names = [n for n, _ in self.model.named_parameters()]
        sd.update({f"optimizer.exp_avg.{n}": t for n, t in zip(names, self.exp_avg, strict=True)})
        sd.update({f"optimizer.exp_avg_sq.{n}": t for n, t in zip(names, self.exp_avg_sq, strict=True)})
        args = {k: (v.name if isinstance(v, signal.Signals) else v) for k, v in vars(self.args).items()}
        args["consumed_train_samples"] = self.consumed
        sd["common_state"] = {
            "args": args,
            "checkpoint_version": 3.0,
            "iteration": self.iteration,
            "opt_param_scheduler": {"num_steps": self.iteration * self.args.global_batch_size},
            "content_metadata": {"singleton_local_shards": False, "chained_optim_avoid_prefix": True},
        }
        return sd

    def save(self) -> None:
        """checkpointing.save_checkpoint (torch_dist) as training.save_checkpoint_and_time calls it."""
        a, it, t0 = self.args, self.iteration, time.perf_counter()
        rank0_print(f"[{now()}] saving checkpoint at iteration {it:7d} to {a.save} in torch_dist format")
        if not self.warned_async:  # dist_checkpointing/strategies/torch.py, once per process
            print("WARNING:megatron.core.dist_checkpointing.strategies.torch:MCore's async save is "
                  "deprecated and will be removed in the future releases. Please, use NVRx async solution "
                  "by setting `async_strategy` to `nvrx`.", file=sys.stderr, flush=True)  # fmt: skip
            self.warned_async = True
        ckpt = Path(a.save) / f"iter_{it:07d}"
        if dist.get_rank() == 0:
            ckpt.mkdir(parents=True, exist_ok=True)
        dist.barrier()
        dcp.save(self.state(), storage_writer=dcp.FileSystemWriter(ckpt, thread_count=1))
        if a.async_save:
            self.pending = it
            rank0_print(f"  [{now()}] scheduled an async checkpoint save at iteration {it:7d} to {a.save}")
        else:
            self.finalize(it)
        log_timer("save-checkpoint", (time.perf_counter() - t0) * 1000.0)

    def finalize(self, it: int) -> None:
        """serialization.save's metadata_finalize_fn, then checkpointing's iter_finalize_fn (rank 0)."""
        self.pending = None
        save = Path(self.args.save)
        if dist.get_rank() == 0:
            with open(save / f"iter_{it:07d}" / "metadata.json", "w") as f:
                json.dump({"sharded_backend": "torch_dist", "sharded_backend_version": 1}, f)
                f.flush()
                os.fsync(f.fileno())
        dist.barrier()
        if dist.get_rank() == 0:
            tmp = save / f".{TRACKER}.tmp"
            with open(tmp, "w") as f:
                f.write(str(it))
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, save / TRACKER)
            fd = os.open(save, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
            t, p = self.args.tensor_model_parallel_size, self.args.pipeline_model_parallel_size
            print(f"  [{now()}] successfully saved checkpoint from iteration {it:7d} to {self.args.save} "
                  f"[ t 1/{t}, gtp_remat 1/1, p 1/{p} ]", flush=True)  # fmt: skip
        dist.barrier()

    def load(self) -> None:
        """checkpointing.load_checkpoint / _load_base_checkpoint for a torch_dist checkpoint."""
        load, t0 = self.args.load, time.perf_counter()
        tracker = Path(load) / TRACKER
        text = tracker.read_text().strip() if tracker.is_file() else None
        if text is None:
            rank0_print(f"WARNING: could not find the metadata file {tracker}")
            rank0_print("    will not load any checkpoints and will start from random")
        else:
            try:
                it = int(text)
            except ValueError:
                rank0_print(f"ERROR: Invalid metadata file {tracker}. Exiting")
                sys.exit()
            sd = self.state()
            dcp.load(sd, storage_reader=dcp.FileSystemReader(Path(load) / f"iter_{it:07d}"))
            common = sd["common_state"]
            meta = common["content_metadata"]
            rank0_print(f"sharded_state_dict metadata loaded from the checkpoint: {meta}")
            rank0_print(f" loading distributed checkpoint from {load} at iteration {it}")
            self.model.load_state_dict({k[6:]: v for k, v in sd.items() if k.startswith("model.")})
            for i, (n, _) in enumerate(self.model.named_parameters()):
                self.exp_avg[i].copy_(sd[f"optimizer.exp_avg.{n}"])
                self.exp_avg_sq[i].copy_(sd[f"optimizer.exp_avg_sq.{n}"])
            self.iteration = int(common["iteration"])
            self.consumed = int(common["args"]["consumed_train_samples"])
            rank0_print(f" checkpoint version {common['checkpoint_version']}")
            dist.barrier()
            t, p = self.args.tensor_model_parallel_size, self.args.pipeline_model_parallel_size
            rank0_print(f"  successfully loaded checkpoint from {load} [ t 1/{t}, gtp_remat 1/1, p 1/{p} ] "
                        f"at iteration {self.iteration}")  # fmt: skip
        log_timer("load-checkpoint", (time.perf_counter() - t0) * 1000.0)


def train(tr: Trainer, signalled: list[bool]) -> bool:
    """training.train + training_log + checkpoint_and_decide_exit. Returns True on an early exit."""
    a = tr.args
    acc = {"loss": 0.0, "iters": 0, "time": 0.0}
    first, mark = True, time.perf_counter()
    while tr.iteration < a.train_iters:
        if tr.pending is not None:  # maybe_finalize_async_save(blocking=False): our writes are done
            tr.finalize(tr.pending)
        loss, norm = tr.train_step()
        tr.iteration += 1
        tr.consumed += a.global_batch_size
        acc["loss"] += loss
        acc["iters"] += 1
        if tr.iteration % a.log_interval == 0 or first:
            dist.barrier()
            t = time.perf_counter()
            acc["time"] += t - mark
            mark = t
            line = f" [{now()}] iteration {tr.iteration:8d}/{a.train_iters:8d} |"
            line += f" consumed samples: {tr.consumed:12d} |"
            line += " elapsed time per iteration (ms): {:.1f} |".format(acc["time"] * 1000.0 / acc["iters"])
            line += f" learning rate: {tr.lr(tr.iteration):.6E} |"
            line += f" global batch size: {a.global_batch_size:5d} |"
            line += " lm loss: {:.6E} |".format(acc["loss"] / acc["iters"])
            if a.num_experts is not None:  # moe_aux_loss_coeff defaults to 0: the tracked loss is 0
                line += f" load_balancing_loss: {0.0:.6E} |"
            line += f" loss scale: {1.0:.1f} | grad norm: {norm:.3f} |"
            line += f" number of skipped iterations: {0:3d} | number of nan iterations: {0:3d} |"
            if not first:  # training_log does not reset its sums after a run's first iteration
                acc = {"loss": 0.0, "iters": 0, "time": 0.0}
            last_print(line)
            first = False
        saved = False
        if a.exit_signal_handler:  # DistributedSignalHandler.signals_received: all-gather of the flag
            flags = [torch.zeros(1, dtype=torch.int32) for _ in range(a.world_size)]
            dist.all_gather(flags, torch.tensor([int(signalled[0])], dtype=torch.int32))
            if any(int(f) for f in flags):
                if a.save:
                    tr.save()
                print_datetime("exiting program after receiving SIGTERM.")
                return True
        if a.save and tr.iteration % a.save_interval == 0:
            acc["time"] += time.perf_counter() - mark  # the interval timer stops during a save
            tr.save()
            mark, saved = time.perf_counter(), True
        if a.exit_interval and tr.iteration % a.exit_interval == 0:
            if a.save and not saved:
                tr.save()
            print_datetime(f"exiting program at iteration {tr.iteration}")
            return True
    return False


def main() -> None:
    t_start = time.time()
    args = build_parser().parse_args()
    if int(os.getenv("RANK", "0")) == 0:
        print(f"> PyTorch version ................ {torch.__version__}", flush=True)
        print(f"> Megatron-Core version .......... {MCORE_VERSION}", flush=True)
        print("> Transformer Engine version ... 0.0.0", flush=True)
    validate(args)
    if args.vocab_size is None:
        args.vocab_size = 1024
    signalled = [False]
    if args.exit_signal_handler:  # global_vars._set_signal_handler, during initialize_megatron
        signal.signal(args.exit_signal, lambda _s, _f: signalled.__setitem__(0, True))
    if args.rank == 0:
        print("> initializing torch distributed ...", flush=True)
    if "MASTER_ADDR" in os.environ:  # gloo whatever --distributed-backend says: there is no CUDA here
        dist.init_process_group("gloo", rank=args.rank, world_size=args.world_size)
    else:
        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    rank0_print(f"> initialized tensor model parallel with size {args.tensor_model_parallel_size}")
    rank0_print(f"> initialized pipeline model parallel with size {args.pipeline_model_parallel_size}")
    rank0_print(f"> setting random seeds to {args.seed} ...")
    torch.manual_seed(args.seed)
    rank0_print(f"time to initialize megatron (seconds): {time.time() - t_start:.3f}")
    print_datetime("after megatron is initialized")
    tr = Trainer(args)
    if (args.rank // args.tensor_model_parallel_size) % args.data_parallel_size == 0:
        print(" > number of parameters on (tensor, gtp_remat, pipeline) model parallel rank "
              f"({args.rank % args.tensor_model_parallel_size}, 0, 0): "
              f"{sum(p.numel() for p in tr.params)}", flush=True)  # fmt: skip
    if args.load is not None:
        tr.load()
    print_datetime("after model, optimizer, and learning rate scheduler are built")
    print_datetime("after dataloaders are built")
    rank0_print("done with setup ...")
    rank0_print("training ...")
    print_datetime("before the start of training step")
    early = train(tr, signalled)
    if tr.pending is not None:  # maybe_finalize_async_save(blocking=True, terminate=True)
        tr.finalize(tr.pending)
    if early:
        dist.barrier()
        dist.destroy_process_group()  # else gloo's threads may abort the exit ("terminate called ...")
        sys.exit(0)  # training.train: sys.exit(exit_code), exit_code = 0 on these paths
    print_datetime("after training is done")
    if args.save and tr.iteration != 0 and tr.iteration % args.save_interval != 0:
        tr.save()
        if tr.pending is not None:
            tr.finalize(tr.pending)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
