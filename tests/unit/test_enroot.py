"""enroot role: enroot.conf and the epilog cleanup config rendered by Ansible's engine, and the
epilog cleanup hook (roles/enroot/files/enroot-epilog-cleanup.sh) run by bash on real directories of
two users. Enroot itself is not installable here (no registry carries it); see docs/scheduler.md."""

from __future__ import annotations

import os
import shlex
import subprocess
from pathlib import Path

import yaml
from _role_render import REPO, evaluate, render

HOOK = REPO / "roles" / "enroot" / "files" / "enroot-epilog-cleanup.sh"
LAB = yaml.safe_load((REPO / "inventories/lab/group_vars/all/cluster.yml").read_text())["cluster"]


def _cluster(scratch: str | None = "/raid") -> dict:
    spec = yaml.safe_load(yaml.safe_dump(LAB))
    if scratch is not None:
        spec["storage"]["local_scratch"] = scratch
    return spec


def _conf_lines(text: str) -> dict[str, str]:
    out = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            key, _, value = line.partition(" ")
            out[key] = value
    return out


def test_enroot_conf_paths_on_local_scratch_per_user() -> None:
    conf = _conf_lines(render("enroot", "enroot.conf.j2", {"cluster": _cluster()}))
    assert conf["ENROOT_RUNTIME_PATH"] == "/raid/enroot/runtime/user-$(id -u)"
    assert conf["ENROOT_CACHE_PATH"] == "/raid/enroot/cache/user-$(id -u)"
    assert conf["ENROOT_DATA_PATH"] == "/raid/enroot/data/user-$(id -u)"
    assert conf["ENROOT_TEMP_PATH"] == "/raid/enroot/tmp/user-$(id -u)"
    assert conf["ENROOT_MOUNT_HOME"] == "n"
    assert conf["ENROOT_RESTRICT_DEV"] == "y"
    # Enroot expands the values with the shell: each user gets their own directory.
    expanded = subprocess.run(
        ["bash", "-c", f"echo {conf['ENROOT_DATA_PATH']}"], capture_output=True, text=True, check=True
    ).stdout.strip()
    assert expanded == f"/raid/enroot/data/user-{os.getuid()}"


def test_enroot_conf_default_scratch_and_extra_keys() -> None:
    text = render(
        "enroot",
        "enroot.conf.j2",
        {
            "cluster": _cluster(None),
            "enroot_extra_config": {"ENROOT_ZSTD_OPTIONS": "-1"},
            "enroot_mount_home": True,
        },
    )
    conf = _conf_lines(text)
    assert conf["ENROOT_RUNTIME_PATH"].startswith("/var/lib/lcm-local/enroot/runtime/")
    assert conf["ENROOT_ZSTD_OPTIONS"] == "-1"
    assert conf["ENROOT_MOUNT_HOME"] == "y"


def test_cleanup_roots_keep_cache_unless_asked() -> None:
    text = render("enroot", "lcm-epilog-cleanup.conf.j2", {"cluster": _cluster()})
    assert 'LCM_ENROOT_CLEAN_ROOTS="/raid/enroot/runtime /raid/enroot/data /raid/enroot/tmp"' in text
    roots = evaluate(
        "enroot", "_enroot_clean_roots", {"cluster": _cluster(), "enroot_epilog_clean_cache": True}
    )
    assert list(roots) == [f"/raid/enroot/{d}" for d in ("runtime", "data", "tmp", "cache")]


def _tree(tmp: Path) -> tuple[Path, list[Path]]:
    base = tmp / "enroot"
    roots = [base / d for d in ("runtime", "data", "tmp", "cache")]
    for root in roots:
        for uid in (1000, 1001):
            d = root / f"user-{uid}" / "pyxis_42" / "usr" / "bin"
            d.mkdir(parents=True)
            (d / "python").write_text("x")
    conf = tmp / "cleanup.conf"
    conf.write_text(f'LCM_ENROOT_CLEAN_ROOTS="{" ".join(shlex.quote(str(r)) for r in roots[:3])}"\n')
    return conf, roots


def _hook(conf: Path, bindir: Path | None = None, **env: str) -> subprocess.CompletedProcess[str]:
    path = "/usr/bin:/bin" if bindir is None else f"{bindir}:/usr/bin:/bin"
    return subprocess.run(
        ["bash", str(HOOK), str(conf)],
        capture_output=True,
        text=True,
        env={"PATH": path, "SLURMD_NODENAME": "node1", **env},
        check=False,
        timeout=30,
    )


def test_cleanup_removes_only_the_job_users_dirs(tmp_path: Path) -> None:
    conf, roots = _tree(tmp_path)
    result = _hook(conf, SLURM_JOB_UID="1000", SLURM_JOB_ID="42")
    assert result.returncode == 0, result.stderr
    for root in roots[:3]:
        assert not (root / "user-1000").exists()
        assert (root / "user-1001" / "pyxis_42" / "usr" / "bin" / "python").read_text() == "x"
    assert (roots[3] / "user-1000").is_dir()  # cache not in the configured roots: kept


def test_cleanup_rejects_a_non_numeric_uid(tmp_path: Path) -> None:
    conf, roots = _tree(tmp_path)
    for bad in ("", "1001/..", "../user-1001", "10 01", "root"):
        result = _hook(conf, SLURM_JOB_UID=bad)
        assert result.returncode == 2, bad
        assert "not a numeric uid" in result.stderr
    assert all((root / f"user-{u}").is_dir() for root in roots for u in (1000, 1001))


def test_cleanup_does_not_follow_a_symlinked_user_dir(tmp_path: Path) -> None:
    conf, roots = _tree(tmp_path)
    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "keep").write_text("k")
    runtime = roots[0]
    import shutil

    shutil.rmtree(runtime / "user-1000")
    (runtime / "user-1000").symlink_to(victim)
    result = _hook(conf, SLURM_JOB_UID="1000")
    assert result.returncode == 0
    assert "not a plain directory; left alone" in result.stderr
    assert (victim / "keep").read_text() == "k"
    assert not (roots[1] / "user-1000").exists()


def _squeue(bindir: Path, jobs: str) -> None:
    bindir.mkdir(exist_ok=True)
    exe = bindir / "squeue"
    exe.write_text(f"#!/bin/bash\nprintf '{jobs}'\n")
    exe.chmod(0o755)


def test_cleanup_waits_while_the_user_has_another_job_on_the_node(tmp_path: Path) -> None:
    """squeue is a stand-in here (no slurmctld in unit tests): it lists the user's jobs on the node."""
    conf, roots = _tree(tmp_path)
    bindir = tmp_path / "bin"
    _squeue(bindir, "42\\n43\\n")
    result = _hook(conf, bindir, SLURM_JOB_UID="1000", SLURM_JOB_ID="42")
    assert result.returncode == 0
    assert "1 other job(s)" in result.stdout
    assert (roots[0] / "user-1000").is_dir()
    _squeue(bindir, "42\\n")  # only the finishing job itself
    assert _hook(conf, bindir, SLURM_JOB_UID="1000", SLURM_JOB_ID="42").returncode == 0
    assert not (roots[0] / "user-1000").exists()
