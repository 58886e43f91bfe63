"""The run config's types (`run.yml`): model size, launch shape, steps, fault plan, SLO targets.

Typed dataclasses with their defaults (the launch defaults are lcm_runner.contracts'); loading.py fills
them from YAML, validation.py checks them, argv.py turns them into the trainer's arguments. The cluster
itself (nodes' GPUs, fabric, storage) is not described here but in the cluster spec (lcm_runner/spec).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from lcm_runner.contracts import (
    DEFAULT_HB_TIMEOUT_S,
    DEFAULT_JOIN_TIMEOUT_S,
    DEFAULT_MASTER_PORT,
    DEFAULT_MAX_RESTARTS,
    DEFAULT_TIME_LIMIT,
)

TRAINER_MODULE = "lcm_runner.train"  # lcm_runner.launch.procs.TRAINER_MODULE
# Resume/fault loss tolerances (relative, vs the uninterrupted run at the same step). The project's trainer
# resumes bitwise on CPU (measured diff 0.0) and within 1e-2 by design on GPU. Megatron-LM is not bitwise by
# default (non-deterministic kernels; NVTE/--deterministic-mode off), so its default is wider; the measured
# difference is always reported beside it.
LCM_LOSS_REL_TOL = 1e-2
MEGATRON_LOSS_REL_TOL = 2e-2
MEGATRON_BRIDGE_MODULE = "lcm_runner.workloads.megatron_lm.bridge"

FAULT_CASES = ("trainer_kill", "node_loss", "torchrun_restart_ref", "floor")
WORKLOADS = ("lcm", "megatron-lm")  # the project's trainer, or the user's Megatron-LM checkout
NCCL_DEBUG_LEVELS = ("VERSION", "WARN", "INFO", "TRACE")

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
    moe_grouped_gemm: bool = False  # the trainer's --moe-grouped-gemm (lcm_runner/train/experts.py)
    seed: int = 1234


@dataclass
class FaultConfig:
    """Where and how the fault stage injects failures."""

    kill_at_step: int = 15
    kill_node: int = 1  # index of the node (0 = the one holding MASTER_ADDR) whose trainer is killed
    cases: list[str] = field(default_factory=lambda: list(FAULT_CASES))
    # with torchrun_restart_ref, also stock torchrun with the trainer's exit-signal handler on (informational)
    torchrun_handler_ref: bool = True
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
class WorkloadConfig:
    """What the stages train: `lcm` (lcm_runner.train, configured by `model`) or `megatron-lm`, the
    user's own Megatron-LM checkout run unchanged (lcm_runner/workloads/megatron_lm): `path` is the
    checkout on the nodes, `entry` its script, `args` the user's arguments (the model comes from them;
    the runner adds or overrides only what the stages need and says which)."""

    kind: str = "lcm"
    path: str | None = None  # megatron-lm: the checkout on every node (or in the container image)
    entry: str = "pretrain_gpt.py"
    args: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)  # extra environment of every rank
    # resume: the first new step's loss vs the uninterrupted run's (None: the workload's default,
    # bitwise-exact 1e-2 for lcm, 2e-2 for megatron-lm whose resume is not bitwise by default)
    loss_rel_tol: float | None = None

    @property
    def foreign(self) -> bool:
        return self.kind != "lcm"

    @property
    def script(self) -> str:
        """The user's entry script on the nodes: <path>/<entry>."""
        return f"{(self.path or '').rstrip('/')}/{self.entry}"

    @property
    def resume_loss_rel_tol(self) -> float:
        """The stated tolerance of a resumed (or recovered) step's loss vs the uninterrupted run's."""
        if self.loss_rel_tol is not None:
            return self.loss_rel_tol
        return MEGATRON_LOSS_REL_TOL if self.foreign else LCM_LOSS_REL_TOL


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
    checkpoint_writers: int = 8  # writer threads per rank: best on H200 (docs/results/h200-ckpt-throughput)
    async_save: bool = False  # the project's trainer: --async-save (shards written by a background writer)
    time_limit: str = DEFAULT_TIME_LIMIT
    partition: str | None = None  # None: the spec's default partition
    container_image: str | None = None  # Pyxis image (only when the spec enables pyxis)
    container_mounts: list[str] = field(default_factory=list)
    master_port: int = DEFAULT_MASTER_PORT
    max_restarts: int = DEFAULT_MAX_RESTARTS
    rdzv_join_timeout_s: int = DEFAULT_JOIN_TIMEOUT_S
    hb_timeout_s: float = DEFAULT_HB_TIMEOUT_S  # lcm agent only: a peer silent this long is a lost node
    # lcm agent only, the fast process restart (docs/training.md, "Fast process restarts"): a warm spare per
    # local rank (its CUDA context made before any failure), and the checkpoint's host copy in shared memory
    warm_ranks: bool = False
    host_copy: bool = False
    checkpoint_dir: str | None = None  # None: <run_dir>/checkpoints
    python: str = "python3"  # the interpreter on the nodes (a venv's python on the lab)
    model: ModelConfig = field(default_factory=ModelConfig)
    workload: WorkloadConfig = field(default_factory=WorkloadConfig)
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

    @property
    def train_module(self) -> str:
        """The module each rank runs (`python -m`): the trainer, or the bridge to the user's Megatron-LM."""
        if self.workload.kind == "megatron-lm":
            return MEGATRON_BRIDGE_MODULE
        return TRAINER_MODULE

    def to_train_args(
        self,
        save_dir: str,
        load_dir: str | None = None,
        telemetry_dir: str | None = None,
        train_iters: int | None = None,
        signal_handler: bool = True,
    ) -> list[str]:
        """The argument list of `train_module` (Megatron flag names): see argv.py."""
        from .argv import train_argv

        return train_argv(self, save_dir, load_dir, telemetry_dir, train_iters, signal_handler)
