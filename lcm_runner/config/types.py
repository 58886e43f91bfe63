"""The run config (`run.yml`): model size, launch shape, steps, fault plan, SLO targets.

Loaded from YAML into dataclasses and validated as a whole before anything is rendered or launched:
every problem is reported with its key (`model.num_attention_heads: ...`), all of them at once.
The cluster itself (nodes' GPUs, fabric, storage) is not described here but in the cluster spec,
read through `load_cluster`.
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

import yaml

from lcm_runner.contracts import AGENTS, LAUNCHERS
from lcm_runner.spec.safe import COMMAND_RE, PARTITION_RE, path_inside, path_problem

FAULT_CASES = ("trainer_kill", "node_loss", "torchrun_restart_ref", "floor")
NCCL_DEBUG_LEVELS = ("VERSION", "WARN", "INFO", "TRACE")
_SLURM_TIME = re.compile(r"^(?:(\d+)-)?(\d{1,2}):(\d{2}):(\d{2})$|^(\d+)$")
_ENV_NAME = re.compile(r"^[A-Z_][A-Z0-9_]*$")
# Values below become shell words, Slurm options and file names (the run dir, the job name lcm-<name>);
# they are matched whole (fullmatch: no trailing newline slips through).
_RUN_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")
_IMAGE = re.compile(r"[A-Za-z0-9_/][A-Za-z0-9_.:/#@+-]*")  # nvcr.io#nvidia/pytorch:25.01-py3, /x.sqsh
_MOUNT_FLAGS = re.compile(r"[A-Za-z0-9_=+-]+")  # ro, rw, x-create=dir, ro+rprivate

# The module's SLOs (module 09, "Measure it") and the lab's extra checks.
DEFAULT_NCCL_FRACTION_MAX = 0.30
DEFAULT_CKPT_WRITE_S_MAX = 60.0
DEFAULT_RESUME_S_MAX = 120.0
DEFAULT_RECOVERY_S_MAX = 300.0
DEFAULT_RECOVERY_FLOOR_RATIO_MAX = 1.5
DEFAULT_NODE_LOSS_S_MAX = 60.0
DEFAULT_REGRESSION_REL_MAX = 0.20


class ConfigError(ValueError):
    """The run config is invalid; `problems` lists every finding as `key: why`."""

    def __init__(self, source: str, problems: list[str]) -> None:
        self.source = source
        self.problems = problems
        super().__init__(f"{source}: invalid run config:\n  - " + "\n  - ".join(problems))


@dataclass
class ModelConfig:
    """The model, in Megatron's argument names (tp/pp/ep are the *-model-parallel-size flags)."""

    num_layers: int = 2
    hidden_size: int = 64
    num_attention_heads: int = 4
    ffn_hidden_size: int = 128
    seq_length: int = 64
    micro_batch_size: int = 2
    global_batch_size: int = 8
    tp: int = 1
    pp: int = 1
    ep: int = 1
    num_experts: int = 4
    moe_router_topk: int = 2
    bf16: bool = False
    use_flash_attn: bool = False
    seed: int = 1234


@dataclass
class FaultConfig:
    """Where and how the fault stage injects failures."""

    kill_at_step: int = 15
    kill_node: int = 1  # index of the node (0 = the one holding MASTER_ADDR) whose trainer is killed
    cases: list[str] = field(default_factory=lambda: list(FAULT_CASES))
    timeout_s: float = 900.0  # give up waiting for a recovery after this long


@dataclass
class NcclConfig:
    """NCCL settings of the run; the rest comes from the cluster spec (see templates/nccl_env.sh.j2)."""

    debug: str = "WARN"
    extra_env: dict[str, str] = field(default_factory=dict)  # e.g. {NCCL_NVLS_ENABLE: "0"}


