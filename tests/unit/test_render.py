"""lcm_runner.render: the sbatch and nccl_env.sh of the lab and of a production H200 spec.

The rendered scripts are checked by bash itself (`bash -n`, and the node function is executed with the
real interpreter standing in for the agent so that its argv can be parsed by the real torchrun/agent/
trainer parsers); nccl_env.sh is rendered by Ansible's template module too and must be identical.
"""

from __future__ import annotations

import copy
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from lcm_runner import config, render

ROOT = Path(__file__).resolve().parents[2]
LAB = ROOT / "inventories" / "lab"
H200 = ROOT / "inventories" / "example-h200"


def _cluster(inv: Path) -> dict:
    return config.load_cluster(inv)


def _cfg(name: str, **over: object) -> config.RunConfig:
    data = yaml.safe_load((ROOT / "configs" / name).read_text())
    data.update(over)
    return config.from_dict(data)


def _sourced(path: Path) -> dict[str, str]:
    """The environment a shell has after sourcing the file (bash does the quoting, not us)."""
    out = subprocess.run(
        ["bash", "-c", f'set -e; . "{path}"; env -0'], check=True, capture_output=True, env={}, text=True
    ).stdout
    return dict(item.split("=", 1) for item in out.split("\0") if "=" in item)


def test_lab_and_h200_render_and_pass_bash_n(tmp_path: Path) -> None:
    for inv, cfgname in ((LAB, "lab.yml"), (H200, "h200.yml")):
        out = render.render_run(_cluster(inv), _cfg(cfgname), tmp_path / cfgname)
        for f in (out.sbatch, out.nccl_env):
            subprocess.run(["bash", "-n", str(f)], check=True)
        assert os.access(out.sbatch, os.X_OK)
        assert (out.run_dir / "logs").is_dir() and (out.run_dir / "telemetry").is_dir()


def test_h200_sbatch_has_gres_container_torchrun_and_signal(tmp_path: Path) -> None:
    cluster = _cluster(H200)
    out = render.render_run(cluster, _cfg("h200.yml"), tmp_path / "r", nccl_profile=True)
    text = out.sbatch.read_text()
    mp = cluster["storage"]["mountpoint"]
    for line in (
        "#SBATCH --nodes=2",
        "#SBATCH --ntasks-per-node=1",
        "#SBATCH --gres=gpu:h200:8",
        "#SBATCH --time=24:00:00",
        "#SBATCH --partition=gpu",  # the spec's default partition
        "#SBATCH --signal=USR1@180",
        "#SBATCH --requeue",
        'MASTER_NODE="$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)"',
        'export MASTER_ADDR="${MASTER_ADDR:-$MASTER_NODE}"',  # its NodeAddr, else its name
        "export TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1",
        "--container-image='nvcr.io#nvidia/pytorch:25.01-py3'",
        "--rdzv-backend c10d",
        '--rdzv-endpoint "$MASTER_ADDR:29500"',
        '--rdzv-id "$SLURM_JOB_ID"',
        "--rdzv-conf join_timeout=120",
        "--max-restarts 2",
        "--nproc-per-node 8",
        'export NCCL_DEBUG_FILE="$LCM_RUN_DIR/nccl/nccl.%h.%p.log"',
        'scontrol requeue "$SLURM_JOB_ID"',
    ):
        assert line in text, line
    mounts = next(ln for ln in text.splitlines() if "--container-mounts=" in ln)
    assert f"{mp}:{mp}" in mounts and f"{out.run_dir}:{out.run_dir}" in mounts
    assert (out.run_dir / "nccl").is_dir()


def test_lab_sbatch_is_cpu_without_gres_or_container(tmp_path: Path) -> None:
    text = render.render_run(_cluster(LAB), _cfg("lab.yml"), tmp_path / "r").sbatch.read_text()
    assert "--gres" not in text and "--container" not in text
    assert "NCCL_DEBUG_FILE" not in text  # only when profiling
    assert "--device cpu" in text and "#SBATCH --partition=batch" in text
    # lcm agent: a lost peer (76) is relaunched from the checkpoint like a requeue request (75)
    assert "  75) " in text and "  76) " in text


