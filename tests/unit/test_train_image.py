"""roles/train_image/files/lcm-train-image.sh run for real by bash on a small fake root filesystem
(IMAGE_ROOT), with the recipe rendered from roles/train_image/templates/train-image.conf.j2 by Ansible's
engine and the real mksquashfs/unsquashfs (squashfs-tools at the lock's version, unpacked by
scripts/bootstrap into .cache/tools/bin: nothing is installed on this machine)."""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml
from _role_render import REPO, render

from lcm_runner.lock import release_lock

TOOL = REPO / "roles" / "train_image" / "files" / "lcm-train-image.sh"
TOOLS_BIN = REPO / ".cache" / "tools" / "bin"
LAB = yaml.safe_load((REPO / "inventories/lab/group_vars/all/cluster.yml").read_text())["cluster"]

DPKG_STATUS = """\
Package: base-files
Status: install ok installed
Priority: required
Section: admin
Maintainer: Santiago Vila <sanvila@debian.org>
Architecture: amd64
Version: 12.4+deb12u5
Description: Debian base system miscellaneous files

Package: bash
Essential: yes
Status: install ok installed
Priority: required
Section: shells
Maintainer: Matthias Klose <doko@debian.org>
Architecture: amd64
Version: 5.2.15-2+b2
Description: GNU Bourne Again SHell
"""

# Never in an image: secrets and node identity (the role's default train_image_exclude).
OLD = 1600000000  # the fake root's file times

SECRETS = ["etc/munge/munge.key", "etc/ssh/ssh_host_ed25519_key", "etc/shadow", "etc/hostname"]


@pytest.fixture(scope="module", autouse=True)
def _squashfs_tools() -> None:
    for tool in ("mksquashfs", "unsquashfs"):
        path = TOOLS_BIN / tool
        if not os.access(path, os.X_OK):
            pytest.fail(f"{path} is missing: run scripts/bootstrap (it unpacks squashfs-tools and liblzo2)")


def _root(tmp: Path) -> Path:
    """A Debian-12-shaped root: usrmerge links, /etc with secrets, a dpkg database, the trainer venv."""
    root = tmp / "root"
    files = {
        "etc/passwd": "root:x:0:0:root:/root:/bin/bash\nlcm:x:1000:1000::/home/lcm:/bin/bash\n",
        "etc/group": "root:x:0:\nlcm:x:1000:\n",
        "etc/os-release": 'PRETTY_NAME="Debian GNU/Linux 12 (bookworm)"\n',
        "etc/ssh/ssh_config": "Host *\n",
        "etc/ssh/ssh_host_ed25519_key": "fake ssh host key (never in an image)\nhost\n",
        "etc/ssh/ssh_host_ed25519_key.pub": "ssh-ed25519 AAAA host\n",
        "etc/munge/munge.key": "munge secret\n",
        "etc/shadow": "root:*:19000:0:99999:7:::\n",
        "etc/shadow-": "root:*:18000:0:99999:7:::\n",
        "etc/hostname": "lab-node1\n",
        "usr/bin/bash": "#!fake bash\n",
        "usr/lib/x86_64-linux-gnu/libc.so.6": "fake libc\n",
        "opt/lcm/venv/bin/python": "#!fake python\n",
        "opt/lcm/venv/lib/python3.11/site-packages/lcm_runner.pth": "/opt/lcm/src\n",
        "var/lib/dpkg/status": DPKG_STATUS,
    }
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    for d in ("usr/sbin", "usr/lib64", "var/lib/dpkg/info", "var/lib/dpkg/updates"):
        (root / d).mkdir(parents=True, exist_ok=True)
    for link, target in (
        ("bin", "usr/bin"),
        ("sbin", "usr/sbin"),
        ("lib", "usr/lib"),
        ("lib64", "usr/lib64"),
    ):
        (root / link).symlink_to(target)
    (root / "etc/shadow").chmod(0o640)
    # installed long ago, as on a node: a change made by the test lands in another second (tar's unit)
    for path in [root, *root.rglob("*")]:
        os.utime(path, (OLD, OLD), follow_symlinks=False)
    return root