@dataclass
class Targets:
    """SLO targets; a run config may override any of them."""

    nccl_fraction_max: float = DEFAULT_NCCL_FRACTION_MAX
    ckpt_write_s_max: float = DEFAULT_CKPT_WRITE_S_MAX
    resume_s_max: float = DEFAULT_RESUME_S_MAX
    recovery_s_max: float = DEFAULT_RECOVERY_S_MAX
    recovery_floor_ratio_max: float = DEFAULT_RECOVERY_FLOOR_RATIO_MAX
    node_loss_s_max: float = DEFAULT_NODE_LOSS_S_MAX
    regression_rel_max: float = DEFAULT_REGRESSION_REL_MAX  # vs an earlier slo.json


@dataclass
class RunConfig:
    name: str = "run"
    launcher: str = "torchrun"
    agent: str = "torchrun"  # per-node agent: torchrun | lcm (lcm_runner.launch.agent)
    nodes: int = 2
    gpus_per_node: int = 0  # 0 = CPU (gloo)
    procs_per_node: int = 2
    train_iters: int = 30
    save_interval: int = 10
    keep_last: int = 2
    time_limit: str = "00:30:00"
    partition: str | None = None  # None: the spec's default partition
    container_image: str | None = None  # Pyxis image (only when the spec enables pyxis)
    container_mounts: list[str] = field(default_factory=list)
    master_port: int = 29500
    max_restarts: int = 1
    rdzv_join_timeout_s: int = 60
    hb_timeout_s: float = 3.0  # lcm agent only: a peer silent this long is a lost node
    checkpoint_dir: str | None = None  # None: <run_dir>/checkpoints
    python: str = "python3"  # the interpreter on the nodes (a venv's python on the lab)
    model: ModelConfig = field(default_factory=ModelConfig)
    fault: FaultConfig = field(default_factory=FaultConfig)
    nccl: NcclConfig = field(default_factory=NcclConfig)
    targets: Targets = field(default_factory=Targets)

    @property
    def world_size(self) -> int:
        return self.nodes * self.procs_per_node

    @property
    def dp(self) -> int:
        return self.world_size // (self.model.tp * self.model.pp)

    @property
    def uses_gpu(self) -> bool:
        return self.gpus_per_node > 0

    def to_train_args(
        self,
        save_dir: str,
        load_dir: str | None = None,
        telemetry_dir: str | None = None,
        train_iters: int | None = None,
    ) -> list[str]:
        """The `python -m lcm_runner.train` argument list (Megatron flag names)."""
        m = self.model
        args = [
            "--num-layers",
            str(m.num_layers),
            "--hidden-size",
            str(m.hidden_size),
            "--num-attention-heads",
            str(m.num_attention_heads),
            "--ffn-hidden-size",
            str(m.ffn_hidden_size),
            "--seq-length",
            str(m.seq_length),
            "--micro-batch-size",
            str(m.micro_batch_size),
            "--global-batch-size",
            str(m.global_batch_size),
            "--tensor-model-parallel-size",
            str(m.tp),
            "--pipeline-model-parallel-size",
            str(m.pp),
            "--expert-model-parallel-size",
            str(m.ep),
            "--num-experts",
            str(m.num_experts),
            "--moe-router-topk",
            str(m.moe_router_topk),
            "--seed",
            str(m.seed),
            "--train-iters",
            str(train_iters if train_iters is not None else self.train_iters),
            "--save-interval",
            str(self.save_interval),
            "--keep-last",
            str(self.keep_last),
            "--save",
            save_dir,
            "--load",
            load_dir if load_dir is not None else save_dir,
        ]
        if m.bf16:
            args.append("--bf16")
        if m.use_flash_attn:
            args.append("--use-flash-attn")
        args += ["--device", "cuda" if self.uses_gpu else "cpu"]
        if telemetry_dir is not None:
            args += ["--telemetry-dir", telemetry_dir]
        return args


# ----------------------------------------------------------------------------- loading


