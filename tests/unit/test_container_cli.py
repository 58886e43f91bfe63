"""`lcm-runner <stage> --container-image/--container-mount`: the options reach the rendered sbatch (the
run's train_2node.sbatch and the batch script a stage's job is submitted with) as srun's --container-*
options on a spec with layers.pyxis, and bad input (an empty image, a bad mount, a mount without an
image, a spec without Pyxis) is refused with exit 2 before anything is written or submitted. Nothing is
launched: make_context builds the run exactly as the stage would, and the stage's script is rendered
by the same lcm_runner.render.sbatch_for the Slurm launcher submits."""

from __future__ import annotations

import shlex
import subprocess
from pathlib import Path

import pytest
import yaml

from lcm_runner import config, render
from lcm_runner.cli import build_parser, main, make_context
from lcm_runner.config import ConfigError, with_container

ROOT = Path(__file__).resolve().parents[2]
LAB_INV = ROOT / "inventories" / "lab"
LAB_CFG = ROOT / "configs" / "lab.yml"
IMAGE = "/shared/images/lcm-train.sqsh"


def _argv(tmp_path: Path, *extra: str, inventory: Path = LAB_INV) -> list[str]:
    return [
        "baseline",
        "--config",
        str(LAB_CFG),
        "--inventory",
        str(inventory),
        "--run-dir",
        str(tmp_path / "run"),
        *extra,
    ]


def _srun_options(sbatch: str) -> dict[str, str]:
    """The --container-* options of the script's srun line(s), as bash would split them."""
    out: dict[str, str] = {}
    for line in sbatch.splitlines():
        for word in shlex.split(line.strip().rstrip("\\"), comments=False) if "--container-" in line else []:
            if word.startswith("--container-"):
                key, _, value = word.partition("=")
                out[key] = value
    return out


def test_the_lab_spec_enables_pyxis_and_the_lab_config_names_no_image() -> None:
    cluster = config.load_cluster(LAB_INV)
    assert cluster["layers"]["pyxis"] is True
    cfg = config.load_run_config(LAB_CFG)
    assert cfg.container_image is None
    assert "/etc/slurm:/etc/slurm:ro" in cfg.container_mounts
    assert render.check(cluster, cfg) == []
    assert with_container(cfg, None, []) is cfg and with_container(cfg, None, None) is cfg


def test_container_options_reach_the_rendered_sbatch(tmp_path: Path) -> None:
    ns = build_parser().parse_args(
        _argv(
            tmp_path,
            "--container-image",
            IMAGE,
            "--container-mount",
            "/etc/slurm:/etc/slurm:ro",  # also in configs/lab.yml: mounted once
            "--container-mount",
            "/scratch/data:/data:ro",
        )
    )
    ctx = make_context(ns)
    try:
        assert ctx.launcher.name == "slurm" and ctx.cfg.container_image == IMAGE
        run_dir = ctx.run_dir.resolve()
        cluster = ctx.cluster
        textfile = render.train_metrics(cluster).textfile_dir
        want_mounts = [
            "/shared:/shared",  # the spec's shared storage
            f"{run_dir}:{run_dir}",  # the run dir (not under /shared here)
            f"{textfile}:{textfile}",  # the metrics writer runs in the container too
            "/etc/slurm:/etc/slurm:ro",  # the run config's (configs/lab.yml) ...
            "/run/munge:/run/munge",
            "/scratch/data:/data:ro",  # ... then the command line's
        ]
        # the run's own script (make_context renders it) and the baseline job's (what submit() sends)
        scripts = {
            "train_2node.sbatch": (run_dir / "train_2node.sbatch").read_text(),
            "baseline job": render.sbatch_for(cluster, ctx.spec("baseline", "baseline"), job_name="lcm-x"),
        }
        for name, text in scripts.items():
            opts = _srun_options(text)
            assert opts["--container-image"] == IMAGE, name
            assert opts["--container-mounts"].split(",") == want_mounts, name
            assert opts["--container-workdir"] == str(run_dir), name
            assert f"--container-image={IMAGE} " in text, name
            subprocess.run(["bash", "-n"], input=text, text=True, check=True)
        assert render.check(cluster, ctx.cfg) == []  # what SlurmLauncher.submit checks first
    finally:
        ctx.launcher.close()