def _conf(tmp: Path, images: str = "images", name: str = "conf", **over: object) -> Path:
    """The recipe exactly as the role renders it (the lab's spec; paths under tmp)."""
    variables = {
        "cluster": yaml.safe_load(yaml.safe_dump(LAB)),
        "train_image_dir": str(tmp / images),
        "train_image_stage_dir": str(tmp / "stage"),
        **over,
    }
    path = tmp / f"{name}.conf"
    path.write_text(render("train_image", "train-image.conf.j2", variables))
    return path


def _run(root: Path, *args: object, tool: Path = TOOL) -> subprocess.CompletedProcess[str]:
    env = {
        "PATH": f"{TOOLS_BIN}:/usr/sbin:/usr/bin:/sbin:/bin",
        "IMAGE_ROOT": str(root),
        "LC_ALL": "C",
    }
    return subprocess.run(
        ["bash", str(tool), *map(str, args)],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        check=False,
    )


def _key(root: Path, conf: Path, tool: Path = TOOL) -> str:
    out = _run(root, "key", conf, tool=tool)
    assert out.returncode == 0, out.stderr
    key = out.stdout.strip()
    assert re.fullmatch(r"[0-9a-f]{64}", key), out.stdout
    return key


def _build(root: Path, conf: Path, key: str | None = None) -> subprocess.CompletedProcess[str]:
    out = _run(root, "build", conf, key or _key(root, conf))
    assert out.returncode == 0, out.stderr
    return out


def _listing(root: Path, image: Path) -> set[str]:
    out = _run(root, "list", image)
    assert out.returncode == 0, out.stderr
    return set(out.stdout.splitlines())


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


# ----------------------------------------------------------------------------------------------- the recipe


def test_the_rendered_recipe_is_what_the_tool_reads(tmp_path: Path) -> None:
    text = _conf(tmp_path).read_text()
    assert text.startswith("# managed by lcm-infra\n")
    assert f"IMAGE_DIR={tmp_path}/images\n" in text
    assert "IMAGE_PATHS='bin sbin lib lib64 usr etc var/lib/dpkg'\n" in text
    assert "IMAGE_EXCLUDE='etc/munge etc/ssh/ssh_host_* etc/shadow* " in text
    assert re.search(r"^IMAGE_DIRS='proc .* etc/slurm shared'$", text, re.M), text  # + the shared mountpoint
    assert "IMAGE_COMP=lz4\nIMAGE_EPOCH=1700000000\nIMAGE_KEEP=2\n" in text


# -------------------------------------------------------------------------------------------------- the key


def test_key_is_stable_for_an_unchanged_root(tmp_path: Path) -> None:
    root, conf = _root(tmp_path), _conf(tmp_path)
    assert _key(root, conf) == _key(root, conf)
    # comments (the ansible_managed header) are not inputs
    conf.write_text("# rendered again by another controller\n" + conf.read_text())
    assert _key(root, conf) == _key(root, _conf(tmp_path, name="again"))


def test_key_ignores_bytecode_python_writes_at_run_time(tmp_path: Path) -> None:
    """A training run's first import writes __pycache__/*.pyc into the venv: no new image for that
    (site.yml's idempotence run met a rebuild when any later change moved the key)."""
    root, conf = _root(tmp_path), _conf(tmp_path)
    before = _key(root, conf)
    cache = root / "opt/lcm/venv/lib/python3.11/site-packages/__pycache__"
    cache.mkdir(parents=True, exist_ok=True)
    (cache / "mod.cpython-311.pyc").write_bytes(b"\x00bytecode")
    assert _key(root, conf) == before
    (root / "opt/lcm/venv/lib/python3.11/site-packages/mod.py").write_text("x = 1\n")
    assert _key(root, conf) != before  # a new module is a change


@pytest.mark.parametrize(
    ("rel", "text"),
    [
        ("opt/lcm/venv/bin/python", "#!another python build\n"),
        ("opt/lcm/venv/lib/python3.11/site-packages/torch/__init__.py", "new package\n"),
        ("etc/passwd", "root:x:0:0:root:/root:/bin/bash\nlcm:x:1000:1000::/home/lcm:/bin/sh\n"),
        ("etc/ssh/ssh_config", "Host *\n  ForwardAgent no\n"),
    ],
)
def test_key_changes_with_the_venv_and_the_etc_contents(tmp_path: Path, rel: str, text: str) -> None:
    root, conf = _root(tmp_path), _conf(tmp_path)
    before = _key(root, conf)
    path = root / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    assert _key(root, conf) != before