def _run_node_function(sbatch: Path, tmp_path: Path, stand_in_rc: int) -> tuple[list[str], int]:
    """Execute the rendered lcm_node() with bash, a stand-in agent that records its argv."""
    argv_file = tmp_path / "argv.json"
    stand_in = tmp_path / "python"
    stand_in.write_text(
        f"#!{sys.executable}\n"
        "import json, os, sys\n"
        "if sys.argv[1:3] == ['-m', 'lcm_runner.metrics']:\n"  # the spec's monitoring writer: not the agent
        "    sys.exit(0)\n"
        "if sys.argv[1:3] == ['-m', 'lcm_runner.telemetry']:\n"
        f"    os.execv({sys.executable!r}, [{sys.executable!r}] + sys.argv[1:])\n"
        f"json.dump(sys.argv[1:], open({str(argv_file)!r}, 'w'))\n"
        f"sys.exit({stand_in_rc})\n"
    )
    stand_in.chmod(0o755)
    env = {
        "PATH": os.environ["PATH"],
        "PYTHONPATH": str(ROOT),
        "LCM_PYTHON": str(stand_in),
        "LCM_RUN_DIR": str(sbatch.parent),
        "SLURM_NODEID": "1",
        "SLURM_JOB_ID": "4242",
        "MASTER_ADDR": "lab-node1",
    }
    script = f"source <(sed -n '/^lcm_node() {{/,/^}}/p' {sbatch}); lcm_node"
    rc = subprocess.run(["bash", "-c", script], env=env, check=False).returncode
    return json.loads(argv_file.read_text()), rc


def test_torchrun_node_command_parses_with_real_torchrun_and_trainer(tmp_path: Path) -> None:
    from torch.distributed.run import get_args_parser

    from lcm_runner.train.args import parse_args

    out = render.render_run(_cluster(H200), _cfg("h200.yml"), tmp_path / "r")
    argv, rc = _run_node_function(out.sbatch, tmp_path, 0)
    assert rc == 0
    assert argv[:2] == ["-m", "torch.distributed.run"]
    ns = get_args_parser().parse_args(argv[2:])
    assert (ns.nnodes, str(ns.nproc_per_node), ns.rdzv_backend) == ("2", "8", "c10d")
    assert ns.rdzv_endpoint == "lab-node1:29500" and ns.rdzv_id == "4242"
    assert ns.rdzv_conf == "join_timeout=120" and ns.max_restarts == 2
    assert "SIGUSR1" in ns.signals_to_handle and ns.module
    assert ns.training_script == "lcm_runner.train"
    targs = parse_args(ns.training_script_args)
    assert (targs.tp, targs.ep, targs.bf16, targs.device) == (4, 2, True, "cuda")
    assert targs.save == str(out.run_dir / "checkpoints")


def test_torchrun_requeue_is_read_from_the_ranks_telemetry(tmp_path: Path) -> None:
    out = render.render_run(_cluster(H200), _cfg("h200.yml"), tmp_path / "r")
    # torchrun itself reports 1; no exit record yet: the node reports the failure as it is
    _, rc = _run_node_function(out.sbatch, tmp_path, 1)
    assert rc == 1
    rec = {"ts": 4e9, "event": "exit", "rank": 0, "attempt": 0, "job": "4242", "code": 75, "reason": "signal"}
    (out.run_dir / "telemetry" / "rank0.jsonl").write_text(json.dumps(rec) + "\n")
    _, rc = _run_node_function(out.sbatch, tmp_path, 1)
    assert rc == 75
    rec["job"] = "other"  # another job's requeue does not count
    (out.run_dir / "telemetry" / "rank0.jsonl").write_text(json.dumps(rec) + "\n")
    _, rc = _run_node_function(out.sbatch, tmp_path, 1)
    assert rc == 1


def test_lcm_agent_node_command_parses_with_the_agent(tmp_path: Path) -> None:
    from lcm_runner.launch import agent

    out = render.render_run(_cluster(LAB), _cfg("lab.yml"), tmp_path / "r")
    argv, rc = _run_node_function(out.sbatch, tmp_path, 0)
    assert rc == 0 and argv[:2] == ["-m", "lcm_runner.launch.agent"]
    ns = agent.build_parser().parse_args(argv[2:])
    assert (ns.nnodes, ns.node_rank, ns.master_addr) == (2, 1, "lab-node1")
    assert str(ns.events) == f"{out.run_dir}/agents/4242/node1.jsonl"


def test_nccl_env_lab_and_h200(tmp_path: Path) -> None:
    lab = tmp_path / "lab.sh"
    lab.write_text(render.nccl_env_text(_cluster(LAB)))
    env = _sourced(lab)
    assert env["NCCL_SOCKET_IFNAME"] == "eth0" and env["GLOO_SOCKET_IFNAME"] == "eth0"
    assert env["NCCL_IB_DISABLE"] == "1" and env["NCCL_DEBUG"] == "WARN"
    assert "NCCL_IB_HCA" not in env and "NCCL_P2P_LEVEL" not in env and "NCCL_NVLS_ENABLE" not in env
    h = tmp_path / "h200.sh"
    h.write_text(render.nccl_env_text(_cluster(H200), "INFO", {"NCCL_BUFFSIZE": "8388608"}))
    env = _sourced(h)
    assert env["NCCL_IB_HCA"] == "=mlx5_0,mlx5_1,mlx5_2,mlx5_3,mlx5_4,mlx5_5,mlx5_6,mlx5_7"
    assert env["NCCL_P2P_LEVEL"] == "NVL" and env["NCCL_NVLS_ENABLE"] == "1"
    assert env["NCCL_DEBUG"] == "INFO" and env["NCCL_BUFFSIZE"] == "8388608"
    assert "NCCL_IB_DISABLE" not in env and "NCCL_IB_GID_INDEX" not in env
    text = h.read_text()
    for line in text.splitlines():  # every export says why
        if line.startswith("export ") and "NCCL_BUFFSIZE" not in line:
            prev = text.splitlines()[text.splitlines().index(line) - 1]
            assert prev.startswith("# "), line


