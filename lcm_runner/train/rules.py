"""The model-shape and parallel-layout rules of the trainer, in one copy for the trainer and the run config.

`lcm_runner.train.args` (the trainer's own argument checks) and `lcm_runner.config.validation` (the run
config, checked before any host changes) both call `shape_problems`; each names the fields its own way
(`--tensor-model-parallel-size 3` vs `model.tp = 3`) through a `Names`. Every rule is one that this
engine or megatron-core 0.19.2 would otherwise hit at start-up, after processes were launched:

- sizes must be positive; the layers divisible by PP (each pipeline stage builds as many);
- megatron's TransformerConfig: attention heads divisible by TP, `--sequence-parallel` needs TP > 1,
  top-k 1 needs a pre-softmax router (which the engine does not configure), EP > 1 needs experts;
- megatron's tensor-parallel layers (`divide()` asserts): the FFN width and the vocabulary divisible by
  TP (and the FFN width by expert TP), the sequence divisible by TP under sequence parallelism (implied
  by MoE with TP > 1), experts divisible by EP (MoELayer);
- the engine: hidden size divisible by heads (kv channels), top-k within the experts, position
  embeddings covering the sequence, bf16 only on CUDA, a head size the fused attention kernels take
  with `--use-flash-attn` (a multiple of 8, at most 256: flash-attention's and cuDNN's limits), a seed
  numpy's SeedSequence accepts (data.py);
- with a world size: world divisible by TP x PP and by EP x ETP x PP (parallel_state), the global batch a
  multiple of micro batch x DP (gradient accumulation).

No torch import here: run configs are validated on machines without it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

VOCAB_SIZE_DEFAULT = 256  # the trainer's --vocab-size default (synthetic data)
SEED_MAX = 2**63 - 1  # torch.manual_seed takes 64 bits; megatron adds small offsets per rank

# Sizes that must be positive (None = not set: the trainer derives it).
POSITIVE = (
    "num_layers",
    "hidden_size",
    "num_attention_heads",
    "ffn_hidden_size",
    "seq_length",
    "max_position_embeddings",
    "num_experts",
    "vocab_size",
    "micro_batch_size",
    "global_batch_size",
    "tensor_model_parallel_size",
    "pipeline_model_parallel_size",
    "expert_model_parallel_size",
    "expert_tensor_parallel_size",
    "train_iters",
)


@dataclass(frozen=True)
class Shape:
    """The values the rules read, under the trainer's (TrainArgs) names."""

    num_layers: int
    hidden_size: int
    num_attention_heads: int
    seq_length: int
    micro_batch_size: int
    train_iters: int
    ffn_hidden_size: int | None = None  # None: 4 x hidden size
    max_position_embeddings: int | None = None  # None: the sequence length
    num_experts: int | None = None  # None: a dense model
    moe_router_topk: int = 2
    vocab_size: int = VOCAB_SIZE_DEFAULT
    global_batch_size: int | None = None  # None: micro batch x DP
    tensor_model_parallel_size: int = 1
    pipeline_model_parallel_size: int = 1
    expert_model_parallel_size: int = 1
    expert_tensor_parallel_size: int | None = None  # None: TP
    sequence_parallel: bool = False
    bf16: bool = False
    use_flash_attn: bool = False
    device: str = "auto"
    seed: int = 1234

    @classmethod
    def of(cls, args: Any) -> Shape:
        """From any object with these attributes (a TrainArgs)."""
        from dataclasses import fields

        return cls(**{f.name: getattr(args, f.name) for f in fields(cls)})


@dataclass(frozen=True)
class Names:
    """How a caller names the fields: `flag` style (`--seq-length 64`) or `key` style (`model.x = 64`).

    `names` maps a Shape field (or `world_size`) to the caller's name; missing ones get `--<field>`;
    `refs` replaces the whole mention of a field whose value the caller does not set directly.
    """

    names: Mapping[str, str] = field(default_factory=dict)
    style: str = "flag"  # flag | key
    refs: Mapping[str, str] = field(
        default_factory=dict
    )  # a whole reference, e.g. device -> gpus_per_node = 0

    def __call__(self, name: str) -> str:
        return self.names.get(name) or "--" + name.replace("_", "-")

    def show(self, value: Any) -> str:
        if isinstance(value, bool) and self.style == "key":
            return "true" if value else "false"
        return str(value)

    def ref(self, name: str, value: Any) -> str:
        """Another field, with its value: `--num-attention-heads (4)`."""
        return self.refs.get(name) or f"{self(name)} ({self.show(value)})"

    def head(self, name: str, value: Any) -> str:
        if self.style == "key":
            return f"{self(name)} = {self.show(value)}"
        return self(name) if isinstance(value, bool) else f"{self(name)} {value}"


@dataclass(frozen=True)
class Problem:
    """One finding: the field, its value and what is expected (`message` renders it)."""

    field: str
    value: Any
    expected: str
    message: str

    def __str__(self) -> str:
        return self.message