def test_key_changes_with_the_packages_the_recipe_and_the_tool(tmp_path: Path) -> None:
    root, conf = _root(tmp_path), _conf(tmp_path)
    before = _key(root, conf)
    assert _key(root, _conf(tmp_path, name="gzip", train_image_compression="gzip")) != before
    assert _key(root, _conf(tmp_path, name="keep", train_image_paths=["usr", "etc"])) != before
    tool = tmp_path / "lcm-train-image"
    tool.write_text(TOOL.read_text() + "# a new version of the tool\n")
    assert _key(root, conf, tool=tool) != before
    status = root / "var/lib/dpkg/status"
    status.write_text(status.read_text().replace("5.2.15-2+b2", "5.2.15-2+b3"))
    assert _key(root, conf) != before


def test_key_ignores_the_excluded_files(tmp_path: Path) -> None:
    root, conf = _root(tmp_path), _conf(tmp_path)
    before = _key(root, conf)
    (root / "etc/hostname").write_text("lab-node2\n")
    (root / "etc/munge/munge.key").write_text("another munge key\n")
    (root / "etc/ssh/ssh_host_ed25519_key").write_text("fake ssh host key (never in an image)\nnew\n")
    (root / "etc/shadow").write_text("root:$y$j9T$new:19500:0:99999:7:::\n")
    assert _key(root, conf) == before
    # replaced by rename (hostnamectl, Ansible's copy/template, sed -i): a new inode in etc/, which moves
    # the directory's mtime; the image gets IMAGE_EPOCH for every time, so neither may move the key
    new = root / "etc/.hostname.new"
    new.write_text("lab-node3\n")
    new.rename(root / "etc/hostname")
    (root / "etc/machine-id").write_text("0123456789abcdef0123456789abcdef\n")
    assert _key(root, conf) == before


# ------------------------------------------------------------------------------------------------ the build


def test_build_writes_the_image_its_manifest_and_the_link(tmp_path: Path) -> None:
    root, conf = _root(tmp_path), _conf(tmp_path)
    key = _key(root, conf)
    out = _build(root, conf, key)
    images = tmp_path / "images"
    image = images / f"lcm-train-{key[:16]}.sqsh"
    line = out.stdout.strip().splitlines()[-1]
    assert line.startswith(f"built {image} {{")
    manifest = json.loads((images / f"lcm-train-{key[:16]}.json").read_text())
    assert json.loads(line.split(" ", 2)[2]) == manifest
    assert manifest["key"] == key and manifest["image"] == str(image)
    assert manifest["sha256"] == _sha(image) and manifest["bytes"] == image.stat().st_size
    assert manifest["compression"] == "lz4" and manifest["epoch"] == 1700000000
    link = images / "lcm-train.sqsh"
    assert link.is_symlink() and os.readlink(link) == image.name  # relative: valid on every node's mount
    assert sorted(p.name for p in images.iterdir()) == sorted([image.name, f"{image.stem}.json", link.name])
    assert list((tmp_path / "stage").iterdir()) == [], "the staged tree was left behind"


def test_the_image_has_the_environment_and_none_of_the_secrets(tmp_path: Path) -> None:
    root, conf = _root(tmp_path), _conf(tmp_path)
    _build(root, conf)
    paths = _listing(root, tmp_path / "images" / "lcm-train.sqsh")
    assert {"etc/passwd", "etc/group", "etc/os-release", "etc/ssh/ssh_config"} <= paths
    assert {"opt/lcm/venv/bin/python", "usr/bin/bash", "var/lib/dpkg/status", "bin", "lib64"} <= paths
    dirs = re.search(r"^IMAGE_DIRS='(.*)'$", conf.read_text(), re.M)
    assert dirs
    assert set(dirs.group(1).split()) <= paths  # the mount points, the shared storage's included
    leaked = [
        p for p in paths if p in SECRETS or p.startswith(("etc/munge", "etc/ssh/ssh_host_", "etc/shadow"))
    ]
    assert leaked == []
    assert not {p for p in paths if p.startswith("etc/slurm/")}  # mounted at run time: an empty mount point