def test_nccl_env_roce_gid_and_nvls_kill_switch(tmp_path: Path) -> None:
    c = copy.deepcopy(_cluster(H200))
    c["fabric"].update(type="roce", roce_gid_index=3)
    f = tmp_path / "roce.sh"
    f.write_text(render.nccl_env_text(c, "WARN", {"NCCL_NVLS_ENABLE": "0", "NCCL_X": "it's"}))
    env = _sourced(f)
    assert env["NCCL_IB_GID_INDEX"] == "3"
    assert env["NCCL_NVLS_ENABLE"] == "0"  # the extra env replaces the spec-derived line
    assert f.read_text().count("NCCL_NVLS_ENABLE=") == 1
    assert env["NCCL_X"] == "it's"


def test_nccl_env_same_through_ansible_template_module(tmp_path: Path) -> None:
    if shutil.which("ansible") is None:
        pytest.skip("ansible not on PATH (activate the venv)")
    cluster = _cluster(H200)
    extra = {"NCCL_NVLS_ENABLE": "0", "NCCL_BUFFSIZE": "8388608"}
    variables = tmp_path / "vars.json"
    variables.write_text(json.dumps({"cluster": cluster, "nccl_debug": "WARN", "nccl_extra_env": extra}))
    dest = tmp_path / "ansible_nccl_env.sh"
    subprocess.run(
        [
            "ansible",
            "localhost",
            "-i",
            "localhost,",
            "-c",
            "local",
            "-m",
            "ansible.builtin.template",
            "-a",
            f"src={render.TEMPLATES / 'nccl_env.sh.j2'} dest={dest}",
            "-e",
            f"@{variables}",
            "-e",
            f"ansible_python_interpreter={sys.executable}",
        ],
        check=True,
        capture_output=True,
        env={
            **os.environ,
            "ANSIBLE_LOCALHOST_WARNING": "False",
            "ANSIBLE_INVENTORY_UNPARSED_WARNING": "False",
        },
    )
    assert dest.read_text() == render.nccl_env_text(cluster, "WARN", extra)


@pytest.mark.parametrize(
    ("over", "layers", "message"),
    [
        ({"gpus_per_node": 8, "procs_per_node": 2}, {}, "gpu.count_per_node=0"),
        ({"partition": "gpu"}, {}, "partition 'gpu' is not in the spec's slurm.partitions (batch)"),
        ({"time_limit": "3:00:00"}, {}, "exceeds partition batch's max_time 2:00:00"),
        ({"time_limit": "00:02:00"}, {}, "leaves no time before the SIGUSR1"),
        # the lab enables Pyxis (tests/unit/test_container_cli.py): a spec without it
        ({"container_image": "img.sqsh"}, {"pyxis": False}, "layers.pyxis is false"),
    ],
)
def test_config_that_does_not_fit_the_spec_is_refused(
    tmp_path: Path, over: dict, layers: dict, message: str
) -> None:
    data = yaml.safe_load((ROOT / "configs" / "lab.yml").read_text())
    for k, v in over.items():
        if v is None:
            data.pop(k)
        else:
            data[k] = v
    cfg = config.from_dict(data)
    cluster = _cluster(LAB)
    cluster["layers"].update(layers)
    with pytest.raises(render.RenderError, match=message.replace("(", r"\(").replace(")", r"\)")):
        render.render_run(cluster, cfg, tmp_path / "r")
    assert not (tmp_path / "r").exists()  # nothing written


def test_cli_render(tmp_path: Path) -> None:
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "lcm_runner.render",
            "-i",
            str(LAB),
            "-c",
            str(ROOT / "configs" / "lab.yml"),
            "--runs-root",
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        check=False,
        cwd=ROOT,
    )
    assert r.returncode == 0, r.stderr
    (run_dir,) = tmp_path.iterdir()
    assert run_dir.name.endswith("-lab") and f"run dir: {run_dir}" in r.stdout
    assert (run_dir / "train_2node.sbatch").is_file() and (run_dir / "nccl_env.sh").is_file()
    bad = subprocess.run(
        [
            sys.executable,
            "-m",
            "lcm_runner.render",
            "-i",
            str(LAB),
            "-c",
            str(ROOT / "configs" / "h200.yml"),
            "--run-dir",
            str(tmp_path / "x"),
        ],
        capture_output=True,
        text=True,
        check=False,
        cwd=ROOT,
    )
    assert bad.returncode == 2 and "gpu.count_per_node=0" in bad.stderr