def shape_problems(s: Shape, n: Names | None = None, world_size: int | None = None) -> list[Problem]:
    """Every rule `s` breaks; with `world_size`, the layout rules too. Empty when the trainer accepts it."""
    n = n or Names()
    out: list[Problem] = []

    def bad(name: str, value: Any, expected: str) -> None:
        out.append(Problem(name, value, expected, f"{n.head(name, value)}: expected {expected}"))

    for name in POSITIVE:
        value = getattr(s, name)
        if value is not None and value <= 0:
            bad(name, value, "a positive integer (> 0)")
    if world_size is not None and world_size <= 0:
        bad("world_size", world_size, "a positive integer (> 0)")
    if out:
        return out  # the arithmetic below needs positive numbers
    tp, pp, ep = s.tensor_model_parallel_size, s.pipeline_model_parallel_size, s.expert_model_parallel_size
    etp = s.expert_tensor_parallel_size or tp
    heads = s.num_attention_heads
    if s.num_layers % pp:
        bad("num_layers", s.num_layers, f"a multiple of {n.ref('pipeline_model_parallel_size', pp)}")
    if s.hidden_size % heads:
        bad("hidden_size", s.hidden_size, f"a multiple of {n.ref('num_attention_heads', heads)}")
    if heads % tp:
        bad("num_attention_heads", heads, f"a multiple of {n.ref('tensor_model_parallel_size', tp)}")
    ffn = s.ffn_hidden_size or 4 * s.hidden_size
    if ffn % tp:
        tp_ref = n.ref("tensor_model_parallel_size", tp)
        if s.ffn_hidden_size:
            bad("ffn_hidden_size", ffn, f"a multiple of {tp_ref}")
        else:
            bad(
                "hidden_size",
                s.hidden_size,
                f"a value whose default FFN width (4 x it = {ffn}) is a multiple of {tp_ref}, or "
                f"{n('ffn_hidden_size')} set",
            )
    if s.vocab_size % tp:
        bad("vocab_size", s.vocab_size, f"a multiple of {n.ref('tensor_model_parallel_size', tp)}")
    moe = s.num_experts is not None
    sequence_parallel = s.sequence_parallel or (moe and tp > 1)
    if s.sequence_parallel and tp == 1:
        bad("sequence_parallel", True, f"{n.ref('tensor_model_parallel_size', tp)} > 1 (megatron refuses it)")
    elif sequence_parallel and s.seq_length % tp:
        why = "sequence parallelism, implied by MoE with TP > 1" if moe else "sequence parallelism"
        bad("seq_length", s.seq_length, f"a multiple of {n.ref('tensor_model_parallel_size', tp)} ({why})")
    if s.max_position_embeddings is not None and s.max_position_embeddings < s.seq_length:
        bad(
            "max_position_embeddings",
            s.max_position_embeddings,
            f"at least {n.ref('seq_length', s.seq_length)}",
        )
    if s.num_experts is None:
        if ep > 1:
            bad("expert_model_parallel_size", ep, f"1 for a dense model ({n('num_experts')} not set)")
    else:
        if s.num_experts % ep:
            bad("num_experts", s.num_experts, f"a multiple of {n.ref('expert_model_parallel_size', ep)}")
        if etp != tp and ffn % etp:
            bad("ffn_hidden_size", ffn, f"a multiple of {n.ref('expert_tensor_parallel_size', etp)}")
        k = s.moe_router_topk
        if not 1 <= k <= s.num_experts:
            bad("moe_router_topk", k, f"in 1..{n.ref('num_experts', s.num_experts)}")
        elif k == 1:
            bad(
                "moe_router_topk",
                k,
                "at least 2: megatron refuses top-1 routing without a pre-softmax router, which this "
                "engine does not configure",
            )
    if s.bf16 and s.device == "cpu":
        bad(
            "bf16",
            True,
            f"no bf16 with {n.ref('device', 'cpu')}: bf16 is a GPU option, CPU runs train in fp32",
        )
    head_dim = s.hidden_size // heads
    if (
        s.use_flash_attn
        and s.device != "cpu"
        and not s.hidden_size % heads
        and (head_dim % 8 or head_dim > 256)
    ):
        bad(
            "use_flash_attn",
            True,
            f"a head size the fused attention kernels take: {n.ref('hidden_size', s.hidden_size)} / "
            f"{n.ref('num_attention_heads', heads)} = {head_dim}, must be a multiple of 8 and at most 256",
        )
    if not 0 <= s.seed <= SEED_MAX:
        bad("seed", s.seed, f"in 0..{SEED_MAX} (numpy's SeedSequence and torch.manual_seed take it)")
    if world_size is None:
        return out
    mp = tp * pp
    if world_size % mp:
        bad("world_size", world_size, f"a multiple of TP ({tp}) x PP ({pp}) = {mp}")
        return out
    dp = world_size // mp
    if world_size % (ep * etp * pp):
        bad("world_size", world_size, f"a multiple of EP ({ep}) x ETP ({etp}) x PP ({pp}) = {ep * etp * pp}")
    gbs = s.global_batch_size or s.micro_batch_size * dp
    if gbs % (s.micro_batch_size * dp):
        bad(
            "global_batch_size",
            gbs,
            f"a multiple of {n.ref('micro_batch_size', s.micro_batch_size)} x DP ({dp}) = "
            f"{s.micro_batch_size * dp}",
        )
    return out