def test_the_image_keeps_modes_and_stamps_every_time(tmp_path: Path) -> None:
    root, conf = _root(tmp_path), _conf(tmp_path)
    _build(root, conf)
    out = subprocess.run(
        [str(TOOLS_BIN / "unsquashfs"), "-lls", "-d", "", str(tmp_path / "images/lcm-train.sqsh")],
        capture_output=True,
        text=True,
        check=True,
    )
    # perms owner/group size date time path [-> target]
    rows = {f[5]: line for line in out.stdout.splitlines() if len(f := line.split()) > 5}
    assert rows["/tmp"].startswith("drwxrwxrwt") and rows["/var/tmp"].startswith("drwxrwxrwt")
    assert rows["/usr/bin"].startswith("drwxr-xr-x")
    assert rows["/lib64"].startswith("lrwxrwxrwx") and rows["/lib64"].endswith("/lib64 -> usr/lib64")
    assert rows["/usr/bin/bash"].startswith("-rw-r--r--")
    # every entry carries IMAGE_EPOCH (2023-11-14 22:13 UTC), none the time of the fake root
    assert all("2023-11-14 22:13" in line for line in rows.values()), out.stdout


def test_a_second_build_with_the_same_key_reuses_the_file(tmp_path: Path) -> None:
    root, conf = _root(tmp_path), _conf(tmp_path)
    key = _key(root, conf)
    _build(root, conf, key)
    image = tmp_path / "images" / f"lcm-train-{key[:16]}.sqsh"
    manifest = image.with_suffix(".json")
    before = (image.stat(), manifest.stat(), manifest.read_text())
    again = _build(root, conf, key)
    assert again.stdout.startswith(f"reused {image} {{")
    after = (image.stat(), manifest.stat(), manifest.read_text())
    assert (after[0].st_ino, after[0].st_mtime_ns) == (before[0].st_ino, before[0].st_mtime_ns)
    assert (after[1].st_ino, after[1].st_mtime_ns) == (before[1].st_ino, before[1].st_mtime_ns)
    assert after[2] == before[2]


def test_the_same_tree_gives_byte_identical_images(tmp_path: Path) -> None:
    root = _root(tmp_path)
    one, two = _conf(tmp_path, "images-a", "a"), _conf(tmp_path, "images-b", "b")
    _build(root, one)
    _build(root, two)
    a, b = tmp_path / "images-a/lcm-train.sqsh", tmp_path / "images-b/lcm-train.sqsh"
    assert a.resolve() != b.resolve()
    assert _sha(a) == _sha(b)


def test_retention_keeps_the_newest_and_never_the_linked_image(tmp_path: Path) -> None:
    root = _root(tmp_path)
    images = tmp_path / "images"
    images.mkdir()
    # another image family whose name starts like ours: never pruned by this one
    neighbour = [images / f"lcm-train-big-0123456789abcdef{suffix}" for suffix in (".sqsh", ".json")]
    for path in neighbour:
        path.write_text("{}\n")

    def build(epoch: int, keep: int) -> tuple[str, str]:
        conf = _conf(tmp_path, name=f"e{epoch}-k{keep}", train_image_epoch=epoch, train_image_keep=keep)
        key = _key(root, conf)
        state = _build(root, conf, key).stdout.split()[0]
        return f"lcm-train-{key[:16]}", state

    def present() -> set[str]:
        return {p.stem for p in images.glob("lcm-train-*.json")} - {"lcm-train-big-0123456789abcdef"}

    def linked() -> str:
        return os.readlink(images / "lcm-train.sqsh").removesuffix(".sqsh")

    (a, _), (b, _), (c, _) = build(1700000001, 2), build(1700000002, 2), build(1700000003, 2)
    assert len({a, b, c}) == 3  # IMAGE_EPOCH is part of the recipe: three keys
    assert present() == {b, c}, "IMAGE_KEEP=2: the oldest goes"
    assert not (images / f"{a}.sqsh").exists() and not (images / f"{a}.json").exists()
    assert linked() == c
    x, state = build(1700000010, 1)
    assert state == "built" and present() == {x} and linked() == x
    # a newer image appears (another recipe, built elsewhere); the linked one is then not among the
    # IMAGE_KEEP=1 newest, and stays
    newer = images / "lcm-train-ffffffffffffffff"
    newer.with_suffix(".sqsh").write_text("other image\n")
    newer.with_suffix(".json").write_text("{}\n")
    x_again, state = build(1700000010, 1)
    assert (x_again, state) == (x, "reused")
    assert present() == {x, newer.name} and linked() == x
    assert (images / f"{x}.sqsh").stat().st_size > 0
    assert all(path.exists() for path in neighbour)


