"""Validating a (type-correct) run config as a whole: every problem as `key: why`, all at once.

The model's shape and parallel layout are checked by the trainer's own rules (lcm_runner/train/rules.py)
on the very arguments a launch passes (argv.py), named here by their run-config keys (`model.tp = 3:
expected ...`): a value the trainer or megatron-core would reject at start-up is refused before any host
changes. The rest (names, paths, Slurm values, the fault plan, NCCL, SLO targets) is the run config's own.
`cluster_problems` checks a config against a (valid) cluster spec.
"""

from __future__ import annotations

import re
from dataclasses import fields
from typing import Any

from lcm_runner.contracts import AGENTS, LAUNCHERS
from lcm_runner.spec.safe import COMMAND_RE, PARTITION_RE, path_inside, path_problem
from lcm_runner.train.rules import Names, Shape, shape_problems

from .argv import trainer_args
from .types import FAULT_CASES, NCCL_DEBUG_LEVELS, WORKLOADS, RunConfig, Targets

_SLURM_TIME = re.compile(r"^(?:(\d+)-)?(\d{1,2}):(\d{2}):(\d{2})$|^(\d+)$")
_ENV_NAME = re.compile(r"^[A-Z_][A-Z0-9_]*$")
# Values below become shell words, Slurm options and file names (the run dir, the job name lcm-<name>);
# they are matched whole (fullmatch: no trailing newline slips through).
_RUN_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")
_IMAGE = re.compile(r"[A-Za-z0-9_/][A-Za-z0-9_.:/#@+-]*")  # nvcr.io#nvidia/pytorch:25.01-py3, /x.sqsh
_MOUNT_FLAGS = re.compile(r"[A-Za-z0-9_=+-]+")  # ro, rw, x-create=dir, ro+rprivate

# The trainer's fields (lcm_runner.train.rules.Shape) under their run-config keys; the ones a run config
# does not set are named as the trainer's flags.
CONFIG_NAMES = Names(
    {
        **{f: f"model.{f}" for f in (
            "num_layers", "hidden_size", "num_attention_heads", "ffn_hidden_size", "seq_length",
            "micro_batch_size", "global_batch_size", "num_experts", "moe_router_topk", "bf16",
            "use_flash_attn", "seed",
        )},
        "tensor_model_parallel_size": "model.tp",
        "pipeline_model_parallel_size": "model.pp",
        "expert_model_parallel_size": "model.ep",
        "expert_tensor_parallel_size": "expert TP (model.tp)",
        "train_iters": "train_iters",
        "vocab_size": "the trainer's --vocab-size",
        "max_position_embeddings": "the trainer's --max-position-embeddings",
        "sequence_parallel": "the trainer's --sequence-parallel",
        "device": "gpus_per_node",
        "world_size": "the world size (nodes x procs_per_node)",
    },
    style="key",
    refs={"device": "gpus_per_node = 0 (CPU)"},
)  # fmt: skip


