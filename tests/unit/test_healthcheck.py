"""The node health check (roles/slurm/files/lcm-healthcheck.sh): the real script run by bash.

GPU and InfiniBand hardware are absent here, so those branches run against stand-ins: an
`nvidia-smi` script on PATH and a sysfs-shaped tree of real files. The storage checks use real
directories; the drain path uses an `scontrol` stand-in that records its arguments (on the lab the
same script drains a real node: tests/infra/test_slurm.py).
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import yaml
from _role_render import REPO, render

SCRIPT = REPO / "roles" / "slurm" / "files" / "lcm-healthcheck.sh"


def _write_conf(path: Path, **values: object) -> Path:
    base = {
        "LCM_HC_GPU_COUNT": 0,
        "LCM_HC_IB_HCAS": "",
        "LCM_HC_IB_RATE_GBPS": 0,
        "LCM_HC_STORAGE_TYPE": "lab_shared",
        "LCM_HC_MOUNTPOINT": "",
        "LCM_HC_CHECKPOINT_DIR": "",
        "LCM_HC_DRAIN": 0,
    }
    base.update(values)
    path.write_text("".join(f'{k}="{v}"\n' for k, v in base.items()))
    return path


def _run(conf: Path, bindir: Path | None = None, **env: str) -> subprocess.CompletedProcess[str]:
    path = os.environ["PATH"]
    if bindir is not None:
        path = f"{bindir}:{path}"
    return subprocess.run(
        ["bash", str(SCRIPT), str(conf)],
        capture_output=True,
        text=True,
        env={"PATH": path, "HOME": "/tmp", **env},
        timeout=30,
        check=False,
    )


def _storage(tmp_path: Path) -> tuple[Path, Path]:
    mnt = tmp_path / "shared"
    ckpt = mnt / "checkpoints"
    ckpt.mkdir(parents=True)
    return mnt, ckpt


def _stub(bindir: Path, name: str, body: str) -> None:
    bindir.mkdir(exist_ok=True)
    exe = bindir / name
    exe.write_text("#!/bin/bash\n" + body)
    exe.chmod(0o755)


def test_passes_on_lab_like_node(tmp_path: Path) -> None:
    mnt, ckpt = _storage(tmp_path)
    conf = _write_conf(tmp_path / "hc.conf", LCM_HC_MOUNTPOINT=mnt, LCM_HC_CHECKPOINT_DIR=ckpt)
    result = _run(conf)
    assert result.returncode == 0, result.stderr
    assert result.stderr == ""


def test_rendered_lab_config_passes(tmp_path: Path) -> None:
    """The role's template, fed the lab spec with its paths moved into tmp, gives a passing check."""
    mnt, ckpt = _storage(tmp_path)
    cluster = yaml.safe_load((REPO / "inventories/lab/group_vars/all/cluster.yml").read_text())["cluster"]
    cluster["storage"].update(mountpoint=str(mnt), checkpoint_dir=str(ckpt))
    text = render("slurm", "lcm-healthcheck.conf.j2", {"cluster": cluster})
    conf = tmp_path / "hc.conf"
    conf.write_text(text.replace("LCM_HC_DRAIN=1", "LCM_HC_DRAIN=0"))
    result = _run(conf)
    assert result.returncode == 0, result.stderr


def test_missing_checkpoint_dir_fails_and_drains(tmp_path: Path) -> None:
    mnt, ckpt = _storage(tmp_path)
    ckpt.rmdir()
    conf = _write_conf(
        tmp_path / "hc.conf", LCM_HC_MOUNTPOINT=mnt, LCM_HC_CHECKPOINT_DIR=ckpt, LCM_HC_DRAIN=1
    )
    bindir = tmp_path / "bin"
    record = tmp_path / "scontrol.args"
    _stub(bindir, "scontrol", f'printf "%s\\n" "$@" > {record}\n')
    result = _run(conf, bindir, SLURMD_NODENAME="node7")
    assert result.returncode == 1
    assert f"checkpoint dir '{ckpt}' missing" in result.stderr
    args = record.read_text().splitlines()
    assert args[:3] == ["update", "NodeName=node7", "State=DRAIN"]
    assert args[3].startswith("Reason=lcm-health: storage: checkpoint dir")


def test_no_drain_when_disabled(tmp_path: Path) -> None:
    conf = _write_conf(tmp_path / "hc.conf", LCM_HC_MOUNTPOINT=tmp_path / "nope", LCM_HC_CHECKPOINT_DIR="/x")
    bindir = tmp_path / "bin"
    record = tmp_path / "scontrol.args"
    _stub(bindir, "scontrol", f"touch {record}\n")
    result = _run(conf, bindir)
    assert result.returncode == 1
    assert "mountpoint" in result.stderr and "missing" in result.stderr
    assert not record.exists()


