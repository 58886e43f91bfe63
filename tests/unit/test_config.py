"""lcm_runner.config: the shipped run configs load; bad input is named key by key."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from lcm_runner import config
from lcm_runner.spec import SpecInvalid

ROOT = Path(__file__).resolve().parents[2]


def _lab() -> dict:
    return yaml.safe_load((ROOT / "configs" / "lab.yml").read_text())


@pytest.mark.parametrize("name", ["lab.yml", "h200.yml"])
def test_shipped_configs_load(name: str) -> None:
    cfg = config.load_run_config(ROOT / "configs" / name)
    # the module's SLO; the CPU lab's communication includes gloo's waits and the pipeline bubble
    assert cfg.targets.nccl_fraction_max == (0.80 if name == "lab.yml" else 0.30)
    assert cfg.world_size == cfg.nodes * cfg.procs_per_node


def test_defaults_are_the_module_slos() -> None:
    t = config.Targets()
    assert (t.nccl_fraction_max, t.ckpt_write_s_max, t.resume_s_max, t.recovery_s_max) == (0.30, 60, 120, 300)
    assert (t.recovery_floor_ratio_max, t.node_loss_s_max) == (1.5, 60)


def test_target_override_keeps_other_defaults() -> None:
    data = _lab()
    data["targets"] = {"resume_s_max": 30}
    cfg = config.from_dict(data)
    assert cfg.targets.resume_s_max == 30.0 and cfg.targets.recovery_s_max == 300.0


def test_train_args_use_megatron_names() -> None:
    cfg = config.load_run_config(ROOT / "configs" / "h200.yml")
    args = cfg.to_train_args("/ck", telemetry_dir="/run/telemetry")

    def value(flag: str) -> str:
        return args[args.index(flag) + 1]

    assert value("--tensor-model-parallel-size") == "4"
    assert value("--pipeline-model-parallel-size") == "2"
    assert value("--expert-model-parallel-size") == "2"
    assert value("--telemetry-dir") == "/run/telemetry"
    assert "--bf16" in args and "--use-flash-attn" in args and value("--device") == "cuda"
    assert args[args.index("--load") + 1] == "/ck"
    lab = config.load_run_config(ROOT / "configs" / "lab.yml")
    assert lab.to_train_args("/ck")[-2:] == ["--device", "cpu"] and "--bf16" not in lab.to_train_args("/ck")
    # checkpoint writers (default 8) and the async save reach the trainer
    assert value("--ckpt-writers") == "8" and "--async-save" not in args
    fast = config.from_dict({**_lab(), "checkpoint_writers": 16, "async_save": True}, "run.yml")
    fast_args = fast.to_train_args("/ck")
    assert fast_args[fast_args.index("--ckpt-writers") + 1] == "16" and "--async-save" in fast_args


@pytest.mark.parametrize(
    ("patch", "message"),
    [
        # the trainer's own rules (lcm_runner/train/rules.py), named by run-config key
        (
            {"model": {"num_attention_heads": 3}},
            "model.hidden_size = 64: expected a multiple of model.num_attention_heads (3)",
        ),
        ({"model": {"tp": 3}}, "model.num_attention_heads = 4: expected a multiple of model.tp (3)"),
        ({"model": {"ep": 3}}, "model.num_experts = 4: expected a multiple of model.ep (3)"),
        (
            {"model": {"num_experts": 8, "ep": 8}},
            "the world size (nodes x procs_per_node) = 4: expected a multiple of EP (8) x ETP (1) x PP (2)",
        ),
        (
            {"nodes": 3, "model": {"tp": 4}},
            "the world size (nodes x procs_per_node) = 6: expected a multiple of TP (4) x PP (2) = 8",
        ),
        (
            {"model": {"global_batch_size": 6}},
            "model.global_batch_size = 6: expected a multiple of model.micro_batch_size (2) x DP (2) = 4",
        ),
        ({"model": {"bf16": True}}, "model.bf16 = true: expected no bf16 with gpus_per_node = 0 (CPU)"),
        ({"model": {"pp": 4}}, "model.num_layers = 2: expected a multiple of model.pp (4)"),
        (
            {"gpus_per_node": 1, "model": {"hidden_size": 48, "num_attention_heads": 4}},
            "model.use_flash_attn = true: expected a head size the fused attention kernels take: "
            "model.hidden_size (48) / model.num_attention_heads (4) = 12, must be a multiple of 8",
        ),
        ({"model": {"micro_batch_size": 0}}, "model.micro_batch_size = 0: expected a positive integer (> 0)"),
        ({"train_iters": 0}, "train_iters = 0: expected a positive integer (> 0)"),
        # what megatron-core itself would refuse at start-up, after the launch
        (
            {"model": {"moe_router_topk": 1}},
            "model.moe_router_topk = 1: expected at least 2: megatron refuses top-1 routing",
        ),
        (
            {"model": {"moe_router_topk": 5}},
            "model.moe_router_topk = 5: expected in 1..model.num_experts (4)",
        ),
        (
            {"model": {"tp": 2, "ffn_hidden_size": 129}},
            "model.ffn_hidden_size = 129: expected a multiple of model.tp (2)",
        ),
        (
            {"model": {"tp": 2, "seq_length": 63}},
            "model.seq_length = 63: expected a multiple of model.tp (2) (sequence parallelism, implied",
        ),
        (
            {"model": {"tp": 3, "num_attention_heads": 6, "hidden_size": 66, "ffn_hidden_size": 129}},
            "the trainer's --vocab-size = 256: expected a multiple of model.tp (3)",
        ),
        ({"model": {"seed": -1}}, "model.seed = -1: expected in 0..9223372036854775807"),
        ({"launcher": "mpirun"}, "launcher: 'mpirun' is not one of slurm, torchrun"),
        ({"time_limit": "90 minutes"}, "time_limit: '90 minutes' is not a Slurm time"),
        ({"fault": {"kill_at_step": 5}}, "fault.kill_at_step: 5 must lie after the first save"),
        ({"fault": {"kill_node": 2}}, "fault.kill_node: 2 is not a node index 0..1"),
        ({"fault": {"cases": ["meteor"]}}, "fault.cases: meteor unknown"),
        ({"gpus_per_node": 4, "procs_per_node": 8}, "procs_per_node: 8 processes cannot each own a GPU"),
        ({"nccl": {"debug": "LOUD"}}, "nccl.debug: 'LOUD' is not one of"),
        ({"nccl": {"extra_env": {"nccl-x": "1"}}}, "nccl.extra_env: 'nccl-x' is not an environment variable"),
        ({"targets": {"nccl_fraction_max": 30}}, "targets.nccl_fraction_max: 30.0 is a fraction"),
        ({"nodes": "two"}, "nodes: must be an integer, got 'two'"),
        ({"model": {"bf16": "yes"}}, "model.bf16: must be true or false"),
        ({"checkpoint_writers": 0}, "checkpoint_writers: 0 must be in 1..64 (writer threads per rank)"),
        ({"checkpoint_writers": 65}, "checkpoint_writers: 65 must be in 1..64"),
        ({"async_save": "sometimes"}, "async_save: must be true or false"),
        ({"agent": "torchrun", "warm_ranks": True}, "warm_ranks: needs agent: lcm"),
        ({"agent": "torchrun", "host_copy": True}, "host_copy: needs agent: lcm"),
        ({"warm_ranks": "yes"}, "warm_ranks: must be true or false"),
        ({"modle": {}}, "modle: unknown key"),
        ({"model": {"layers": 2}}, "model.layers: unknown key"),
    ],
)
def test_bad_configs_name_the_key(patch: dict, message: str) -> None:
    data = _lab()
    for key, value in patch.items():
        if isinstance(value, dict) and isinstance(data.get(key), dict):
            data[key] = {**data[key], **value}
        else:
            data[key] = value
    with pytest.raises(config.ConfigError) as err:
        config.from_dict(data, "run.yml")
    assert any(message in p for p in err.value.problems), err.value.problems


def test_all_problems_reported_at_once() -> None:
    data = _lab()
    data["launcher"] = "x"
    data["master_port"] = 80
    with pytest.raises(config.ConfigError) as err:
        config.from_dict(data)
    assert len(err.value.problems) == 2


def test_unreadable_and_non_yaml_files(tmp_path: Path) -> None:
    with pytest.raises(config.ConfigError, match="cannot read"):
        config.load_run_config(tmp_path / "missing.yml")
    bad = tmp_path / "run.yml"
    bad.write_text("name: [unclosed\n")
    with pytest.raises(config.ConfigError, match="not YAML"):
        config.load_run_config(bad)


def test_load_cluster_reads_the_lab_spec(tmp_path: Path) -> None:
    cluster = config.load_cluster(ROOT / "inventories" / "lab")
    assert cluster["name"] == "lab" and cluster["fabric"]["type"] == "ethernet"
    (tmp_path / "c.yml").write_text("nodes: []\n")
    with pytest.raises(SpecInvalid, match="top-level key `cluster`"):
        config.load_cluster(tmp_path / "c.yml")


@pytest.mark.parametrize("name", ["lab.yml", "h200.yml"])
def test_trainer_accepts_the_generated_arguments(name: str) -> None:
    from lcm_runner.train.args import parse_args, validate_world

    cfg = config.load_run_config(ROOT / "configs" / name)
    args = parse_args(cfg.to_train_args("/tmp/ck", telemetry_dir="/tmp/t"))
    assert validate_world(args, cfg.world_size) == cfg.dp
    assert (args.tp, args.ep, args.train_iters, args.save_interval) == (
        cfg.model.tp,
        cfg.model.ep,
        cfg.train_iters,
        cfg.save_interval,
    )


# ----------------------------------------------------------------------------- names and paths are safe


def _problems(**patch: object) -> list[str]:
    data = {**_lab(), **patch}
    try:
        config.from_dict(data, "run.yml")
    except config.ConfigError as err:
        return err.problems
    return []


@pytest.mark.parametrize(
    ("patch", "message"),
    [
        ({"checkpoint_dir": "relative/path"}, "checkpoint_dir: 'relative/path' must be an absolute"),
        ({"checkpoint_dir": "ckpt"}, "it is relative (it must start with '/')"),
        ({"checkpoint_dir": "/shared/../etc"}, "'..' components are not allowed"),
        ({"checkpoint_dir": "/shared/./x"}, "'.' components are not allowed"),
        ({"checkpoint_dir": "/shared//x"}, "'//' is not allowed"),
        ({"checkpoint_dir": "/shared/x;y"}, "characters ';' are not allowed"),
        ({"checkpoint_dir": "/shared/ckpt$HOME"}, "characters '$' are not allowed"),
        ({"checkpoint_dir": "/shared/ck\n"}, "control characters are not allowed ('\\n')"),
        ({"checkpoint_dir": "/"}, "checkpoint_dir: '/' must be a directory other than / (the root)"),
        ({"name": "run;id"}, "name: 'run;id' must be 1-64 letters"),
        ({"name": "lab\n"}, "name: 'lab\\n' must be"),
        ({"name": "-lab"}, "name: '-lab' must be"),
        ({"name": "a" * 65}, "must be 1-64 letters"),
        ({"partition": "batch;id"}, "partition: 'batch;id' must be a Slurm partition name"),
        ({"partition": "-batch"}, "partition: '-batch' must be a Slurm partition name"),
        ({"python": "python3; id"}, "python: 'python3; id' must be a command name"),
        ({"python": "/opt/venv/../bin/python"}, "'..' components are not allowed"),
        ({"python": "-c"}, "python: '-c' must be a command name"),
        ({"container_image": "img;id"}, "container_image: 'img;id' must be an image reference"),
        ({"container_image": "$(id)"}, "container_image: '$(id)' must be an image reference"),
        ({"container_mounts": ["/shared/../etc:/etc2"]}, "SRC must be an absolute, normalised path"),
        ({"container_mounts": ["/data:rel"]}, "DST must be an absolute, normalised path"),
        ({"container_mounts": ["/a b:/c"]}, "characters ' ' are not allowed"),
        ({"container_mounts": ["/a:/b:ro;id"]}, "FLAGS must be letters"),
        ({"container_mounts": ["/a:/b:ro:x"]}, "must be SRC:DST[:FLAGS]"),
        ({"container_mounts": ["/a,/b:/c"]}, "characters ',' are not allowed"),
        ({"time_limit": "00:20:00\n"}, "is not a Slurm time"),
        ({"nccl": {"debug": "WARN", "extra_env": {"NCCL_X\n": "1"}}}, "is not an environment variable name"),
    ],
)
def test_hostile_names_and_paths_rejected(patch: dict, message: str) -> None:
    problems = _problems(**patch)
    assert any(message in p for p in problems), problems


@pytest.mark.parametrize(
    "patch",
    [
        {"checkpoint_dir": "/shared/ckpt"},
        {"checkpoint_dir": "/lustre/lcm/checkpoints/run-1_a.b"},
        {"name": "h200-2node_v1.2"},
        {"partition": "batch"},
        {"partition": None},
        {"python": "python3"},
        {"python": "/opt/lcm/venv/bin/python3.11"},
        {"container_image": "nvcr.io#nvidia/pytorch:25.01-py3"},
        {"container_image": "docker://nvcr.io#nvidia/pytorch@sha256:0123abcd"},
        {"container_image": "/shared/images/pytorch+cuda.sqsh"},
        {"container_mounts": ["/shared:/shared", "/data:/data:ro", "/raid/x:/x:ro+rprivate"]},
    ],
)
def test_legitimate_names_and_paths_accepted(patch: dict) -> None:
    assert _problems(**patch) == []


def test_checkpoint_dir_must_be_inside_the_spec_storage() -> None:
    cluster = config.load_cluster(ROOT / "inventories" / "lab")  # storage.mountpoint /shared
    inside = config.from_dict({**_lab(), "checkpoint_dir": "/shared/runs/ckpt"})
    assert config.cluster_problems(inside, cluster) == []
    assert config.cluster_problems(config.from_dict(_lab()), cluster) == []  # unset: <run_dir>/checkpoints
    outside = config.from_dict({**_lab(), "checkpoint_dir": "/sharedx/ckpt"})
    (problem,) = config.cluster_problems(outside, cluster)
    assert problem.startswith("checkpoint_dir: '/sharedx/ckpt' must be inside the spec's storage.mountpoint")
    # A `..` path never reaches the comparison: validate() refuses it, cluster_problems does not count it in.
    escaping = config.RunConfig(checkpoint_dir="/shared/../etc")
    assert any("'..' components are not allowed" in p for p in config.validate(escaping))
    assert config.cluster_problems(escaping, cluster) == []


# --------------------------------------------------------------------------- one copy of the trainer's rules


@pytest.mark.parametrize(
    "model",
    [
        {"num_attention_heads": 3},
        {"tp": 3},
        {"ep": 3},
        {"moe_router_topk": 1},
        {"tp": 2, "ffn_hidden_size": 129},
        {"tp": 2, "seq_length": 63},
        {"global_batch_size": 6},
        {"seed": -1},
    ],
)
def test_config_refuses_what_the_trainer_refuses(model: dict) -> None:
    """The run config's model checks are the trainer's (lcm_runner/train/rules.py): the same argv fails
    in the trainer, so nothing the config accepts fails at the trainer's start."""
    from lcm_runner.train.args import ArgError, parse_args, validate_world

    data = _lab()
    data["model"] = {**data["model"], **model}
    with pytest.raises(config.ConfigError):
        config.from_dict(data)
    base = config.from_dict(_lab())
    cfg = dataclasses.replace(base, model=dataclasses.replace(base.model, **model))
    with pytest.raises(ArgError):
        validate_world(parse_args(cfg.to_train_args("/ck")), cfg.world_size)