def validate(cfg: RunConfig) -> list[str]:
    """Every problem of a (type-correct) config, as `key: why`, all at once."""
    p: list[str] = []
    if not _RUN_NAME.fullmatch(cfg.name):
        p.append(
            f"name: {cfg.name!r} must be 1-64 letters, digits, '.', '_' or '-', starting with a letter or "
            "digit (it names the run dir and the Slurm job)"
        )
    if cfg.partition is not None and not PARTITION_RE.fullmatch(cfg.partition):
        p.append(
            f"partition: {cfg.partition!r} must be a Slurm partition name (a lowercase letter, then "
            "lowercase letters, digits, '_' or '-')"
        )
    if cfg.checkpoint_dir is not None:
        why = path_problem(cfg.checkpoint_dir)
        if why:
            p.append(f"checkpoint_dir: {cfg.checkpoint_dir!r} must be {why}")
        elif cfg.checkpoint_dir == "/":
            p.append("checkpoint_dir: '/' must be a directory other than / (the root): runs write below it")
    if not COMMAND_RE.fullmatch(cfg.python) and path_problem(cfg.python):
        p.append(
            f"python: {cfg.python!r} must be a command name (letters, digits, '_', '.', '+', '-') or "
            f"{path_problem(cfg.python)}"
        )
    if cfg.launcher not in LAUNCHERS:
        p.append(f"launcher: {cfg.launcher!r} is not one of {', '.join(LAUNCHERS)}")
    if cfg.agent not in AGENTS:
        p.append(f"agent: {cfg.agent!r} is not one of {', '.join(AGENTS)}")
    if not 1 <= cfg.checkpoint_writers <= 64:
        p.append(f"checkpoint_writers: {cfg.checkpoint_writers} must be in 1..64 (writer threads per rank)")
    for key in ("warm_ranks", "host_copy"):
        if getattr(cfg, key) and cfg.agent != "lcm":
            p.append(f"{key}: needs agent: lcm (the project's agent keeps them), got agent: {cfg.agent!r}")
    if cfg.hb_timeout_s <= 0:
        p.append(f"hb_timeout_s: must be positive, got {cfg.hb_timeout_s}")
    for key in ("nodes", "procs_per_node", "save_interval", "keep_last"):  # train_iters: the trainer rules
        if getattr(cfg, key) < 1:
            p.append(f"{key}: must be at least 1, got {getattr(cfg, key)}")
    if cfg.gpus_per_node < 0:
        p.append(f"gpus_per_node: must be 0 (CPU) or more, got {cfg.gpus_per_node}")
    if cfg.gpus_per_node > 0 and cfg.procs_per_node > cfg.gpus_per_node:
        p.append(
            f"procs_per_node: {cfg.procs_per_node} processes cannot each own a GPU of "
            f"gpus_per_node={cfg.gpus_per_node}"
        )
    if cfg.save_interval > cfg.train_iters:
        p.append(
            f"save_interval: {cfg.save_interval} exceeds train_iters={cfg.train_iters}: "
            "nothing would be saved"
        )
    if not _SLURM_TIME.fullmatch(cfg.time_limit):
        p.append(f"time_limit: {cfg.time_limit!r} is not a Slurm time (HH:MM:SS, D-HH:MM:SS or minutes)")
    if not 1024 <= cfg.master_port <= 65535:
        p.append(f"master_port: {cfg.master_port} must be in 1024..65535")
    if cfg.max_restarts < 0:
        p.append(f"max_restarts: must be 0 or more, got {cfg.max_restarts}")
    if cfg.rdzv_join_timeout_s < 5:
        p.append(f"rdzv_join_timeout_s: {cfg.rdzv_join_timeout_s} is too short for a rendezvous (>= 5)")
    if cfg.container_image is not None and not cfg.container_image.strip():
        p.append("container_image: empty; leave it out when no container is used")
    elif cfg.container_image is not None and not _IMAGE.fullmatch(cfg.container_image):
        p.append(
            f"container_image: {cfg.container_image!r} must be an image reference of letters, digits and "
            "'_ . : / # @ + -' (no spaces or shell characters)"
        )
    for mount in cfg.container_mounts:
        p += _mount_problems(mount)
    p += workload_problems(cfg)
    # model: the trainer's own shape and layout rules, on the argv a launch would pass it
    if not cfg.workload.foreign:
        p += model_problems(cfg)
    # fault
    f = cfg.fault
    if not cfg.save_interval < f.kill_at_step < cfg.train_iters:
        p.append(
            f"fault.kill_at_step: {f.kill_at_step} must lie after the first save (save_interval="
            f"{cfg.save_interval}) and before train_iters={cfg.train_iters}"
        )
    if cfg.nodes >= 1 and not 0 <= f.kill_node < cfg.nodes:
        p.append(f"fault.kill_node: {f.kill_node} is not a node index 0..{cfg.nodes - 1}")
    bad = [c for c in f.cases if c not in FAULT_CASES]
    if bad:
        p.append(f"fault.cases: {', '.join(bad)} unknown (known: {', '.join(FAULT_CASES)})")
    if f.timeout_s <= 0:
        p.append(f"fault.timeout_s: must be positive, got {f.timeout_s}")
    # nccl
    if cfg.nccl.debug not in NCCL_DEBUG_LEVELS:
        p.append(f"nccl.debug: {cfg.nccl.debug!r} is not one of {', '.join(NCCL_DEBUG_LEVELS)}")
    for key in cfg.nccl.extra_env:
        if not _ENV_NAME.fullmatch(key):
            p.append(f"nccl.extra_env: {key!r} is not an environment variable name")
    # targets
    for tf in fields(Targets):
        if getattr(cfg.targets, tf.name) <= 0:
            p.append(f"targets.{tf.name}: must be positive, got {getattr(cfg.targets, tf.name)}")
    if cfg.targets.nccl_fraction_max > 1:
        p.append(f"targets.nccl_fraction_max: {cfg.targets.nccl_fraction_max} is a fraction (0..1)")
    return p