def test_without_an_image_the_sbatch_has_no_container(tmp_path: Path) -> None:
    ctx = make_context(build_parser().parse_args(_argv(tmp_path)))
    try:
        text = (ctx.run_dir / "train_2node.sbatch").read_text()
        assert "--container" not in text  # configs/lab.yml's mounts apply only with an image
        assert "--container" not in render.sbatch_for(ctx.cluster, ctx.spec("baseline", "baseline"))
    finally:
        ctx.launcher.close()


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--container-image", ""], "container_image: empty; leave it out when no container is used"),
        (["--container-image", "   "], "container_image: empty"),
        (["--container-image", "img.sqsh;reboot"], "container_image: 'img.sqsh;reboot' must be an image"),
        (["--container-image", IMAGE, "--container-mount", "/etc/slurm"], "must be SRC:DST[:FLAGS]"),
        (
            ["--container-image", IMAGE, "--container-mount", "/a:/b:ro:extra"],
            "'/a:/b:ro:extra' must be SRC:DST[:FLAGS]",
        ),
        (
            ["--container-image", IMAGE, "--container-mount", "relative:/data"],
            "'relative:/data': SRC must be",
        ),
        (["--container-image", IMAGE, "--container-mount", "/a,b:/data"], "'/a,b:/data': SRC must be"),
        (["--container-image", IMAGE, "--container-mount", "/a:/b:r o"], "FLAGS must be letters, digits"),
        (["--container-mount", "/data:/data"], "--container-mount needs a container image"),
    ],
)
def test_bad_container_options_exit_2_before_anything_is_written(
    tmp_path: Path, extra: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(_argv(tmp_path, *extra)) == 2
    err = capsys.readouterr().err
    assert err.startswith("lcm-runner baseline: ") and message in err, err
    assert not (tmp_path / "run").exists(), "the run dir was created"


@pytest.mark.parametrize(
    ("image", "mounts", "message"),
    [
        ("", [], "container_image: empty"),
        (None, ["/data"], "container_mounts: '/data' must be SRC:DST[:FLAGS]"),
        (None, ["/data:/data"], "--container-mount needs a container image"),
    ],
)
def test_with_container_raises_config_error_naming_the_source(
    image: str | None, mounts: list[str], message: str
) -> None:
    cfg = config.load_run_config(LAB_CFG)
    with pytest.raises(ConfigError, match="command line") as exc:
        with_container(cfg, image, mounts)
    assert message in str(exc.value)


def test_with_container_keeps_the_config_and_appends_new_mounts_once() -> None:
    cfg = config.load_run_config(LAB_CFG)
    out = with_container(cfg, IMAGE, ["/run/munge:/run/munge", "/data:/data", "/data:/data"])
    assert out.container_image == IMAGE and cfg.container_image is None  # a new config, not a mutation
    assert out.container_mounts[: len(cfg.container_mounts)] == cfg.container_mounts
    assert out.container_mounts.count("/run/munge:/run/munge") == 1
    assert "/data:/data" in out.container_mounts
    with_image = config.from_dict({**yaml.safe_load(LAB_CFG.read_text()), "container_image": "a.sqsh"})
    assert with_container(with_image, None, ["/data:/data"]).container_image == "a.sqsh"
    assert with_container(with_image, IMAGE).container_image == IMAGE  # the command line wins


def test_a_spec_without_pyxis_refuses_the_image_before_anything_runs(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    doc = yaml.safe_load((LAB_INV / "group_vars/all/cluster.yml").read_text())
    doc["cluster"]["layers"]["pyxis"] = False
    spec = tmp_path / "cluster.yml"
    spec.write_text(yaml.safe_dump(doc))
    assert main(_argv(tmp_path, "--container-image", IMAGE, inventory=spec)) == 2
    err = capsys.readouterr().err
    assert "container_image is set but the spec's layers.pyxis is false (no srun --container-image)" in err
    assert not (tmp_path / "run" / "train_2node.sbatch").exists()


def test_the_local_launcher_refuses_an_image_before_anything_runs(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(_argv(tmp_path, "--container-image", IMAGE, "--launcher", "torchrun")) == 2
    err = capsys.readouterr().err
    assert "only the slurm launcher runs jobs in containers" in err, err
    assert not (tmp_path / "run").exists(), "the run dir was created"