def test_nfs_type_requires_an_nfs_mount(tmp_path: Path) -> None:
    mnt, ckpt = _storage(tmp_path)
    conf = _write_conf(
        tmp_path / "hc.conf", LCM_HC_STORAGE_TYPE="nfs", LCM_HC_MOUNTPOINT=mnt, LCM_HC_CHECKPOINT_DIR=ckpt
    )
    result = _run(conf)
    assert result.returncode == 1
    assert f"{mnt} is not an NFS mount" in result.stderr


def test_existing_type_requires_a_mount_point(tmp_path: Path) -> None:
    mnt, ckpt = _storage(tmp_path)
    conf = _write_conf(
        tmp_path / "hc.conf",
        LCM_HC_STORAGE_TYPE="existing",
        LCM_HC_MOUNTPOINT=mnt,
        LCM_HC_CHECKPOINT_DIR=ckpt,
    )
    result = _run(conf)
    assert result.returncode == 1
    assert f"{mnt} is not mounted" in result.stderr
    # / is always a mount point: the same check passes there.
    conf = _write_conf(
        tmp_path / "hc2.conf",
        LCM_HC_STORAGE_TYPE="existing",
        LCM_HC_MOUNTPOINT="/",
        LCM_HC_CHECKPOINT_DIR=ckpt,
    )
    assert _run(conf).returncode == 0


def test_gpu_count_checked_when_declared(tmp_path: Path) -> None:
    mnt, ckpt = _storage(tmp_path)
    conf = _write_conf(
        tmp_path / "hc.conf", LCM_HC_GPU_COUNT=8, LCM_HC_MOUNTPOINT=mnt, LCM_HC_CHECKPOINT_DIR=ckpt
    )
    empty_path = tmp_path / "nobin"
    empty_path.mkdir()
    result = subprocess.run(
        ["/bin/bash", str(SCRIPT), str(conf)],
        capture_output=True,
        text=True,
        env={"PATH": f"{empty_path}:/usr/bin:/bin"},
        check=False,
    )
    if Path("/usr/bin/nvidia-smi").exists():  # pragma: no cover - GPU machines
        return
    assert result.returncode == 1
    assert "nvidia-smi not found, expected 8 GPUs" in result.stderr

    bindir = tmp_path / "bin"
    listing = "".join(f"GPU {i}: NVIDIA H200 (UUID: GPU-{i})\\n" for i in range(7))
    _stub(bindir, "nvidia-smi", f'printf "{listing}"\n')
    result = _run(conf, bindir)
    assert result.returncode == 1
    assert "nvidia-smi lists 7 GPUs, expected 8" in result.stderr

    _stub(bindir, "nvidia-smi", 'echo "NVIDIA-SMI has failed" ; exit 9\n')
    result = _run(conf, bindir)
    assert "nvidia-smi failed: NVIDIA-SMI has failed" in result.stderr

    listing = "".join(f"GPU {i}: NVIDIA H200 (UUID: GPU-{i})\\n" for i in range(8))
    _stub(bindir, "nvidia-smi", f'printf "{listing}"\n')
    assert _run(conf, bindir).returncode == 0


def _hca(root: Path, name: str, state: str, rate: str) -> None:
    port = root / name / "ports" / "1"
    port.mkdir(parents=True)
    (port / "state").write_text(state + "\n")
    (port / "rate").write_text(rate + "\n")


def test_fabric_state_and_rate(tmp_path: Path) -> None:
    mnt, ckpt = _storage(tmp_path)
    sysfs = tmp_path / "sys" / "class" / "infiniband"
    _hca(sysfs, "mlx5_0", "4: ACTIVE", "400 Gb/sec (4X NDR)")
    _hca(sysfs, "mlx5_1", "1: DOWN", "200 Gb/sec (4X HDR)")
    conf = _write_conf(
        tmp_path / "hc.conf",
        LCM_HC_IB_HCAS="mlx5_0 mlx5_1 mlx5_2",
        LCM_HC_IB_RATE_GBPS=400,
        LCM_HC_MOUNTPOINT=mnt,
        LCM_HC_CHECKPOINT_DIR=ckpt,
        LCM_HC_SYSFS_IB=sysfs,
    )
    result = _run(conf)
    assert result.returncode == 1
    assert "mlx5_0" not in result.stderr
    assert "fabric: mlx5_1 port 1 state '1: DOWN', expected ACTIVE" in result.stderr
    assert "fabric: mlx5_1 rate 200 Gb/s, expected >= 400" in result.stderr
    assert "fabric: mlx5_2 port 1 not present" in result.stderr

    conf = _write_conf(
        tmp_path / "hc2.conf",
        LCM_HC_IB_HCAS="mlx5_0",
        LCM_HC_IB_RATE_GBPS=400,
        LCM_HC_MOUNTPOINT=mnt,
        LCM_HC_CHECKPOINT_DIR=ckpt,
        LCM_HC_SYSFS_IB=sysfs,
    )
    assert _run(conf).returncode == 0


def test_unreadable_config_is_a_distinct_error(tmp_path: Path) -> None:
    result = _run(tmp_path / "absent.conf")
    assert result.returncode == 2
    assert "cannot read config" in result.stderr
