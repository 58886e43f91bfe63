"""The containers layer on a converged cluster where cluster.layers.enroot/pyxis are true (the lab builds
Enroot and Pyxis from the pinned sources of the offline mirror, docs/containers.md): versions equal the
lock, plugstack.conf loads Pyxis (slurmd runs with it), a container step runs as an unprivileged user,
and the training image is the content-addressed one the recipe gives. Templates and the epilog cleanup
logic: tests/unit/test_enroot.py, test_pyxis.py, test_train_image.py.

Run: pytest tests/infra/test_containers.py --hosts=ansible://all --ansible-inventory=inventories/<name>
LCM_TEST_CONTAINER_IMAGE names the image a step starts from (default: the training image's link,
<storage>/images/lcm-train.sqsh, which the lab builds; a site with a registry names e.g. ubuntu:22.04).
"""

from __future__ import annotations

import json
import os
import shlex
from pathlib import Path
from typing import Any

import pytest
import yaml
from conftest import cluster_spec, host_vars, lock_for, role_var

from lcm_runner.lock import release_lock

ROOT = Path(__file__).resolve().parents[2]
LOCK = release_lock(yaml.safe_load((ROOT / "versions.lock.yml").read_text(encoding="utf-8"))["lcm_lock"])
# The unprivileged account of the lab (roles/common: common_users); a site names its own.
TEST_USER = os.environ.get("LCM_TEST_CONTAINER_USER", "lcm-user")


def _need(host: Any, layer: str) -> dict[str, Any]:
    spec = cluster_spec(host)
    if not spec["layers"].get(layer):
        pytest.skip(f"cluster.layers.{layer} is false in this inventory")
    return spec


def _image(spec: dict[str, Any]) -> str:
    default = f"{spec['storage']['mountpoint']}/images/lcm-train.sqsh"
    return os.environ.get("LCM_TEST_CONTAINER_IMAGE") or default


def _method(host: Any) -> str:
    return str(role_var(host, "enroot", "enroot_install_method"))


@pytest.mark.groups("compute")
def test_enroot_is_the_locked_version(host: Any) -> None:
    _need(host, "enroot")
    method = _method(host)
    if method == "source":
        want = LOCK["artifacts"]["enroot_src"]["version"]
        binary = f"{role_var(host, 'enroot', 'enroot_prefix')}/bin/enroot"
        assert not host.package("enroot").is_installed, "a source build beside the enroot package"
        stamp = host.file(f"{role_var(host, 'enroot', 'enroot_prefix')}/lib/enroot/.lcm-build")
        assert stamp.contains(f"sha256={LOCK['artifacts']['enroot_src']['sha256']}")
    else:
        want = LOCK["artifacts"]["enroot"]["version"]
        binary = "/usr/bin/enroot"
        assert host.package("enroot").version.startswith(want)
    assert host.check_output(f"{binary} version").strip() == want
    assert host.check_output("command -v enroot").strip() == binary


@pytest.mark.groups("compute")
def test_enroot_configured_per_user_on_local_scratch(host: Any) -> None:
    spec = _need(host, "enroot")
    conf = host.file("/etc/enroot/enroot.conf")
    scratch = spec["storage"]["local_scratch"]
    assert conf.contains(f"ENROOT_DATA_PATH {scratch}/enroot/data/user-\\$(id -u)")
    assert conf.contains(f"ENROOT_RUNTIME_PATH {scratch}/enroot/runtime/user-\\$(id -u)")
    assert host.file("/etc/slurm/epilog.d/50-enroot-cleanup.sh").mode == 0o755
    for hook in role_var(host, "enroot", "enroot_disabled_hooks"):
        assert not host.file(f"/etc/enroot/hooks.d/{hook}").mode & 0o111, hook
    if role_var(host, "enroot", "enroot_caps"):
        prefix = role_var(host, "enroot", "enroot_prefix") if _method(host) == "source" else "/usr"
        caps = host.check_output(f"getcap {prefix}/bin/enroot-mksquashovlfs")
        assert "cap_sys_admin" in caps, caps