def test_lcm_agent_sbatch_marks_lost_nodes_down(tmp_path: Path) -> None:
    # the lcm agent's survivors mark a silent peer node DOWN (lcm_runner.launch.nodefail): the job is
    # requeued at once instead of after SlurmdTimeout; stock torchrun cannot, so it is not enabled there
    lab = render.render_run(_cluster(LAB), _cfg("lab.yml"), tmp_path / "lab").sbatch.read_text()
    assert "export LCM_NODE_LOST_DOWN=1" in lab
    ref = render.render_run(_cluster(LAB), _cfg("lab.yml", agent="torchrun"), tmp_path / "t").sbatch
    assert "LCM_NODE_LOST_DOWN" not in ref.read_text()


def test_cli_render_step_sleep_reaches_the_trainer_and_bad_values_are_refused(tmp_path: Path) -> None:
    from lcm_runner.launch import agent
    from lcm_runner.train.args import parse_args

    base = ["-i", str(LAB), "-c", str(ROOT / "configs" / "lab.yml")]
    assert render.main([*base, "--run-dir", str(tmp_path / "s"), "--step-sleep-ms", "300"]) == 0
    argv, rc = _run_node_function(tmp_path / "s" / "train_2node.sbatch", tmp_path, 0)
    assert rc == 0
    rest = agent.build_parser().parse_args(argv[2:]).train_args
    targs = parse_args(rest[1:] if rest[:1] == ["--"] else rest)
    assert targs.fault_sleep_ms == 300 and targs.train_iters == 30  # the run config's training, paced
    assert render.main([*base, "--run-dir", str(tmp_path / "n")]) == 0
    argv, _ = _run_node_function(tmp_path / "n" / "train_2node.sbatch", tmp_path, 0)
    assert "--fault-sleep-ms" not in argv
    assert render.main([*base, "--run-dir", str(tmp_path / "neg"), "--step-sleep-ms", "-1"]) == 2
    assert not (tmp_path / "neg" / "train_2node.sbatch").exists()
    foreign = ["-i", str(LAB), "-c", str(ROOT / "configs" / "lab-megatron.yml")]
    assert render.main([*foreign, "--run-dir", str(tmp_path / "m"), "--step-sleep-ms", "5"]) == 2
    assert not (tmp_path / "m" / "train_2node.sbatch").exists()


@pytest.mark.parametrize(
    ("show_node", "expected"),
    [
        # the lab and any slurm.conf with NodeAddr=: the address, no DNS lookup on the agents' path
        ("NodeName=gpu01 Arch=x86_64 NodeAddr=10.1.0.11 NodeHostName=gpu01 Version=22.05", "10.1.0.11"),
        # NodeAddr defaults to the name: the name, as before
        ("NodeName=gpu01 Arch=x86_64 NodeAddr=gpu01 NodeHostName=gpu01", "gpu01"),
        # scontrol failed (the controller did not answer): the name, never an empty address
        ("", "gpu01"),
    ],
)
def test_master_addr_is_slurms_address_of_the_first_node(
    tmp_path: Path, show_node: str, expected: str
) -> None:
    out = render.render_run(_cluster(H200), _cfg("h200.yml"), tmp_path / "r")
    lines = out.sbatch.read_text().splitlines()
    start = next(i for i, ln in enumerate(lines) if ln.startswith("MASTER_NODE="))
    snippet = "\n".join(lines[start : start + 3])
    assert snippet.splitlines()[-1] == 'export MASTER_ADDR="${MASTER_ADDR:-$MASTER_NODE}"'
    bindir = tmp_path / "bin"
    bindir.mkdir()
    (bindir / "scontrol").write_text(
        "#!/bin/bash\n"
        'if [[ $1 == show && $2 == hostnames ]]; then printf "gpu01\\ngpu02\\n"; exit 0; fi\n'
        "if [[ $1 == show && $2 == node && $3 == gpu01 ]]; then\n"
        f'  [[ -n "{show_node}" ]] && echo "{show_node}"; exit 0\nfi\n'
        "exit 1\n"
    )
    (bindir / "scontrol").chmod(0o755)
    env = {"PATH": f"{bindir}:{os.environ['PATH']}", "SLURM_JOB_NODELIST": "gpu[01-02]"}
    script = f'{snippet}\necho "$MASTER_ADDR"'
    p = subprocess.run(["bash", "-c", script], env=env, capture_output=True, text=True, check=False)
    assert p.returncode == 0 and p.stdout.strip() == expected, (p.stdout, p.stderr)