def model_problems(cfg: RunConfig) -> list[str]:
    """The trainer's rules (lcm_runner.train.rules) on this config's trainer arguments, by run-config key."""
    try:
        args = trainer_args(cfg)
    except ValueError as exc:
        return [f"model: {exc}"]
    world = cfg.world_size if cfg.nodes >= 1 and cfg.procs_per_node >= 1 else None
    return [str(x) for x in shape_problems(Shape.of(args), CONFIG_NAMES, world)]


def _mount_problems(mount: str) -> list[str]:
    """A container mount SRC:DST[:FLAGS]: both paths safe (srun --container-mounts joins them with ',')."""
    parts = mount.split(":")
    if len(parts) not in (2, 3):
        return [f"container_mounts: {mount!r} must be SRC:DST[:FLAGS]"]
    problems = []
    for what, path in zip(("SRC", "DST"), parts[:2], strict=True):
        why = path_problem(path)
        if why:
            problems.append(f"container_mounts: {mount!r}: {what} must be {why}")
    if len(parts) == 3 and not _MOUNT_FLAGS.fullmatch(parts[2]):
        problems.append(
            f"container_mounts: {mount!r}: FLAGS must be letters, digits, '_', '=', '+' or '-' (e.g. ro)"
        )
    return problems


def cluster_problems(cfg: RunConfig, cluster: dict[str, Any]) -> list[str]:
    """Problems between a (valid) run config and a (valid) cluster spec that neither shows alone.

    checkpoint_dir, when set, must lie inside the spec's storage.mountpoint (the shared storage every
    node mounts): a resume on another node reads it there. Compared only after `..` was refused.
    """
    p: list[str] = []
    mount = (cluster.get("storage") or {}).get("mountpoint")
    ckpt = cfg.checkpoint_dir
    if ckpt is None or not isinstance(mount, str) or path_problem(ckpt):
        return p  # nothing to compare, or validate() reports the path itself
    if not path_inside(ckpt, mount):
        p.append(
            f"checkpoint_dir: {ckpt!r} must be inside the spec's storage.mountpoint ({mount}), the storage "
            "every node mounts"
        )
    return p


def workload_problems(cfg: RunConfig) -> list[str]:
    """The workload section: its kind, and for a user's Megatron-LM the checkout, script and arguments."""
    w = cfg.workload
    p: list[str] = []
    if w.kind not in WORKLOADS:
        return [f"workload.kind: {w.kind!r} is not one of {', '.join(WORKLOADS)}"]
    for name in w.env:
        if not _ENV_NAME.fullmatch(name):
            p.append(f"workload.env: {name!r} is not an environment variable name (A-Z, 0-9, _)")
    if w.loss_rel_tol is not None and not 0 < w.loss_rel_tol < 1:
        p.append(f"workload.loss_rel_tol: {w.loss_rel_tol} must be in (0, 1)")
    if not w.foreign:
        if w.path is not None or w.args:
            p.append("workload.path/args: only for workload.kind megatron-lm (lcm's trainer takes `model`)")
        return p
    from lcm_runner.workloads.megatron_lm import argv as mlm

    if w.path is None or path_problem(w.path):
        p.append(f"workload.path: {w.path!r} must be the Megatron-LM checkout on the nodes, an absolute path")
    if not re.fullmatch(r"[A-Za-z0-9_][A-Za-z0-9_./-]*\.py", w.entry) or ".." in w.entry.split("/"):
        p.append(f"workload.entry: {w.entry!r} must be a .py script inside the checkout")
    try:
        shape, problems = mlm.shape(w.args)
    except mlm.ArgsError as exc:
        return [*p, str(exc)]
    p += problems
    if shape is not None:
        if cfg.world_size % (shape.tp * shape.pp):
            p.append(
                f"workload.args: tensor x pipeline parallel = {shape.tp} x {shape.pp} does not divide the "
                f"world size {cfg.world_size} (nodes x procs_per_node)"
            )
        else:
            dp = cfg.world_size // (shape.tp * shape.pp)
            gbs = shape.global_batch_size
            if gbs is not None and gbs % (shape.micro_batch_size * dp):
                p.append(
                    f"workload.args: --global-batch-size {gbs} is not divisible by micro batch "
                    f"{shape.micro_batch_size} x data parallel {dp}"
                )
    return p