def _build(cls: type, data: Any, path: str, problems: list[str]) -> Any:
    """A dataclass from a mapping: unknown keys and wrong types become problems (never silently dropped)."""
    if data is None:
        data = {}
    if not isinstance(data, dict):
        problems.append(f"{path or '<top>'}: must be a mapping, got {type(data).__name__}")
        return cls()
    known = {f.name: f for f in fields(cls)}
    kwargs: dict[str, Any] = {}
    for key, value in data.items():
        where = f"{path}.{key}" if path else str(key)
        if key not in known:
            problems.append(f"{where}: unknown key (known: {', '.join(sorted(known))})")
            continue
        default = getattr(cls(), key)
        if dataclasses.is_dataclass(default):
            kwargs[key] = _build(type(default), value, where, problems)
            continue
        checked = _check_type(where, known[key].type, default, value, problems)
        if checked is not _BAD:
            kwargs[key] = checked
    return cls(**kwargs)


_BAD = object()


def _check_type(where: str, annotation: Any, default: Any, value: Any, problems: list[str]) -> Any:
    text = str(annotation)
    optional = "None" in text
    if value is None:
        if optional:
            return None
        problems.append(f"{where}: must not be empty")
        return _BAD
    if isinstance(default, bool) or text == "bool":
        if not isinstance(value, bool):
            problems.append(f"{where}: must be true or false, got {value!r}")
            return _BAD
        return value
    if isinstance(default, int) or text.startswith("int"):
        if isinstance(value, bool) or not isinstance(value, int):
            problems.append(f"{where}: must be an integer, got {value!r}")
            return _BAD
        return value
    if isinstance(default, float) or text.startswith("float"):
        if isinstance(value, bool) or not isinstance(value, int | float):
            problems.append(f"{where}: must be a number, got {value!r}")
            return _BAD
        return float(value)
    if isinstance(default, list) or text.startswith("list"):
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            problems.append(f"{where}: must be a list of strings, got {value!r}")
            return _BAD
        return list(value)
    if isinstance(default, dict) or text.startswith("dict"):
        if not isinstance(value, dict):
            problems.append(f"{where}: must be a mapping, got {value!r}")
            return _BAD
        return {str(k): str(v) for k, v in value.items()}
    if isinstance(default, str) or text.startswith("str"):
        if not isinstance(value, str):
            problems.append(f"{where}: must be a string, got {value!r}")
            return _BAD
        return value
    return value