def test_validation_needs_no_torch() -> None:
    """Run configs are validated on the controller, which has no torch."""
    code = (
        "import sys; from lcm_runner.config import load_run_config; "
        f"load_run_config({str(ROOT / 'configs' / 'h200.yml')!r}); "
        "assert 'torch' not in sys.modules and 'megatron' not in sys.modules"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT)


def _h200() -> dict:
    return yaml.safe_load((ROOT / "configs" / "h200.yml").read_text())


def test_h200_carries_the_module_layout() -> None:
    cfg = config.from_dict(_h200(), "h200.yml")
    m = cfg.model
    assert (m.tp, m.pp, m.ep, m.seq_length, m.use_flash_attn, m.bf16) == (4, 2, 2, 8192, True, True)
    assert cfg.nodes * cfg.procs_per_node == 16


@pytest.mark.parametrize(
    ("model", "message"),
    [  # each breaks one rule of the TP4 x PP2 x EP2 layout over 2 x 8 GPUs, named before any launch
        ({"num_attention_heads": 18}, "model.num_attention_heads = 18: expected a multiple of model.tp (4)"),
        ({"num_layers": 13}, "model.num_layers = 13: expected a multiple of model.pp (2)"),
        ({"num_experts": 7}, "model.num_experts = 7: expected a multiple of model.ep (2)"),
        (
            {"seq_length": 8190},
            "model.seq_length = 8190: expected a multiple of model.tp (4) (sequence parallel",
        ),
        (
            {"global_batch_size": 31},
            "model.global_batch_size = 31: expected a multiple of model.micro_batch_size",
        ),
        ({"ep": 4}, "expected a multiple of EP (4) x ETP (4) x PP (2) = 32"),
        ({"pp": 4}, "expected a multiple of EP (2) x ETP (4) x PP (4) = 32"),
        ({"hidden_size": 8192, "num_attention_heads": 16}, "= 512, must be a multiple of 8 and at most 256"),
    ],
)
def test_h200_layout_errors_name_the_field(model: dict, message: str) -> None:
    data = _h200()
    data["model"] = {**data["model"], **model}
    with pytest.raises(config.ConfigError) as err:
        config.from_dict(data, "h200.yml")
    assert any(message in p for p in err.value.problems), err.value.problems
