"""The user's Megatron-LM arguments plus what the stages need: added or overridden, and said so.

The runner owns a handful of flags (where to save and load, how often, how long, the exit-signal
handler that turns Slurm's warning signal into a checkpoint, one log line per iteration so every step is
seen, the backend); everything else is the user's and passes through unchanged. `compose` returns the
final argument list and one `ArgChange` per flag it added, overrode or removed; the stage results and
the report print them.

`shape` reads the model and parallel layout out of the user's arguments (Megatron's defaults where a
flag is absent), so the run config's `model` describes what really trains.
"""

from __future__ import annotations

from dataclasses import dataclass

# flags that take a value, as Megatron-LM core_v0.19.0 spells them (both --a-b and --a_b are accepted by
# its parser; users write the dashed form, and so do we)
_VALUE_FLAGS = frozenset(
    {
        "--save",
        "--load",
        "--save-interval",
        "--train-iters",
        "--log-interval",
        "--distributed-backend",
        "--exit-signal",
        "--exit-interval",
        "--num-layers",
        "--hidden-size",
        "--num-attention-heads",
        "--ffn-hidden-size",
        "--seq-length",
        "--max-position-embeddings",
        "--micro-batch-size",
        "--global-batch-size",
        "--tensor-model-parallel-size",
        "--pipeline-model-parallel-size",
        "--expert-model-parallel-size",
        "--num-experts",
        "--moe-router-topk",
        "--seed",
        "--vocab-size",
    }
)
_BOOL_FLAGS = frozenset({"--exit-signal-handler", "--bf16", "--fp16", "--use-flash-attn"})

# What the runner owns; the rest of the command line is the user's.
OWNED_VALUE = (
    "--save",
    "--load",
    "--save-interval",
    "--train-iters",
    "--log-interval",
    "--distributed-backend",
)
OWNED_BOOL = ("--exit-signal-handler",)


class ArgsError(ValueError):
    """The user's Megatron-LM arguments cannot be composed (a flag without its value, ...)."""


@dataclass(frozen=True)
class ArgChange:
    flag: str
    action: str  # added | overridden | removed
    user: str | None  # the user's value (None: absent; "" for a boolean flag that was present)
    runner: str | None  # the runner's value (None: removed; "" for a boolean flag)

    def describe(self) -> str:
        if self.action == "added":
            return f"{self.flag} {self.runner}".rstrip() + " (added)"
        if self.action == "removed":
            return f"{self.flag} (removed)"
        return f"{self.flag} {self.runner} (overrides the user's {self.user})"


def _norm(flag: str) -> str:
    return "--" + flag[2:].replace("_", "-") if flag.startswith("--") else flag


def parse(args: list[str]) -> list[tuple[str, str | None]]:
    """The user's argv as (flag, value) pairs in order; value None for a boolean flag. A token that
    is not a flag and follows a boolean flag is refused (it would be silently misread)."""
    out: list[tuple[str, str | None]] = []
    i = 0
    while i < len(args):
        tok = args[i]
        if not tok.startswith("--"):
            raise ArgsError(
                f"workload.args: {tok!r} is not a --flag (and follows no flag that takes a value)"
            )
        if "=" in tok:
            flag, _, value = tok.partition("=")
            out.append((_norm(flag), value))
            i += 1
            continue
        flag = _norm(tok)
        nxt = args[i + 1] if i + 1 < len(args) else None
        takes_value = flag in _VALUE_FLAGS or (
            flag not in _BOOL_FLAGS and nxt is not None and not (nxt.startswith("--") and len(nxt) > 2)
        )
        if flag in _VALUE_FLAGS and (nxt is None or (nxt.startswith("--") and len(nxt) > 2)):
            raise ArgsError(f"workload.args: {flag} needs a value")
        if takes_value:
            out.append((flag, nxt))
            i += 2
        else:
            out.append((flag, None))
            i += 1
    return out


def value(args: list[str], flag: str) -> str | None:
    """The last value the user gave `flag` (Megatron's argparse: the last one wins), or None."""
    found = None
    for f, v in parse(args):
        if f == flag:
            found = "" if v is None else v
    return found


