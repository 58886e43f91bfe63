"""The run config (`run.yml`): model size, launch shape, steps, fault plan, SLO targets.

Loaded from YAML into dataclasses and validated as a whole before anything is rendered or launched:
every problem is reported with its key (`model.num_attention_heads = 3: expected ...`), all at once.
The cluster itself (nodes' GPUs, fabric, storage) is not described here but in the cluster spec, read
through `load_cluster`.

Modules, by concern: types (the dataclasses, defaults, ConfigError), loading (YAML -> dataclasses with
type checks, from_dict/to_dict, load_run_config, load_cluster through lcm_runner.spec), validation
(validate, cluster_problems; the model's rules are the trainer's, lcm_runner/train/rules.py), argv
(RunConfig -> the trainer's arguments, `RunConfig.to_train_args`).
"""

from __future__ import annotations

from .argv import train_argv, trainer_args
from .loading import cluster_spec_path, from_dict, load_cluster, load_run_config, to_dict, with_container
from .types import (
    DEFAULT_CKPT_WRITE_S_MAX,
    DEFAULT_NCCL_FRACTION_MAX,
    DEFAULT_NODE_LOSS_S_MAX,
    DEFAULT_RECOVERY_FLOOR_RATIO_MAX,
    DEFAULT_RECOVERY_S_MAX,
    DEFAULT_REGRESSION_REL_MAX,
    DEFAULT_RESUME_S_MAX,
    FAULT_CASES,
    NCCL_DEBUG_LEVELS,
    ConfigError,
    FaultConfig,
    ModelConfig,
    NcclConfig,
    RunConfig,
    Targets,
)
from .validation import cluster_problems, model_problems, validate

__all__ = [
    "DEFAULT_CKPT_WRITE_S_MAX",
    "DEFAULT_NCCL_FRACTION_MAX",
    "DEFAULT_NODE_LOSS_S_MAX",
    "DEFAULT_RECOVERY_FLOOR_RATIO_MAX",
    "DEFAULT_RECOVERY_S_MAX",
    "DEFAULT_REGRESSION_REL_MAX",
    "DEFAULT_RESUME_S_MAX",
    "FAULT_CASES",
    "NCCL_DEBUG_LEVELS",
    "ConfigError",
    "FaultConfig",
    "ModelConfig",
    "NcclConfig",
    "RunConfig",
    "Targets",
    "cluster_problems",
    "cluster_spec_path",
    "from_dict",
    "load_cluster",
    "load_run_config",
    "model_problems",
    "to_dict",
    "train_argv",
    "trainer_args",
    "validate",
    "with_container",
]