def validate(cfg: RunConfig) -> list[str]:
    """Every problem of a (type-correct) config, as `key: why`."""
    p: list[str] = []
    m = cfg.model
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
    if not COMMAND_RE.fullmatch(cfg.python) and path_problem(cfg.python):
        p.append(
            f"python: {cfg.python!r} must be a command name (letters, digits, '_', '.', '+', '-') or "
            f"{path_problem(cfg.python)}"
        )
    if cfg.launcher not in LAUNCHERS:
        p.append(f"launcher: {cfg.launcher!r} is not one of {', '.join(LAUNCHERS)}")
    if cfg.agent not in AGENTS:
        p.append(f"agent: {cfg.agent!r} is not one of {', '.join(AGENTS)}")
    if cfg.hb_timeout_s <= 0:
        p.append(f"hb_timeout_s: must be positive, got {cfg.hb_timeout_s}")
    for key in ("nodes", "procs_per_node", "train_iters", "save_interval", "keep_last"):
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
    # model
    for key in (
        "num_layers",
        "hidden_size",
        "num_attention_heads",
        "ffn_hidden_size",
        "seq_length",
        "micro_batch_size",
        "global_batch_size",
        "tp",
        "pp",
        "ep",
        "num_experts",
        "moe_router_topk",
    ):
        if getattr(m, key) < 1:
            p.append(f"model.{key}: must be at least 1, got {getattr(m, key)}")
    if p:
        return p  # the arithmetic below needs positive numbers
    if m.hidden_size % m.num_attention_heads:
        p.append(
            f"model.hidden_size: {m.hidden_size} is not divisible by "
            f"num_attention_heads={m.num_attention_heads}"
        )
    if m.num_attention_heads % m.tp:
        p.append(f"model.tp: {m.tp} does not divide num_attention_heads={m.num_attention_heads}")
    if m.num_layers % m.pp:
        p.append(f"model.pp: {m.pp} does not divide num_layers={m.num_layers}")
    if m.num_experts % m.ep:
        p.append(f"model.ep: {m.ep} does not divide num_experts={m.num_experts}")
    if m.moe_router_topk > m.num_experts:
        p.append(f"model.moe_router_topk: {m.moe_router_topk} exceeds num_experts={m.num_experts}")
    world = cfg.world_size
    if world % (m.tp * m.pp):
        p.append(
            f"model: tp*pp={m.tp * m.pp} does not divide the world size {world} "
            f"(nodes={cfg.nodes} x procs_per_node={cfg.procs_per_node})"
        )
    elif world % (m.tp * m.pp * m.ep):
        p.append(f"model.ep: tp*pp*ep={m.tp * m.pp * m.ep} does not divide the world size {world}")
    else:
        dp = cfg.dp
        if m.global_batch_size % (m.micro_batch_size * dp):
            p.append(
                f"model.global_batch_size: {m.global_batch_size} is not a multiple of "
                f"micro_batch_size*dp = {m.micro_batch_size}*{dp}"
            )
    if m.use_flash_attn and not cfg.uses_gpu:
        p.append("model.use_flash_attn: flash attention needs GPUs (gpus_per_node is 0)")
    if m.bf16 and not cfg.uses_gpu:
        p.append("model.bf16: bf16 is a GPU option; CPU runs train in fp32 (gpus_per_node is 0)")
    if m.pp > 1:
        p.append(f"model.pp: {m.pp}: the trainer (lcm_runner.train) does not implement pipeline parallelism")
    # fault
    f = cfg.fault
    if not cfg.save_interval < f.kill_at_step < cfg.train_iters:
        p.append(
            f"fault.kill_at_step: {f.kill_at_step} must lie after the first save (save_interval="
            f"{cfg.save_interval}) and before train_iters={cfg.train_iters}"
        )
    if not 0 <= f.kill_node < cfg.nodes:
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


def from_dict(data: Any, source: str = "<run config>") -> RunConfig:
    problems: list[str] = []
    cfg = _build(RunConfig, data, "", problems)
    if not problems:
        problems = validate(cfg)
    if problems:
        raise ConfigError(source, problems)
    return cfg


def load_run_config(path: str | Path) -> RunConfig:
    """Load and validate a run.yml; ConfigError names every problem."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(str(path), [f"cannot read: {exc.strerror}"]) from exc
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ConfigError(str(path), [f"not YAML: {exc}"]) from exc
    return from_dict(data, str(path))


def to_dict(cfg: RunConfig) -> dict[str, Any]:
    return dataclasses.asdict(cfg)


# ----------------------------------------------------------------------------- the cluster spec


def cluster_spec_path(inventory: str | Path) -> Path:
    """inventories/<name> (or the cluster.yml itself) -> the spec file."""
    p = Path(inventory)
    return p if p.is_file() else p / "group_vars" / "all" / "cluster.yml"


def load_cluster(path: str | Path) -> dict[str, Any]:
    """The validated `cluster` mapping of a spec file or inventory directory.

    The one place the runner reads the spec: through lcm_runner.spec (the schema Ansible also uses);
    raises lcm_runner.spec.SpecInvalid listing every problem.
    """
    from lcm_runner.spec import SpecInvalid, validate
    from lcm_runner.spec import load_cluster as spec_load_cluster

    cluster = spec_load_cluster(cluster_spec_path(path))
    errors = validate(cluster)
    if errors:
        raise SpecInvalid(errors)
    return cluster