@pytest.mark.groups("compute", "controller")
def test_pyxis_is_the_locked_version_and_registered(host: Any) -> None:
    _need(host, "pyxis")
    prefix = role_var(host, "pyxis", "pyxis_prefix")
    plugin = host.file(f"{prefix}/lib/slurm/spank_pyxis.so")
    assert plugin.exists
    want = LOCK["artifacts"]["pyxis"]["version"]
    version = host.check_output(f"grep -a -o 'pyxis: version v[0-9.]*' {plugin.path} | head -n 1")
    assert version.strip() == f"pyxis: version v{want}"
    stamp = host.file(f"{prefix}/lib/slurm/.spank_pyxis.build")
    assert stamp.contains(f"pyxis={want} slurm={lock_for(host)['packages']['libslurm-dev']}")
    conf = host.file("/etc/slurm/plugstack.conf.d/pyxis.conf")
    assert conf.contains(f"^required {plugin.path} ")
    assert host.file("/etc/slurm/plugstack.conf").contains("include /etc/slurm/plugstack.conf.d/")
    # the submit side loads it: srun knows the container options
    assert "--container-image" in host.check_output("srun --help")


@pytest.mark.groups("compute")
def test_slurmd_loaded_pyxis(host: Any) -> None:
    _need(host, "pyxis")
    assert host.service("slurmd").is_running
    want = LOCK["artifacts"]["pyxis"]["version"]
    since = host.check_output("systemctl show -p ActiveEnterTimestamp --value slurmd").strip()
    log = host.check_output(f"journalctl -u slurmd --since {shlex.quote(since)} --no-pager -o cat")
    assert f"pyxis: version v{want}" in log, log[-2000:]


@pytest.mark.groups("controller")
def test_the_training_image_is_the_recipes(host: Any) -> None:
    spec = _need(host, "enroot")
    if not host_vars(host).get("train_image_build"):
        pytest.skip("train_image_build is off in this inventory (images come from a registry)")
    link = host.file(f"{spec['storage']['mountpoint']}/images/lcm-train.sqsh")
    assert link.is_symlink
    target = host.file(f"{spec['storage']['mountpoint']}/images/{link.linked_to.split('/')[-1]}")
    manifest = json.loads(host.file(target.path.removesuffix(".sqsh") + ".json").content_string)
    assert manifest["image"].endswith(target.path.split("/")[-1])
    assert host.check_output(f"sha256sum {target.path}").split()[0] == manifest["sha256"]
    assert target.path.endswith(f"-{manifest['key'][:16]}.sqsh")


@pytest.mark.groups("controller")
def test_container_step_runs_as_an_unprivileged_user(host: Any) -> None:
    spec = _need(host, "pyxis")
    image = _image(spec)
    uid = host.check_output(f"id -u {TEST_USER}").strip()
    script = (
        f"cd /tmp && timeout 300 srun --nodes=1 --time=10 --container-image={shlex.quote(image)} "
        "--no-container-remap-root "
        "bash -c 'id -u; grep -c /enroot/ /proc/self/mountinfo; test -w /; grep PRETTY_NAME /etc/os-release'"
    )
    out = host.run(f"su - {TEST_USER} -c {shlex.quote(script)}")
    assert out.rc == 0, out.stderr
    lines = out.stdout.split()
    assert lines[0] == uid, out.stdout  # the user's own uid inside, not root
    assert int(lines[1]) >= 1, out.stdout  # the root filesystem is Enroot's (unpacked or squashfuse)
    assert "PRETTY_NAME" in out.stdout
    node = host.check_output("sinfo -h -N -t idle,mix -o %N | head -n 1").strip()
    # the same step pinned to one node, then that node's epilog (roles/enroot) must have removed the
    # user's Enroot directories there (Pyxis removes the container; the epilog the per-user dirs)
    pinned = script.replace("srun --nodes=1", f"srun --nodes=1 -w {node}")
    assert host.run(f"su - {TEST_USER} -c {shlex.quote(pinned)}").rc == 0
    scratch = spec["storage"]["local_scratch"]
    dirs = " ".join(f"{scratch}/enroot/{kind}/user-{uid}" for kind in ("runtime", "data", "tmp"))
    left = host.run(
        f"cd /tmp && timeout 120 srun --nodes=1 -w {node} bash -c 'ls -d {dirs} 2>/dev/null; true'"
    )
    assert left.rc == 0, left.stderr
    assert left.stdout.strip() == "", f"left on {node} after the job: {left.stdout}"