# ------------------------------------------------------------------------------------------------- failures


def test_a_stale_key_fails_and_leaves_nothing(tmp_path: Path) -> None:
    root, conf = _root(tmp_path), _conf(tmp_path)
    key = _key(root, conf)
    (root / "opt/lcm/venv/bin/pip").write_text("#!pip installed after the key\n")
    out = _run(root, "build", conf, key)
    assert out.returncode == 2
    assert "the inputs changed since the key was computed" in out.stderr
    assert f"({key} -> {_key(root, conf)})" in out.stderr and "run again" in out.stderr
    images = tmp_path / "images"
    assert not images.exists() or list(images.iterdir()) == []
    assert not (tmp_path / "stage").exists() or list((tmp_path / "stage").iterdir()) == []


def test_a_failed_mksquashfs_leaves_no_partial_image(tmp_path: Path) -> None:
    root = _root(tmp_path)
    conf = _conf(tmp_path)
    conf.write_text(conf.read_text().replace("IMAGE_COMP=lz4", "IMAGE_COMP=nosuchcomp"))
    out = _run(root, "build", conf, _key(root, conf))
    assert out.returncode != 0
    assert list((tmp_path / "images").iterdir()) == []
    assert list((tmp_path / "stage").iterdir()) == []


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ([], "usage: lcm-train-image"),
        (["key"], "usage: lcm-train-image"),
        (["list"], "usage: lcm-train-image"),
        (["frobnicate", "{conf}"], "unknown command frobnicate"),
        (["key", "{tmp}/missing.conf"], "cannot read"),
        (["build", "{conf}"], "build needs the 64-hex key"),
        (["build", "{conf}", "abc123"], "build needs the 64-hex key"),
        (["build", "{conf}", "A" * 64], "build needs the 64-hex key"),
        (["build", "{conf}", "0" * 64, "extra"], "build needs the 64-hex key"),
        (["key", "{partial}"], "does not set IMAGE_STAGE"),
    ],
)
def test_bad_usage_exits_2(tmp_path: Path, args: list[str], message: str) -> None:
    root, conf = _root(tmp_path), _conf(tmp_path)
    partial = tmp_path / "partial.conf"
    partial.write_text(
        "\n".join(x for x in conf.read_text().splitlines() if not x.startswith("IMAGE_STAGE="))
    )
    argv = [a.format(conf=conf, tmp=tmp_path, partial=partial) for a in args]
    out = _run(root, *argv)
    assert out.returncode == 2, out
    assert message in out.stderr
    assert out.stdout == ""
    assert not (tmp_path / "images").exists()


def test_a_missing_root_exits_2(tmp_path: Path) -> None:
    out = _run(tmp_path / "nowhere", "key", _conf(tmp_path))
    assert out.returncode == 2 and "is not a directory" in out.stderr


def test_the_tools_come_from_the_lock(tmp_path: Path) -> None:
    """scripts/bootstrap unpacked the lock's squashfs-tools (and its liblzo2), not whatever is around."""
    lock = release_lock(yaml.safe_load((REPO / "versions.lock.yml").read_text())["lcm_lock"])["packages"]
    stamp = (TOOLS_BIN.parent / "squashfs.version").read_text().split()
    assert stamp == [f"squashfs-tools={lock['squashfs-tools']}", f"liblzo2-2={lock['liblzo2-2']}"]
    out = subprocess.run(
        [str(TOOLS_BIN / "mksquashfs"), "-version"], capture_output=True, text=True, check=True
    )
    upstream = lock["squashfs-tools"].split(":")[-1].rsplit("-", 1)[0]
    assert out.stdout.startswith(f"mksquashfs version {upstream} ")
    assert shutil.which("mksquashfs", path=f"{TOOLS_BIN}") == str(TOOLS_BIN / "mksquashfs")
