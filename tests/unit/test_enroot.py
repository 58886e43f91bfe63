"""enroot role: enroot.conf and the epilog cleanup config rendered by Ansible's engine, and the
epilog cleanup hook (roles/enroot/files/enroot-epilog-cleanup.sh) run by bash on real directories of
two users; the install method (release .debs or a build of the pinned source): the role's artifact and
package lists, its preflight run by ansible-playbook, and the lock rules and _artifacts checks that go with
each. Enroot itself is not installed here; see docs/containers.md."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
from pathlib import Path

import pytest
import yaml
from _role_render import REPO, evaluate, render
from _role_run import run_role

from lcm_runner.lock import release_lock
from lcm_runner.spec import fill_defaults, validate
from lcm_runner.spec.lock_rules import SETTINGS, layer_needs, role_settings

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


# ------------------------------------------------------------------ install method: deb (release) or source

LOCK = release_lock(yaml.safe_load((REPO / "versions.lock.yml").read_text())["lcm_lock"])
# The lab inventory's role settings (what playbooks/validate.yml hands lock_rules for that inventory).
LAB_SETTINGS = {
    k: v
    for k, v in yaml.safe_load((REPO / "inventories/lab/group_vars/all/lab.yml").read_text()).items()
    if k in SETTINGS
}


def _vars(method: str | None = None, caps: bool | None = None, **extra: object) -> dict:
    out: dict = {"cluster": _cluster(), "lcm_lock": LOCK, **extra}
    if method is not None:
        out["enroot_install_method"] = method
    if caps is not None:
        out["enroot_caps"] = caps
    return out


@pytest.mark.parametrize(
    ("method", "caps", "artifacts"),
    [
        (None, None, ["enroot", "enroot_caps"]),  # the role's default: the release .debs with caps
        ("deb", True, ["enroot", "enroot_caps"]),
        ("deb", False, ["enroot"]),
        ("source", True, ["enroot_src"]),
        ("source", False, ["enroot_src"]),
    ],
)
def test_artifacts_follow_the_install_method(method: str | None, caps: bool | None, artifacts: list) -> None:
    assert list(evaluate("enroot", "_enroot_artifacts", _vars(method, caps))) == artifacts


def test_build_packages_only_for_the_source_install() -> None:
    deps = list(evaluate("enroot", "_enroot_dep_packages", _vars()))
    build = list(evaluate("enroot", "_enroot_build_packages", _vars()))
    assert {"makeself", "libbsd-dev", "gcc", "make", "libc6-dev"} == set(build)
    assert list(evaluate("enroot", "_enroot_packages", _vars("deb"))) == deps
    assert list(evaluate("enroot", "_enroot_packages", _vars(None))) == deps
    assert list(evaluate("enroot", "_enroot_packages", _vars("source"))) == deps + build
    # every package either path installs is pinned in the lock (roles/_packages installs exact versions)
    assert [p for p in deps + build if p not in LOCK["packages"]] == []


def test_version_binary_and_stamp_per_install_method() -> None:
    src = LOCK["artifacts"]["enroot_src"]
    assert evaluate("enroot", "_enroot_version", _vars("source")) == src["version"]
    assert evaluate("enroot", "_enroot_version", _vars("deb")) == LOCK["artifacts"]["enroot"]["version"]
    assert evaluate("enroot", "_enroot_bin", _vars("source")) == "/usr/local/bin/enroot"
    assert evaluate("enroot", "_enroot_bin", _vars("source", enroot_prefix="/opt/enroot")) == (
        "/opt/enroot/bin/enroot"
    )
    assert evaluate("enroot", "_enroot_bin", _vars("deb", enroot_prefix="/opt/enroot")) == "/usr/bin/enroot"
    assert (
        evaluate("enroot", "_enroot_build_dir", _vars("source")) == f"/usr/local/src/enroot-{src['version']}"
    )
    stamp = " ".join(evaluate("enroot", "_enroot_stamp", _vars("source")).split())
    assert stamp == (
        f"enroot={src['version']} sha256={src['sha256']} prefix=/usr/local caps=True "
        f"libc6={LOCK['packages']['libc6-dev']}"
    )
    # a new tarball, prefix, caps choice or glibc: another stamp, so install_source.yml rebuilds
    newer = yaml.safe_load(yaml.safe_dump(LOCK))
    newer["artifacts"]["enroot_src"]["sha256"] = "0" * 64
    other_glibc = yaml.safe_load(yaml.safe_dump(LOCK))
    other_glibc["packages"]["libc6-dev"] = "2.36-9+deb12u99"
    others = [
        _vars("source", lcm_lock=newer),
        _vars("source", lcm_lock=other_glibc),
        _vars("source", enroot_prefix="/opt/enroot"),
        _vars("source", caps=False),
    ]
    assert len({stamp, *(" ".join(evaluate("enroot", "_enroot_stamp", v).split()) for v in others)}) == 5


def _preflight(tmp_path: Path, **extra: object):
    return run_role("enroot", tmp_path, {"cluster": _cluster(), **extra}, tags="enroot_preflight")


@pytest.mark.parametrize("method", ["rpm", "Source", ""])
def test_preflight_refuses_an_unknown_install_method_naming_it(tmp_path: Path, method: str) -> None:
    run = _preflight(tmp_path, enroot_install_method=method)
    assert run.rc != 0
    (msg,) = run.failed_msgs
    assert msg == f"enroot: enroot_install_method must be deb or source, got '{method}'"
    assert not [r for r in run.results if "Gather installed package versions" in r["task"]], "went on"


@pytest.mark.parametrize("method", ["deb", "source"])
def test_preflight_passes_both_methods_on_a_clean_node(tmp_path: Path, method: str) -> None:
    run = _preflight(tmp_path, enroot_install_method=method, enroot_prefix=str(tmp_path / "prefix"))
    assert run.rc == 0, run.failed_msgs or run.stderr[-2000:]
    source_check = run.task("Check the source path's prefix and the build tools' pins")
    assert bool(source_check.get("skipped")) is (method == "deb")


def test_preflight_source_needs_the_build_tools_pinned(tmp_path: Path) -> None:
    lock = yaml.safe_load(yaml.safe_dump(LOCK))
    del lock["packages"]["makeself"]
    run = _preflight(tmp_path, enroot_install_method="source", lcm_lock=lock)
    assert run.rc != 0
    (msg,) = run.failed_msgs
    assert msg.startswith("enroot (source install): enroot_prefix and enroot_src_dir must be absolute")
    assert "must pin gcc, make, libc6-dev, makeself, libbsd-dev under lcm_lock.packages" in msg
    assert _preflight(tmp_path, enroot_install_method="deb", lcm_lock=lock).rc == 0, "deb needs no makeself"


def test_preflight_refuses_the_deb_over_a_source_build(tmp_path: Path) -> None:
    """A node with a source build (its stamp under the prefix) is not given the .debs on top."""
    prefix = tmp_path / "prefix"
    (prefix / "lib/enroot").mkdir(parents=True)
    (prefix / "lib/enroot/.lcm-build").write_text("enroot=4.1.2\n")
    run = _preflight(tmp_path, enroot_install_method="deb", enroot_prefix=str(prefix))
    assert run.rc != 0
    (msg,) = run.failed_msgs
    assert f"a source build is installed under {prefix}" in msg
    assert f"`make uninstall` in /usr/local/src/enroot-{LOCK['artifacts']['enroot']['version']}" in msg
    assert "enroot_install_method is deb: one install path at a time. Nothing was changed." in msg
    again = _preflight(tmp_path, enroot_install_method="source", enroot_prefix=str(prefix))
    assert again.rc == 0, again.failed_msgs


# --------------------------------------------------------------------------- the lock: validation, _artifacts


def _needs(method: str, caps: bool = True) -> set[tuple[str, str, str]]:
    settings = role_settings({"enroot_install_method": method, "enroot_caps": caps})
    return {n for n in layer_needs(fill_defaults(_cluster()), settings) if n[0] == "enroot"}


def test_lock_rules_source_needs_the_tarball_and_the_build_tools_not_the_debs() -> None:
    needs = _needs("source")
    assert {
        ("enroot", "artifacts", "enroot_src"),
        ("enroot", "packages", "makeself"),
        ("enroot", "packages", "libbsd-dev"),
    } <= needs
    assert not {n for n in needs if n[1] == "artifacts" and n[2] in ("enroot", "enroot_caps")}
    assert _needs("source", caps=False) == needs


@pytest.mark.parametrize(("caps", "debs"), [(True, {"enroot", "enroot_caps"}), (False, {"enroot"})])
def test_lock_rules_deb_needs_the_debs_and_no_build_tools(caps: bool, debs: set) -> None:
    needs = _needs("deb", caps)
    assert {n[2] for n in needs if n[1] == "artifacts"} == debs
    assert not {n for n in needs if n[2] in ("makeself", "libbsd-dev", "enroot_src")}


@pytest.mark.parametrize(("method", "caps"), [("deb", True), ("deb", False), ("source", True)])
def test_lock_rules_agree_with_what_the_role_installs(method: str, caps: bool) -> None:
    needs = _needs(method, caps)
    role = _vars(method, caps)
    assert {n[2] for n in needs if n[1] == "artifacts"} == set(evaluate("enroot", "_enroot_artifacts", role))
    assert {n[2] for n in needs if n[1] == "packages"} == set(evaluate("enroot", "_enroot_packages", role))


def test_the_lab_inventory_builds_from_source_and_its_lock_validates() -> None:
    assert LAB_SETTINGS == {"enroot_install_method": "source"}
    assert LAB["layers"]["enroot"] is True and LAB["layers"]["pyxis"] is True
    assert [str(e) for e in validate(LAB, None, LOCK, LAB_SETTINGS)] == []
    for name in ("enroot_src", "pyxis"):  # what the lab fetches from its offline mirror is locked
        assert re.fullmatch(r"[0-9a-f]{64}", LOCK["artifacts"][name]["sha256"]), name


def test_the_lab_lock_without_the_source_entry_fails_validation_naming_it() -> None:
    lock = yaml.safe_load(yaml.safe_dump(LOCK))
    del lock["artifacts"]["enroot_src"]
    del lock["packages"]["libbsd-dev"]
    msgs = sorted(str(e) for e in validate(LAB, None, lock, LAB_SETTINGS))
    assert msgs == [
        "lcm_lock.artifacts.enroot_src = null: expected an entry: cluster.layers.enroot is true and installs "
        "it from the lock",
        "lcm_lock.packages.libbsd-dev = null: expected an entry: cluster.layers.enroot is true and installs "
        "it from the lock",
    ]
    assert [str(e) for e in validate(LAB, None, lock, {"enroot_install_method": "deb"})] == []


def test_a_deb_spec_validates_but_the_unlocked_debs_are_refused_by_artifacts(tmp_path: Path) -> None:
    """sha256 null is 'not locked yet' to the validation (the .debs are not reachable from the lab); the
    install path's _artifacts preflight refuses them before anything is fetched or installed."""
    assert (
        LOCK["artifacts"]["enroot"]["sha256"] is None and LOCK["artifacts"]["enroot_caps"]["sha256"] is None
    )
    assert [str(e) for e in validate(LAB, None, LOCK, {"enroot_install_method": "deb"})] == []
    names = list(evaluate("enroot", "_enroot_artifacts", _vars("deb")))
    run = run_role("_artifacts", tmp_path, {"_artifacts_names": names}, tasks_from="preflight")
    assert run.rc != 0
    (msg,) = run.failed_msgs
    assert msg.startswith(
        "not locked (sha256 is null): enroot_4.1.2-1_amd64.deb, enroot+caps_4.1.2-1_amd64.deb: download them "
        "into one directory and run `lcm-runner lock update <dir>` in the checkout"
    )
    assert msg.endswith("Nothing was installed.")


def test_the_source_and_pyxis_artifacts_pass_the_artifacts_preflight(tmp_path: Path) -> None:
    names = [*evaluate("enroot", "_enroot_artifacts", _vars("source")), "pyxis"]
    assert names == ["enroot_src", "pyxis"]
    run = run_role("_artifacts", tmp_path, {"_artifacts_names": names}, tasks_from="preflight")
    assert run.rc == 0, run.failed_msgs


def test_lock_rules_keep_the_enroot_debs_and_source_one_release() -> None:
    import copy

    from lcm_runner.spec import validate as spec_validate

    lock = release_lock(yaml.safe_load((REPO / "versions.lock.yml").read_text())["lcm_lock"])
    spec = yaml.safe_load((REPO / "inventories/lab/group_vars/all/cluster.yml").read_text())["cluster"]
    settings = {"enroot_install_method": "source"}
    assert spec_validate(spec, lock=lock, settings=settings) == []
    moved = copy.deepcopy(lock)
    moved["artifacts"]["enroot"]["version"] = "4.2.0"
    errs = [str(e) for e in spec_validate(spec, lock=moved, settings=settings)]
    assert any("lcm_lock.artifacts.enroot" in e and "one Enroot release" in e for e in errs), errs