def compose(
    user: list[str],
    *,
    save: str,
    load: str | None,
    save_interval: int,
    train_iters: int,
    gpu: bool,
    signal_handler: bool = True,
) -> tuple[list[str], list[ArgChange]]:
    """The argument list the ranks get: the user's flags in their order with the runner's values in
    place of its owned flags, then the owned flags the user did not give."""
    want: dict[str, str | None] = {
        "--save": save,
        "--load": load if load is not None else save,
        "--save-interval": str(save_interval),
        "--train-iters": str(train_iters),
        "--log-interval": "1",  # every iteration's line: the stages follow every step
        "--distributed-backend": "nccl" if gpu else "gloo",
    }
    pairs = parse(user)
    out: list[str] = []
    changes: list[ArgChange] = []
    seen: set[str] = set()
    for flag, val in pairs:
        if flag in want:
            if flag in seen:
                continue  # a repeated owned flag: one value, ours
            seen.add(flag)
            if val != want[flag]:
                changes.append(ArgChange(flag, "overridden", val, want[flag]))
            out += [flag, str(want[flag])]
        elif flag in OWNED_BOOL:
            if flag in seen:
                continue
            seen.add(flag)
            if signal_handler:
                out.append(flag)
            else:
                changes.append(ArgChange(flag, "removed", "", None))
        else:
            out += [flag] if val is None else [flag, val]
    for flag, val in want.items():
        if flag not in seen:
            changes.append(ArgChange(flag, "added", None, val))
            out += [flag, str(val)]
    if signal_handler and "--exit-signal-handler" not in seen:
        changes.append(ArgChange("--exit-signal-handler", "added", None, ""))
        out.append("--exit-signal-handler")
    return out, changes


@dataclass(frozen=True)
class Shape:
    """The model and layout the user's arguments describe (Megatron's defaults where absent)."""

    num_layers: int
    hidden_size: int
    num_attention_heads: int
    ffn_hidden_size: int
    seq_length: int
    micro_batch_size: int
    global_batch_size: int | None  # None: Megatron's default, micro batch x DP
    tp: int
    pp: int
    ep: int
    num_experts: int | None
    moe_router_topk: int
    bf16: bool
    seed: int
    exit_signal: str


def shape(user: list[str]) -> tuple[Shape | None, list[str]]:
    """The Shape of the user's arguments, or None and the problems (`workload.args: ...`)."""
    vals = {f: v for f, v in parse(user)}
    problems: list[str] = []

    def num(flag: str, default: int | None, required: bool = False) -> int | None:
        raw = vals.get(flag)
        if raw is None:
            if required:
                problems.append(f"workload.args: {flag} is required (Megatron-LM has no default)")
            return default
        try:
            n = int(raw)
        except ValueError:
            problems.append(f"workload.args: {flag} {raw!r} is not an integer")
            return default
        if n < 1:
            problems.append(f"workload.args: {flag} {n} must be >= 1")
        return n

    layers = num("--num-layers", None, True)
    hidden = num("--hidden-size", None, True)
    heads = num("--num-attention-heads", None, True)
    seq = num("--seq-length", None, True)
    ffn = num("--ffn-hidden-size", 4 * hidden if hidden else None)
    mbs = num("--micro-batch-size", None, True)
    gbs = num("--global-batch-size", None)
    tp = num("--tensor-model-parallel-size", 1)
    pp = num("--pipeline-model-parallel-size", 1)
    ep = num("--expert-model-parallel-size", 1)
    experts = num("--num-experts", None)
    topk = num("--moe-router-topk", 2)
    seed = num("--seed", 1234)
    sig = vals.get("--exit-signal") or "SIGTERM"
    if not sig.startswith("SIG"):
        problems.append(f"workload.args: --exit-signal {sig!r} is not a signal name (SIGTERM, SIGUSR1, ...)")
    if problems:
        return None, problems
    assert layers and hidden and heads and seq and ffn and mbs and tp and pp and ep and topk and seed
    return (
        Shape(
            num_layers=layers,
            hidden_size=hidden,
            num_attention_heads=heads,
            ffn_hidden_size=ffn,
            seq_length=seq,
            micro_batch_size=mbs,
            global_batch_size=gbs,
            tp=tp,
            pp=pp,
            ep=ep,
            num_experts=experts,
            moe_router_topk=topk,
            bf16="--bf16" in vals,
            seed=seed,
            exit_signal=sig,
        ),
        [],
    )
