#!/usr/bin/env python3
"""Pyxis' own bats tests (tests/*.bats of the pinned Pyxis source) on the podman lab (tests/pyxis/README.md).

The lab has no container registry, so the harness
  1. unpacks tests/ from the pinned tarball (lcm_lock.artifacts.pyxis, sha256 checked against the lock),
  2. rewrites the copy in a few documented ways (REWRITES: registry images -> one local squashfs image,
     `enroot import docker://...` -> a copy of it, probes of "the host" -> the compute node, ...),
  3. selects every upstream @test explicitly (TABLE: run, with the users it runs as, or skipped, with the
     reason); a test the table does not know, or a table row the tarball does not have, is an error,
  4. runs the selected tests with `bats --tap --filter` inside lab-ctl, in a one-node allocation per file,
     as root and (a subset) as lcm-user, in two lanes (one per compute node),
  5. writes docs/results/lab-pyxis-bats/: results.json, README.md and the raw TAP of every run.

  run_bats.py list                 the selection table (offline)
  run_bats.py prepare DIR          unpack + rewrite into DIR/tests (offline; what `run` copies to the lab)
  run_bats.py image [--force]      build the test image from the lab's debootstrap base image
  run_bats.py run                  image (if missing) + bats on lab-ctl + every selected test + report
  run_bats.py report               rebuild results.json and README.md from the saved TAP
"""

from __future__ import annotations

import argparse
import concurrent.futures
import contextlib
import datetime as dt
import json
import math
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from lcm_runner.lock import sha256_file  # the lock tooling's own hash of a file

ROOT = Path(__file__).resolve().parents[2]
LOCK_PATH = ROOT / "versions.lock.yml"
MIRROR = Path(os.environ.get("LCM_LAB_MIRROR") or ROOT.parent / "shared" / "mirror")
RESULTS = ROOT / "docs" / "results" / "lab-pyxis-bats"
SHARED_HOST = Path(os.environ.get("LCM_LAB_DIR", ROOT / ".lab")) / "shared"  # the lab's /shared
CTL = os.environ.get("LCM_LAB_CONTROLLER", "lab-ctl")
LAB_DIR = "/shared/pyxis-bats"  # SHARED_HOST / "pyxis-bats", seen from the lab
IMAGE_NAME = "debian12-minbase.sqsh"
LAB_IMAGE = f"{LAB_DIR}/images/{IMAGE_NAME}"
BASE_IMAGE_REF = "lcm-lab/bookworm-minbase"  # roles/lab: debootstrap --variant=minbase, podman import
USER = "lcm-user"
USER_UID = 2001
USER_HOME = "/home/lcm-user"
NODES = ("lab-node1", "lab-node2")
SRUN_TIMEOUT_S = 120
IMAGE_EPOCH = 1700000000

# What each test's salloc exports for bats (bats-in-alloc.sh). SLURM_OVERLAP=1: Slurm >= 20.11 gives a
# step every CPU and all memory of the job on its node unless --overlap, and upstream's tests run steps
# side by side without it (a background `srun ... sleep 30 &` and a foreground srun); on the lab's Slurm
# 22.05 the second step stays pending (seen: still pending 60 s after the first one ended).
ALLOC_SCRIPT = """#!/bin/bash
# tests/pyxis/run_bats.py: runs inside `salloc -N1 --exclusive --overcommit` on lab-ctl (cwd: a work dir)
# usage: bats-in-alloc.sh TEST_FILE FILTER_REGEX
set -u
export SLURM_OVERLAP=1
export PYXIS_BATS_SRUN_TIMEOUT={srun_timeout}
exec bats --tap --timing --filter "$2" "$1"
"""


class HarnessError(Exception):
    """A selection, rewrite or lab problem: the harness stops and says what."""


# ----------------------------------------------------------------------------------------------------
# The selection table: every @test of the tarball, exactly once.
# ----------------------------------------------------------------------------------------------------

R = ("root",)
RU = ("root", USER)
U = (USER,)


@dataclass(frozen=True)
class Row:
    file: str  # path under tests/
    name: str  # the test's name as bats prints it (the source's \$ unescaped)
    users: tuple[str, ...]  # () = skipped
    reason: str = ""  # why skipped (skipped rows), or what the run shows (optional)
    note: str = ""  # a caveat about the result on the lab

    @property
    def status(self) -> str:
        return "run" if self.users else "skipped"


def run(file: str, name: str, users: tuple[str, ...] = R, reason: str = "", note: str = "") -> Row:
    return Row(file, name, users, reason, note)


def skip(file: str, name: str, reason: str) -> Row:
    assert reason, name
    return Row(file, name, (), reason)


REGISTRY = "pulls {image} from a registry (none is reachable from the lab)"
CONTENT = "asserts the content of {image} ({what}); the lab's only image is a local Debian 12 squashfs"
GPU = "needs NVIDIA GPUs and the nvidia/cuda image (the lab nodes have no GPU)"
MPI = (
    "MPI/PMIx, out of scope here: exercises Slurm's mpi plugins through Enroot's extra hook "
    "50-slurm-pmi.sh, which the lab does not enable (it is only in /usr/local/share/enroot/hooks.d, as "
    "an example)"
)
DIND = "needs the docker:26.1.0-dind-rootless image (its entrypoint and DOCKER_HOST ENV); no registry"
CUDA_ENV = (
    "asserts ENV that the nvidia/cuda image sets (CUDA_VERSION, LD_LIBRARY_PATH); a Debian rootfs squashfs "
    "has no such ENV, so mapping the image would make the assertion meaningless"
)
TWO_IMAGES = (
    "needs two distinguishable images (asserts 'Ubuntu 24.04' vs 'Ubuntu 22.04' in /etc/os-release); "
    "the lab has one local image"
)
SECCOMP_NOTE = (
    "passes vacuously on the lab: the nodes are podman containers whose processes already run under "
    "podman's seccomp filter (Seccomp: 2 at the node's PID 1), with or without Pyxis' filter"
)
TABLE: tuple[Row, ...] = (
    # concurrency.bats
    run("concurrency.bats", "concurrent container creation"),
    run("concurrency.bats", "concurrent container reuse"),
    # docker_image.bats: registry pulls, each asserting that image's release file
    *(
        skip("docker_image.bats", f"Docker Hub ubuntu:{v}", CONTENT.format(image=f"ubuntu:{v}", what=w))
        for v, w in (
            ("12.04", "'Ubuntu precise'"),
            ("14.04", "'Ubuntu 14.04'"),
            ("16.04", "'Ubuntu 16.04'"),
            ("18.04", "'Ubuntu 18.04'"),
            ("20.04", "'Ubuntu 20.04'"),
            ("22.04", "'Ubuntu 22.04'"),
            ("24.04", "'Ubuntu 24.04', then apt-get install tzdata"),
            ("26.04", "'Resolute Raccoon', then /etc/environment + install-info"),
        )
    ),
    skip(
        "docker_image.bats",
        "Docker Hub docker.io/ubuntu:24.04",
        "the point is the docker.io/ and docker.io# registry prefixes; asserts 'Ubuntu 24.04'",
    ),
    *(
        skip("docker_image.bats", f"Docker Hub centos:{v}", CONTENT.format(image=f"centos:{v}", what=w))
        for v, w in (
            ("5", "/etc/redhat-release 5.11"),
            ("6", "/etc/redhat-release 6.10"),
            ("7", "/etc/redhat-release 7.x"),
            ("8", "/etc/redhat-release 8.x"),
        )
    ),
    skip(
        "docker_image.bats",
        "nvcr.io PyTorch 20.02",
        REGISTRY.format(image="nvcr.io#nvidia/pytorch:20.02-py3"),
    ),
    skip(
        "docker_image.bats",
        "nvcr.io PyTorch 22.04",
        REGISTRY.format(image="nvcr.io#nvidia/pytorch:22.04-py3"),
    ),
    skip("docker_image.bats", "gcr.io TensorFlow 2.9", REGISTRY.format(image="gcr.io TensorFlow 2.9")),
    skip("docker_image.bats", "gitlab.com NVIDIA device plugin", REGISTRY.format(image="a gitlab.com image")),
    skip(
        "docker_image.bats",
        "nvcr.io NVIDIA device plugin",
        REGISTRY.format(image="nvcr.io k8s-device-plugin"),
    ),
    run(
        "docker_image.bats",
        "image download must be attempted once",
        reason="asserts that the import fails, and is attempted once: holds without a registry too",
    ),
    skip("docker_image.bats", "docker:// explicit import", REGISTRY.format(image="docker://nvidia/cuda")),
    skip(
        "docker_image.bats",
        "dockerd:// import",
        "needs a Docker daemon on the node (dockerd://) and the nvidia/cuda image",
    ),
    skip(
        "docker_image.bats",
        "Docker Hub rapidsai/devcontainers (zstd layers)",
        "the point is a registry image with zstd layers (rapidsai/devcontainers)",
    ),
    # entrypoint.bats: every test needs a registry image's entrypoint
    skip("entrypoint.bats", "--container-entrypoint: docker:dind", DIND),
    skip(
        "entrypoint.bats",
        "manual execution of entrypoint",
        "asserts the nginx:1.19.1 image's entrypoint scripts and config; no registry",
    ),
    skip("entrypoint.bats", "--container-entrypoint and --container-env", DIND),
    skip(
        "entrypoint.bats",
        "--container-entrypoint-log: nvidia/cuda",
        "asserts the nvidia/cuda image's entrypoint banner (== CUDA ==); no registry",
    ),
    # env.bats
    run("env.bats", "passthrough of environment variable"),
    run("env.bats", "$TERM special case"),
    run("env.bats", "$HOME special case"),
    run("env.bats", "$LANG special case"),
    skip("env.bats", "nvidia/cuda:10.2-base with $NVIDIA_VISIBLE_DEVICES=0", GPU),
    skip("env.bats", "ubuntu:18.04 with $NVIDIA_VISIBLE_DEVICES=all", GPU),
    skip("env.bats", "ubuntu:18.04 with $NVIDIA_DRIVER_CAPABILITIES=utility,compute", GPU),
    skip("env.bats", "--container-env overriding container variable", CUDA_ENV),
    run("env.bats", "--container-env forcing $LANG passthrough"),
    # env_vars.bats
    skip(
        "env_vars.bats",
        "PYXIS_CONTAINER_IMAGE environment variable",
        CONTENT.format(image="ubuntu:22.04", what="'Ubuntu 22.04' in /etc/os-release"),
    ),
    skip("env_vars.bats", "PYXIS_CONTAINER_IMAGE: command line precedence", TWO_IMAGES),
    run("env_vars.bats", "PYXIS_CONTAINER_MOUNTS environment variable"),
    run("env_vars.bats", "PYXIS_CONTAINER_MOUNTS: command line precedence"),
    run("env_vars.bats", "PYXIS_CONTAINER_WORKDIR environment variable"),
    run("env_vars.bats", "PYXIS_CONTAINER_WORKDIR: command line precedence"),
    run("env_vars.bats", "PYXIS_CONTAINER_NAME environment variable", reason="apt-get from deb.debian.org"),
    run(
        "env_vars.bats", "PYXIS_CONTAINER_NAME: command line precedence", reason="apt-get from deb.debian.org"
    ),
    run("env_vars.bats", "PYXIS_CONTAINER_SAVE environment variable"),
    run("env_vars.bats", "PYXIS_CONTAINER_SAVE: command line precedence"),
    run("env_vars.bats", "PYXIS_CONTAINER_MOUNT_HOME=1 environment variable", RU),
    run("env_vars.bats", "PYXIS_CONTAINER_MOUNT_HOME=0 environment variable", RU),
    run("env_vars.bats", "PYXIS_CONTAINER_MOUNT_HOME: command line precedence"),
    run("env_vars.bats", "PYXIS_CONTAINER_REMAP_ROOT=1 environment variable", RU),
    run("env_vars.bats", "PYXIS_CONTAINER_REMAP_ROOT=0 environment variable", RU),
    run("env_vars.bats", "PYXIS_CONTAINER_REMAP_ROOT: command line precedence", RU),
    skip("env_vars.bats", "PYXIS_CONTAINER_ENTRYPOINT=1 environment variable", DIND),
    skip("env_vars.bats", "PYXIS_CONTAINER_ENTRYPOINT=0 environment variable", DIND),
    skip("env_vars.bats", "PYXIS_CONTAINER_ENTRYPOINT: command line precedence", DIND),
    skip(
        "env_vars.bats",
        "PYXIS_CONTAINER_ENTRYPOINT_LOG=1 environment variable",
        "asserts the nvidia/cuda image's entrypoint banner (== CUDA ==); no registry",
    ),
    skip(
        "env_vars.bats",
        "PYXIS_CONTAINER_ENTRYPOINT_LOG=0 environment variable",
        "needs the nvidia/cuda image's entrypoint (its banner is what is asserted absent); no registry",
    ),
    run("env_vars.bats", "PYXIS_CONTAINER_WRITABLE=1 environment variable"),
    run("env_vars.bats", "PYXIS_CONTAINER_WRITABLE=0 environment variable"),
    run("env_vars.bats", "PYXIS_CONTAINER_WRITABLE: command line precedence"),
    run("env_vars.bats", "PYXIS_CONTAINER_READONLY=1 environment variable"),
    run("env_vars.bats", "PYXIS_CONTAINER_READONLY=0 environment variable"),
    run("env_vars.bats", "PYXIS_CONTAINER_READONLY: command line precedence"),
    skip("env_vars.bats", "PYXIS_CONTAINER_ENV environment variable", CUDA_ENV),
    skip("env_vars.bats", "PYXIS_CONTAINER_ENV: command line precedence", CUDA_ENV),
    # exec.bats
    run("exec.bats", "enroot exec", RU),
    run("exec.bats", "attach to running container"),
    run("exec.bats", "attach to running unnamed container"),
    run(
        "exec.bats",
        "attach to running container after directory change",
        RU,
        reason="also as lcm-user: the expected / depends on $HOME not existing in the image",
    ),
    run("exec.bats", "attach to running container with --container--mounts"),
    run("exec.bats", "--container-name exec flag on stopped container"),
    run("exec.bats", "--container-name no_exec flag on running container"),
    # invalid_args.bats: every one (the images are mapped; each asserts a failure)
    *(
        run("invalid_args.bats", f"invalid arg: {n}")
        for n in (
            "--container-image= (without argument)",
            "--container-image=<very long invalid image name>",
            "--container-image=./",
            "--container-image=/dev/urandom",
            "--container-name without --container-image",
            "--container-name=/tmp/foo",
            "--container-name=:exec",
            "--container-name=<very long name>",
            "--container-mounts= (without argument)",
            "--container-mounts=:",
            "--container-mounts=/tmp:",
            "--container-workdir= (without argument)",
            "--container-readonly --container-writable",
            "--container-env= (without argument)",
            "--container-env trailing comma",
            "--container-save=<directory>",
        )
    ),
    # mount_home.bats
    run("mount_home.bats", "--container-mount-home --container-remap-root", RU),
    run("mount_home.bats", "--container-mount-home --no-container-remap-root", RU),
    run("mount_home.bats", "--no-container-mount-home --container-remap-root", RU),
    run("mount_home.bats", "--no-container-mount-home --no-container-remap-root", RU),
    # mounts.bats
    run("mounts.bats", "--container-mounts absolute directory", RU),
    run("mounts.bats", "--container-mounts regular file"),
    run("mounts.bats", "--container-mounts character device file"),
    run("mounts.bats", "--container-mounts current working directory"),
    run("mounts.bats", "--container-mounts multiple entries"),
    run(
        "mounts.bats",
        "--container-mounts /etc/shadow",
        U,
        reason="the test skips itself as root; run as lcm-user only",
    ),
    run("mounts.bats", "--container-mounts read-only directory", RU),
    run("mounts.bats", "--container-mounts multiple flags: unbindable+ro"),
    run("mounts.bats", "--container-mounts path escape attempt"),
    run("mounts.bats", "--container-mounts short-form"),
    run("mounts.bats", "--container-mounts tmpfs"),
    run("mounts.bats", "--container-mounts tmpfs huge pages"),
    run("mounts.bats", "--container-mounts devpts"),
    run("mounts.bats", "--container-mounts invalid target"),
    run("mounts.bats", "--container-mounts space in source path"),
    run("mounts.bats", "--container-mounts space in destination path"),
    run("mounts.bats", "--container-mounts space in source and destination"),
    run("mounts.bats", "--container-mounts non-existent source path"),
    run("mounts.bats", "--container-mounts non-existent source with valid mount"),
    run("mounts.bats", "--container-mounts umount"),
    # mpi.bats, mpi4py.bats
    skip("mpi.bats", "PMIx mount", MPI),
    skip("mpi.bats", "PMIx environment variables", MPI),
    skip("mpi.bats", "PMIx Horovod", MPI + "; and needs nvcr.io/nvidia/tensorflow:23.01-tf2-py3"),
    skip("mpi.bats", "PMI2 file descriptor", MPI),
    skip("mpi.bats", "PMI2 environment variables", MPI),
    *(
        skip(
            "mpi4py.bats",
            f"mpi4py: {img}",
            "MPI (Open MPI + mpi4py pip install in the image) over PMIx: " + why,
        )
        for img, why in (
            ("ubuntu:20.04", "asserts an Ubuntu image's MPI stack"),
            ("ubuntu:22.04", "asserts an Ubuntu image's MPI stack"),
            ("ubuntu:24.04", "asserts an Ubuntu image's MPI stack"),
            ("ubuntu:26.04", "asserts an Ubuntu image's MPI stack"),
            ("nvcr.io/nvidia/pytorch:26.02-py3", "needs a PyTorch NGC image from nvcr.io"),
            ("nvcr.io/nvidia/pytorch:26.03-py3", "needs a PyTorch NGC image from nvcr.io"),
        )
    ),
    # name.bats
    run("name.bats", "unnamed container cleanup"),
    run("name.bats", "named container persistence", reason="apt-get from deb.debian.org"),
    run("name.bats", "named container manual remove", reason="apt-get from deb.debian.org"),
    run("name.bats", "--container-name create flag"),
    run("name.bats", "container cleanup after job cancellation"),
    # path.bats
    skip("path.bats", "redis-server PATH resolution", "needs the redis:5.0.8 image (a binary only in it)"),
    skip("path.bats", "rabbitmq PATH resolution", "needs the rabbitmq:3.8.3 image (a binary only in it)"),
    # pytorch.bats
    skip(
        "pytorch.bats",
        "nvcr.io PyTorch environment variables",
        "needs nvcr.io#nvidia/pytorch:20.02-py3 and Enroot's 50-slurm-pytorch.sh hook (not enabled in "
        "the lab)",
    ),
    skip(
        "pytorch.bats",
        "Docker Hub PyTorch environment variables",
        "needs pytorch/pytorch from Docker Hub and Enroot's 50-slurm-pytorch.sh hook (not enabled in "
        "the lab)",
    ),
    # remap_root.bats
    run("remap_root.bats", "--container-remap-root uid map", RU),
    run("remap_root.bats", "--no-container-remap-root uid map", RU),
    run("remap_root.bats", "--container-remap-root seccomp", RU, note=SECCOMP_NOTE),
    run("remap_root.bats", "--no-container-remap-root seccomp", RU, note=SECCOMP_NOTE),
    run("remap_root.bats", "apt-get install file", RU, reason="apt-get from deb.debian.org"),
    run("remap_root.bats", "apt-get install emacs-nox", reason="apt-get from deb.debian.org"),
    skip("remap_root.bats", "yum install file", "needs an RPM-based image (almalinux:9) from a registry"),
    skip(
        "remap_root.bats", "yum install emacs-nox", "needs an RPM-based image (almalinux:9) from a registry"
    ),
    # squashfs_image.bats
    skip(
        "squashfs_image.bats",
        "Ubuntu 24.04 squashfs",
        CONTENT.format(image="ubuntu:24.04", what="'Ubuntu 24.04' in /etc/os-release"),
    ),
    run("squashfs_image.bats", "import - export - import", RU, reason="apt-get from deb.debian.org"),
    run("squashfs_image.bats", "--container-save absolute path", reason="apt-get from deb.debian.org"),
    run("squashfs_image.bats", "--container-save relative path", reason="apt-get from deb.debian.org"),
    run("squashfs_image.bats", "squashfs with --container-writable", RU),
    run("squashfs_image.bats", "squashfs with --container-mounts"),
    run("squashfs_image.bats", "squashfs with --container-workdir"),
    run("squashfs_image.bats", "squashfs with --no-container-remap-root", RU),
    run("squashfs_image.bats", "squashfs with multiple tasks"),
    run("squashfs_image.bats", "squashfs concurrent access"),
    run("squashfs_image.bats", "squashfs container cleanup"),
    run("squashfs_image.bats", "squashfs nonexistent file"),
    # ssh.bats
    skip("ssh.bats", "ssh to container running sshd", "sshd in the container (out of scope here)"),
    skip("ssh.bats", "attach to container running sshd", "sshd in the container (out of scope here)"),
    # unshare*.bats
    run("unshare.bats", "--container-unshare=foo"),
    run("unshare.bats", "--container-unshare=net,foo"),
    run("unshare.bats", "--container-unshare=net,ipc,uts unshares all three", RU),
    run("unshare.bats", "PYXIS_CONTAINER_UNSHARE=net env var"),
    *(
        run(f"unshare_{ns}.bats", n.format(ns=ns))
        for ns in ("ipc", "net")
        for n in (
            "--container-unshare={ns} creates new {ns}ns",
            "--container-unshare={ns}: multiple tasks",
        )
    ),
    run("unshare_ipc.bats", "--container-unshare=ipc isolates SysV shared memory"),
    run("unshare_ipc.bats", "--container-unshare=ipc uses private /dev, /dev/shm and /dev/mqueue"),
    run("unshare_net.bats", "--container-unshare=net loopback check"),
    run("unshare_net.bats", "--container-unshare=net external network check"),
    run("unshare_uts.bats", "--container-unshare=uts creates new utsns"),
    run("unshare_uts.bats", "--container-unshare=uts: multiple tasks"),
    run("unshare_uts.bats", "--container-unshare=uts isolates sethostname"),
    *(
        run(f"unshare_{ns}.bats", n.format(ns=ns, up=up))
        for ns, up in (("ipc", "IPC"), ("net", "network"), ("uts", "UTS"))
        for n in (
            "no --container-unshare shares host {ns}ns",
            "--container-name joins existing {ns}ns container",
            "--container-unshare={ns} on existing container without {ns}ns",
        )
    ),
    # workdir.bats
    run("workdir.bats", "--container-workdir absolute target"),
    run("workdir.bats", "--container-workdir path escape attempt"),
    run("workdir.bats", "--container-workdir target doesn't exist"),
    skip(
        "workdir.bats",
        "container image workdir",
        "asserts the WORKDIR of nvcr.io#nvidia/pytorch:20.02-py3 (/workspace); no registry",
    ),
    # writable.bats
    run("writable.bats", "--container-readonly", RU),
    run("writable.bats", "--container-writable", RU),
    # sbatch/sbatch.bats
    skip(
        "sbatch/sbatch.bats",
        "sbatch ubuntu:16.04",
        CONTENT.format(image="ubuntu:16.04", what="'Ubuntu 16.04' in /etc/os-release"),
    ),
    skip(
        "sbatch/sbatch.bats",
        "sbatch centos:8",
        CONTENT.format(image="centos:8", what="/etc/redhat-release 8.x"),
    ),
)

# Diagnoses of the failures seen on the lab, (file, name, user) -> text, printed with the output.
UNSHARE_DIAG = (
    "Version mismatch in the lock, not a lab artifact: Pyxis 0.24.0's --container-unshare only asks "
    "Enroot for the namespaces (it exports ENROOT_UNSHARE_NET/IPC/UTS=y, pyxis_slurmstepd.c) and then "
    "checks that the started container has them; the lab's Enroot 4.1.2 does not implement these "
    "variables (none of them is in the pinned enroot-4.1.2 source), so the container keeps the node's "
    "namespaces and Pyxis fails the step ('--container-unshare=... requested but the container is not "
    "in a separate ... namespace'). It fails the same on real nodes with this Enroot. The negative "
    "tests (no --container-unshare shares the node's namespace; --container-unshare on an existing "
    "container without the namespace is refused) pass."
)
HOME_DIAG = (
    "Lab artifact, root only: --container-mount-home makes Enroot's 10-home.sh hook bind-mount $HOME "
    "(/root for root) without MS_REC ('bind'); on the lab nodes /root has a submount (roles/lab "
    "bind-mounts the SSH key onto /root/.ssh/authorized_keys), and inside Enroot's user namespace the "
    "kernel refuses a non-recursive bind of a tree with locked submounts with EINVAL ('enroot-mount: "
    "failed to mount: /root at .../root: Invalid argument'). As lcm-user (HOME /home/lcm-user, no "
    "submount) the mount-home tests pass; nodes without a mount below /root are not affected."
)
CWD_DIAG = (
    "Not a lab artifact: with Enroot 4.1.2 the container process Pyxis starts begins in $HOME (the "
    "10-shadow.sh hook creates the user's home in the rootfs when missing, CREATE_HOME defaulting to "
    "yes, and enroot-switchroot chdir()s to $HOME); on attach Pyxis joins that process' cwd "
    "(container_get_cwd: /proc/<pid>/cwd), so pwd prints /root as root and /home/lcm-user as "
    "lcm-user, not the / the test expects. Which Enroot version or setup upstream's expectation "
    "assumes is not verified here."
)
DIAGNOSES: dict[tuple[str, str, str], str] = {
    **{
        (f, n, u): UNSHARE_DIAG
        for f, n, u in (
            ("unshare.bats", "--container-unshare=net,ipc,uts unshares all three", "root"),
            ("unshare.bats", "--container-unshare=net,ipc,uts unshares all three", USER),
            ("unshare.bats", "PYXIS_CONTAINER_UNSHARE=net env var", "root"),
            *(
                (f"unshare_{ns}.bats", n.format(ns=ns), "root")
                for ns in ("ipc", "net", "uts")
                for n in (
                    "--container-unshare={ns} creates new {ns}ns",
                    "--container-unshare={ns}: multiple tasks",
                    "--container-name joins existing {ns}ns container",
                )
            ),
            ("unshare_ipc.bats", "--container-unshare=ipc isolates SysV shared memory", "root"),
            (
                "unshare_ipc.bats",
                "--container-unshare=ipc uses private /dev, /dev/shm and /dev/mqueue",
                "root",
            ),
            ("unshare_net.bats", "--container-unshare=net loopback check", "root"),
            ("unshare_net.bats", "--container-unshare=net external network check", "root"),
            ("unshare_uts.bats", "--container-unshare=uts isolates sethostname", "root"),
        )
    },
    **{
        (f, n, "root"): HOME_DIAG
        for f, n in (
            ("mount_home.bats", "--container-mount-home --container-remap-root"),
            ("mount_home.bats", "--container-mount-home --no-container-remap-root"),
            ("env_vars.bats", "PYXIS_CONTAINER_MOUNT_HOME=1 environment variable"),
            ("mounts.bats", "--container-mounts umount"),
        )
    },
    ("exec.bats", "attach to running container after directory change", "root"): CWD_DIAG,
    ("exec.bats", "attach to running container after directory change", USER): CWD_DIAG,
}


# ----------------------------------------------------------------------------------------------------
# Rewrites: the only changes made to the upstream tests.
# ----------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Rewrite:
    id: str
    pattern: str  # a Python regex, applied to every line that is not an @test line
    replacement: str  # {image} is the local image
    why: str
    expect: dict[str, int] | None  # file -> exact number of replacements; None: any files, any count

    def regex(self) -> re.Pattern[str]:
        return re.compile(self.pattern)


REWRITES: tuple[Rewrite, ...] = (
    Rewrite(
        "import",
        r"run_enroot import -o (\S+) docker://ubuntu:\d\d\.\d\d\b",
        r"cp -f {image} \1",
        "the squashfs tests make their image with `enroot import docker://ubuntu:24.04` (a registry pull); "
        "a copy of the local image gives them the same kind of file",
        {"squashfs_image.bats": 9},
    ),
    Rewrite(
        "image",
        r"(?<![\w./#:-])(?:docker\.io[/#])?ubuntu(?::\d\d\.\d\d)?(?![\w.:/#-])",
        "{image}",
        "every image reference ubuntu[:NN.NN] (also docker.io/ubuntu, docker.io#ubuntu) becomes the local "
        "squashfs image; tests whose assertions depend on the Ubuntu image itself are skipped (TABLE)",
        None,
    ),
    Rewrite(
        "host-probe",
        r"\b(host_\w+|before|after)=(\"?)"
        r"\$\((readlink /proc/self/ns/\w+|hostname|ipcs -m|stat -c %d /dev[\w/]*)\)",
        r"\1=\2$(srun -N1 --overlap \3)",
        "the tests compare the container with 'the host' by running the probe where bats runs; upstream "
        "runs bats on the compute node, the lab runs it on lab-ctl (its own podman container: other "
        "net/ipc/uts namespaces, no enroot), so the probe runs on the allocated node through srun",
        {"unshare.bats": 4, "unshare_ipc.bats": 9, "unshare_net.bats": 4, "unshare_uts.bats": 5},
    ),
    Rewrite(
        "host-probe-inline",
        r"\"\$\((hostname|enroot list)\b",
        r'"$(srun -N1 --overlap \1',
        'as host-probe, for the two probes used inline ([ "$(hostname)" == ... ], '
        'while [ "$(enroot list | grep -c ...)" ... ])',
        {"unshare_uts.bats": 1, "name.bats": 1},
    ),
    Rewrite(
        "shared-tmp",
        r"/tmp/pyxis test dir",
        "${PWD}/pyxis test dir",
        "the test creates the mount source in /tmp where bats runs (lab-ctl), then mounts it on the node; "
        "it is created in the work dir under /shared instead (still a path with a space)",
        {"mounts.bats": 8},
    ),
    Rewrite(
        "step-lines",
        r"\$\{lines\[2\]\}",
        "${lines[-2]}",
        "the job and step ids are the last two output lines; upstream's lines[2] and lines[3] count the two "
        "'pyxis: importing/imported docker image' lines that only a registry image prints",
        {"name.bats": 1},
    ),
    Rewrite(
        "step-lines-2",
        r"\$\{lines\[3\]\}",
        "${lines[-1]}",
        "as step-lines, for the step id (lines[3] -> lines[-1])",
        {"name.bats": 1},
    ),
)

# Appended to common.bash (every test file loads it): every srun the tests run is bounded.
SRUN_WRAPPER = """
# --- tests/pyxis/run_bats.py (lcm-infra): bound every srun of the tests on the lab ---
function srun() {
    timeout "${PYXIS_BATS_SRUN_TIMEOUT:-120}" srun "$@"
}
"""

BATS_TEST_RE = re.compile(r"^[ \t]*@test[ \t]+(.*[^ \t])[ \t]+\{(.*)$")
# image arguments a selected test may still carry after the rewrites: paths, variables, empty
_IMAGE_ARG_RE = re.compile(r"(--container-image[= ]|PYXIS_CONTAINER_IMAGE=|docker://|dockerd://)(\S*)")
_INTENDED_BAD_IMAGES = {"thisimagedoesntexist"}


@dataclass(frozen=True)
class BatsTest:
    file: str  # path under tests/
    raw: str  # the name as written between the quotes (what --filter matches)
    name: str  # as bats prints it
    line: int
    body: str


def display_name(raw: str) -> str:
    """The name bats prints: the @test string evaluated in double quotes (\\$ \\` \\" \\\\ unescaped)."""
    return re.sub(r"\\([$`\"\\])", r"\1", raw)


def discover(tests_dir: Path) -> list[BatsTest]:
    """Every @test of every *.bats under tests_dir, in file order (bats' own parsing of the line)."""
    found: list[BatsTest] = []
    for path in sorted(tests_dir.rglob("*.bats")):
        rel = path.relative_to(tests_dir).as_posix()
        lines = path.read_text(encoding="utf-8").splitlines()
        for i, line in enumerate(lines):
            m = BATS_TEST_RE.match(line)
            if not m:
                continue
            raw = m.group(1)
            if raw[:1] in "\"'":
                raw = raw[1:]
            if raw[-1:] in "\"'":
                raw = raw[:-1]
            body: list[str] = []
            for nxt in lines[i + 1 :]:
                if re.match(r"^\}\s*$", nxt):
                    break
                body.append(nxt)
            found.append(BatsTest(rel, raw, display_name(raw), i + 1, "\n".join(body)))
    return found


def table_index() -> dict[tuple[str, str], Row]:
    index: dict[tuple[str, str], Row] = {}
    dupes = []
    for r in TABLE:
        if (r.file, r.name) in index:
            dupes.append(f"{r.file}: {r.name}")
        index[(r.file, r.name)] = r
    if dupes:
        raise HarnessError("TABLE lists these tests more than once: " + "; ".join(dupes))
    return index


def classify(tests: Sequence[BatsTest]) -> list[tuple[BatsTest, Row]]:
    """Each discovered test with its TABLE row; any test without a row, or row without a test, is an error."""
    index = table_index()
    seen: set[tuple[str, str]] = set()
    out: list[tuple[BatsTest, Row]] = []
    unknown: list[str] = []
    for t in tests:
        key = (t.file, t.name)
        if key in seen:
            raise HarnessError(f"{t.file}: two tests named {t.name!r}")
        seen.add(key)
        row = index.get(key)
        if row is None:
            unknown.append(f"{t.file}:{t.line}: {t.name}")
        else:
            out.append((t, row))
    stale = [f"{f}: {n}" for (f, n) in index if (f, n) not in seen]
    problems = []
    if unknown:
        problems.append(
            "tests not in the harness' TABLE (classify them: run or skipped): " + "; ".join(unknown)
        )
    if stale:
        problems.append("TABLE rows with no such test in the tarball: " + "; ".join(stale))
    if problems:
        raise HarnessError("\n".join(problems))
    return out


def rewrite_text(file: str, text: str, image: str) -> tuple[str, dict[str, int]]:
    """The rewritten file and the number of replacements per rewrite id (only REWRITES change anything)."""
    counts: dict[str, int] = {}
    out: list[str] = []
    for line in text.splitlines(keepends=True):
        if not BATS_TEST_RE.match(line):  # test names stay as upstream wrote them
            for rw in REWRITES:
                if rw.expect is not None and file not in rw.expect:
                    continue
                repl = rw.replacement.replace("{image}", image)
                line, n = rw.regex().subn(lambda m, r=repl: m.expand(r), line)
                if n:
                    counts[rw.id] = counts.get(rw.id, 0) + n
        out.append(line)
    return "".join(out), counts


def check_counts(file: str, counts: dict[str, int]) -> None:
    for rw in REWRITES:
        if rw.expect is None or file not in rw.expect:
            continue
        got = counts.get(rw.id, 0)
        if got != rw.expect[file]:
            raise HarnessError(
                f"rewrite {rw.id!r} replaced {got} times in {file}, expected {rw.expect[file]}: the upstream "
                "test changed; re-check the rewrite"
            )


def leftover_images(body: str) -> list[str]:
    """Image arguments in a (rewritten) test body that would need a registry."""
    bad = []
    for m in _IMAGE_ARG_RE.finditer(body):
        kind, value = m.group(1), m.group(2)
        if kind.startswith("docker") or (
            value and value[0] not in "/.$\"'" and value not in _INTENDED_BAD_IMAGES
        ):
            bad.append(kind + value)
    return bad


def rewrite_tree(tests_dir: Path, image: str) -> dict[str, dict[str, int]]:
    """Rewrite every .bats and append the srun wrapper to common.bash; returns per-file counts."""
    per_file: dict[str, dict[str, int]] = {}
    for path in sorted(tests_dir.rglob("*.bats")):
        rel = path.relative_to(tests_dir).as_posix()
        text, counts = rewrite_text(rel, path.read_text(encoding="utf-8"), image)
        check_counts(rel, counts)
        path.write_text(text, encoding="utf-8")
        per_file[rel] = counts
    missing = [
        f"{rw.id}: {f}" for rw in REWRITES if rw.expect for f in rw.expect if not (tests_dir / f).is_file()
    ]
    if missing:
        raise HarnessError("rewrites name files the tarball does not have: " + "; ".join(missing))
    common = tests_dir / "common.bash"
    if "function run_srun()" not in common.read_text(encoding="utf-8"):
        raise HarnessError(f"{common}: no run_srun(): the upstream helper changed")
    with common.open("a", encoding="utf-8") as fh:
        fh.write(SRUN_WRAPPER)
    return per_file


def rewrites_in(body: str, file: str) -> list[str]:
    """The rewrite ids that change this test body (for the report)."""
    ids = []
    for rw in REWRITES:
        if rw.expect is not None and file not in rw.expect:
            continue
        if rw.regex().search(body):
            ids.append(rw.id)
    return ids


def ere_escape(s: str) -> str:
    return re.sub(r"([\\.\[\](){}*+?|^$])", r"\\\1", s)


def filter_regex(raws: Iterable[str]) -> str:
    """bats --filter: bash [[ =~ ]] (POSIX ERE) against each raw @test name; exact names only."""
    return "^(" + "|".join(ere_escape(r) for r in raws) + ")$"


# ----------------------------------------------------------------------------------------------------
# Tarball and lock
# ----------------------------------------------------------------------------------------------------


def load_lock(path: Path = LOCK_PATH) -> dict[str, Any]:
    """The lock as the roles see it on the lab's nodes (their release: LAB_RELEASE, default bookworm)."""
    from lcm_runner.lock import release_lock

    data = yaml.safe_load(path.read_text(encoding="utf-8"))
    return release_lock(data["lcm_lock"], os.environ.get("LAB_RELEASE", "bookworm"))


def pyxis_tarball(lock: dict[str, Any], mirror: Path = MIRROR) -> tuple[Path, dict[str, Any]]:
    art = lock["artifacts"]["pyxis"]
    path = mirror / art["filename"]
    if not path.is_file():
        raise HarnessError(f"{path}: not found (the offline mirror, lcm_lock.artifacts.pyxis.filename)")
    got = sha256_file(path)
    if got != art["sha256"]:
        raise HarnessError(
            f"{path}: sha256 {got}, the lock (lcm_lock.artifacts.pyxis.sha256) has {art['sha256']}"
        )
    return path, art


def extract_tests(tarball: Path, version: str, dest: Path) -> Path:
    """Copy tests/ of the tarball (top directory pyxis-<version>/) to dest/tests."""
    prefix = f"pyxis-{version}/tests/"
    out = dest / "tests"
    if out.exists():
        shutil.rmtree(out)
    with tarfile.open(tarball) as tf:
        members = [m for m in tf.getmembers() if m.name.startswith(prefix) and (m.isfile() or m.isdir())]
        if not any(m.name.endswith(".bats") for m in members):
            raise HarnessError(f"{tarball}: no {prefix}*.bats")
        for m in members:
            rel = m.name[len(prefix) :]
            if not rel:
                continue
            target = out / rel
            if m.isdir():
                target.mkdir(parents=True, exist_ok=True)
                continue
            target.parent.mkdir(parents=True, exist_ok=True)
            src = tf.extractfile(m)
            assert src is not None
            target.write_bytes(src.read())
            target.chmod(0o644)
    return out


@dataclass
class Prepared:
    tests_dir: Path
    tarball: Path
    version: str
    sha256: str
    selection: list[tuple[BatsTest, Row]]  # the upstream (not rewritten) tests
    rewritten: dict[tuple[str, str], BatsTest]
    counts: dict[str, dict[str, int]]


def prepare(
    dest: Path, image: str = LAB_IMAGE, lock: dict[str, Any] | None = None, mirror: Path = MIRROR
) -> Prepared:
    lock = lock if lock is not None else load_lock()
    tarball, art = pyxis_tarball(lock, mirror)
    tests_dir = extract_tests(tarball, art["version"], dest)
    selection = classify(discover(tests_dir))
    counts = rewrite_tree(tests_dir, image)
    rewritten = {(t.file, t.name): t for t in discover(tests_dir)}
    bad = []
    for t, row in selection:
        if row.users:
            left = leftover_images(rewritten[(t.file, t.name)].body)
            if left:
                bad.append(f"{t.file}: {t.name}: {', '.join(left)}")
    if bad:
        raise HarnessError("selected tests still need a registry after the rewrites: " + "; ".join(bad))
    return Prepared(tests_dir, tarball, art["version"], art["sha256"], selection, rewritten, counts)


# ----------------------------------------------------------------------------------------------------
# The test image
# ----------------------------------------------------------------------------------------------------

# Removed from the lab's debootstrap minbase before mksquashfs: device nodes (the nodes lack CAP_MKNOD, so
# unsquashfs of a /dev with nodes fails there; Enroot mounts /dev anyway), docs, apt caches and lists (the
# tests that install run apt-get update), and files Enroot bind-mounts from the node.
IMAGE_TRIM = (
    "dev/*",
    "usr/share/doc/*",
    "usr/share/man/*",
    "usr/share/info/*",
    "usr/share/locale/*",
    "var/cache/apt/*",
    "var/lib/apt/lists/*",
    "etc/resolv.conf",
    "etc/hostname",
)


def _run(argv: Sequence[str], timeout: float = 600, **kw: Any) -> subprocess.CompletedProcess[str]:
    return subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout, check=False, **kw)


def _must(argv: Sequence[str], timeout: float = 600, **kw: Any) -> str:
    proc = _run(argv, timeout=timeout, **kw)
    if proc.returncode != 0:
        raise HarnessError(
            f"{' '.join(argv)}: rc={proc.returncode}\n{proc.stdout[-2000:]}{proc.stderr[-2000:]}"
        )
    return proc.stdout


def mksquashfs_tool() -> str:
    found = shutil.which("mksquashfs")
    if found:
        return found
    local = ROOT / ".cache" / "tools" / "bin" / "mksquashfs"  # scripts/bootstrap unpacks squashfs-tools
    if local.is_file():
        return str(local)
    raise HarnessError("mksquashfs not found (scripts/bootstrap unpacks it to .cache/tools/bin)")


def base_image_ref() -> str:
    out = _must(
        [
            "podman",
            "images",
            "--format",
            "{{.Repository}}:{{.Tag}}",
            "--filter",
            f"reference=*/{BASE_IMAGE_REF}",
        ]
    )
    refs = [r for r in out.split() if r and "<none>" not in r]
    if not refs:
        raise HarnessError(f"no podman image */{BASE_IMAGE_REF} (roles/lab builds it: scripts/lab up)")
    return refs[0]


def build_image(out: Path, ref: str | None = None) -> dict[str, Any]:
    """debootstrap minbase of the lab (podman image) -> trimmed rootfs -> lz4 squashfs at out."""
    ref = ref or base_image_ref()
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="pyxis-bats-image.", dir="/var/tmp") as tmp:
        archive = Path(tmp) / "base.tar"
        _must(["podman", "save", "--format", "docker-archive", "-o", str(archive), ref])
        with tarfile.open(archive) as tf:
            manifest = json.load(tf.extractfile("manifest.json"))  # type: ignore[arg-type]
        layers = manifest[0]["Layers"]
        if len(layers) != 1:
            raise HarnessError(f"{ref}: {len(layers)} layers; expected the single layer of a podman import")
        rootfs = Path(tmp) / "rootfs"
        rootfs.mkdir()
        _must(
            [
                "bash",
                "-c",
                'set -o pipefail; tar -xOf "$1" "$2" | tar -C "$3" -xpf - --numeric-owner',
                "_",
                str(archive),
                layers[0],
                str(rootfs),
            ]
        )
        archive.unlink()
        for pattern in IMAGE_TRIM:
            for p in rootfs.glob(pattern):
                if p.is_dir() and not p.is_symlink():
                    if pattern == "var/lib/apt/lists/*":
                        continue  # keep lists/partial
                    shutil.rmtree(p)
                else:
                    p.unlink()
        rootfs.chmod(0o755)
        files = sum(1 for _ in rootfs.rglob("*"))
        tmp_out = out.with_suffix(".tmp")
        _must([
            mksquashfs_tool(), str(rootfs), str(tmp_out), "-noappend", "-comp", "lz4", "-no-xattrs",
            "-all-time", str(IMAGE_EPOCH), "-mkfs-time", str(IMAGE_EPOCH), "-quiet", "-no-progress",
        ])  # fmt: skip
        tmp_out.replace(out)
    image_id = _must(["podman", "image", "inspect", "--format", "{{.Id}}", ref]).strip()
    info = {
        "image": f"{LAB_DIR}/images/{out.name}",
        "source": f"podman image {ref} (id {image_id[:12]}): roles/lab's debootstrap --variant=minbase "
        "bookworm",
        "trimmed": list(IMAGE_TRIM),
        "compression": "lz4",
        "sha256": sha256_file(out),
        "bytes": out.stat().st_size,
        "files": files,
        "built": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
    }
    out.with_suffix(".json").write_text(json.dumps(info, indent=2) + "\n", encoding="utf-8")
    return info


# ----------------------------------------------------------------------------------------------------
# TAP
# ----------------------------------------------------------------------------------------------------

# bats --tap --timing (1.8): "ok 1 name in 12ms", "not ok 2 name in 5ms", "ok 3 name # skip why"
# (its tap formatter writes "# in 12 ms" instead: both are read)
_TAP_RE = re.compile(r"^(ok|not ok) (\d+) (.*?)(?: # in (\d+) ms| in (\d+)ms)?$")
_TAP_SKIP_RE = re.compile(r"^ok (\d+) (.*?)(?: in \d+ms)? # skip(?: (.*))?$")


@dataclass
class TapResult:
    name: str
    status: str  # passed | failed | skipped
    ms: int | None
    skip_reason: str = ""
    output: list[str] = field(default_factory=list)


def parse_tap(text: str) -> list[TapResult]:
    results: list[TapResult] = []
    for line in text.splitlines():
        skipped = _TAP_SKIP_RE.match(line)
        m = _TAP_RE.match(line)
        if skipped:
            results.append(TapResult(skipped.group(2), "skipped", None, skipped.group(3) or ""))
        elif m:
            ok, _, name, ms1, ms2 = m.groups()
            ms = ms1 or ms2
            results.append(TapResult(name, "passed" if ok == "ok" else "failed", int(ms) if ms else None))
        elif (line.startswith("# ") or line == "#") and results:
            results[-1].output.append(line[2:])
    return results


# ----------------------------------------------------------------------------------------------------
# Running on the lab
# ----------------------------------------------------------------------------------------------------


@dataclass
class Job:
    file: str
    user: str
    tests: list[BatsTest]  # rewritten bodies
    estimate_s: float
    lane: int = 0

    @property
    def key(self) -> str:
        return f"{self.user}/{self.file.replace('/', '__')}"


_SLEEP_RE = re.compile(r"\bsleep\s+\"?(\d+(?:\.\d+)?)s?\b")
_STEP_RE = re.compile(r"\b(?:run_srun_unchecked|run_srun|run_enroot|srun)\b")


def estimate(t: BatsTest) -> float:
    """Rough seconds on the lab: ~1.2 s a step, the sleeps, ~15 s an apt-get update (+60 s for emacs)."""
    s = 1.2 * len(_STEP_RE.findall(t.body)) + sum(float(x) for x in _SLEEP_RE.findall(t.body))
    s += 15.0 * t.body.count("apt-get update") + (60.0 if "emacs" in t.body else 0.0)
    if "{1..50}" in t.body:
        s += 40.0
    return s + 2.0  # setup/teardown cleanup steps


def plan_jobs(prep: Prepared, lanes: int) -> list[Job]:
    jobs: dict[tuple[str, str], Job] = {}
    for t, row in prep.selection:
        for user in row.users:
            rt = prep.rewritten[(t.file, t.name)]
            job = jobs.setdefault((t.file, user), Job(t.file, user, [], 10.0))
            job.tests.append(rt)
            job.estimate_s += estimate(rt)
    ordered = sorted(jobs.values(), key=lambda j: -j.estimate_s)
    load = [0.0] * lanes
    for job in ordered:  # longest first onto the least loaded lane
        job.lane = min(range(lanes), key=lambda i: load[i])
        load[job.lane] += job.estimate_s
    return ordered


def job_timeout(job: Job) -> int:
    return int(min(600, max(180, 3 * job.estimate_s)))


def lab_exec(
    argv: Sequence[str], timeout: float, workdir: str | None = None
) -> subprocess.CompletedProcess[str]:
    cmd = ["podman", "exec"] + (["-w", workdir] if workdir else []) + [CTL, *argv]
    return _run(cmd, timeout=timeout)


def job_argv(job: Job, node: str) -> list[str]:
    t = job_timeout(job)
    salloc = [
        "timeout", str(t), "salloc", "-N1", "-w", node, "--exclusive", "--overcommit",
        f"--time={math.ceil(t / 60) + 1}", "-J", f"pyxis-bats-{job.file}",
        f"{LAB_DIR}/bats-in-alloc.sh", f"tests/{job.file}", filter_regex(x.raw for x in job.tests),
    ]  # fmt: skip
    if job.user == "root":
        return salloc
    env = ["env", f"HOME={USER_HOME}", f"USER={job.user}", f"LOGNAME={job.user}"]
    return ["runuser", "-u", job.user, "--", *env, *salloc]


def workdir(user: str, lane: int) -> str:
    return f"work/{user}-lane{lane}"


def stage(prep: Prepared, users: set[str], lanes: int) -> Path:
    """Copy the rewritten tests to the lab: <stage>/tests (reference) and one work dir per user and lane."""
    base = SHARED_HOST / "pyxis-bats"
    if not SHARED_HOST.is_dir():
        raise HarnessError(f"{SHARED_HOST}: not found (is the lab up?)")
    (base / "images").mkdir(parents=True, exist_ok=True)
    if (base / "work").exists():
        shutil.rmtree(base / "work")
    if (base / "tests").exists():
        shutil.rmtree(base / "tests")
    shutil.copytree(prep.tests_dir, base / "tests")
    script = base / "bats-in-alloc.sh"
    script.write_text(ALLOC_SCRIPT.format(srun_timeout=SRUN_TIMEOUT_S), encoding="utf-8")
    script.chmod(0o755)
    base.chmod(0o755)
    for user in sorted(users):
        for lane in range(lanes):
            wd = base / workdir(user, lane)
            wd.parent.mkdir(parents=True, exist_ok=True)
            wd.parent.chmod(0o755)
            shutil.copytree(prep.tests_dir, wd / "tests")
            if user != "root":
                for p in [wd, *wd.rglob("*")]:
                    os.chown(p, USER_UID, USER_UID)
    return base


def ensure_bats(pin: str) -> str:
    have = lab_exec(["dpkg-query", "-W", "-f", "${Version}", "bats"], timeout=30)
    if have.returncode != 0 or have.stdout.strip() != pin:
        proc = lab_exec(["apt-get", "install", "-y", f"bats={pin}"], timeout=300)
        if proc.returncode != 0:
            raise HarnessError(
                f"apt-get install bats={pin} on {CTL} failed:\n{proc.stdout[-2000:]}{proc.stderr[-2000:]}"
            )
    return lab_exec(["bats", "--version"], timeout=30).stdout.strip()


def lab_facts() -> dict[str, str]:
    facts: dict[str, str] = {}
    for key, host, argv in (
        ("slurm", CTL, ["srun", "--version"]),
        ("enroot", NODES[0], ["enroot", "version"]),
        ("kernel", NODES[0], ["uname", "-r"]),
        ("plugstack", CTL, ["cat", "/etc/slurm/plugstack.conf.d/pyxis.conf"]),
        ("enroot_conf", NODES[0], ["cat", "/etc/enroot/enroot.conf"]),
        (
            "enroot_hooks",
            NODES[0],
            ["bash", "-c", "cd /etc/enroot/hooks.d && for f in *; do [ -x $f ] && echo $f; done"],
        ),
    ):
        proc = _run(["podman", "exec", host, *argv], timeout=30)
        lines = [x for x in proc.stdout.splitlines() if x and not x.startswith("#")]
        facts[key] = "; ".join(lines) if proc.returncode == 0 else f"(rc={proc.returncode})"
    return facts


def run_job(job: Job, node: str, tap_dir: Path) -> dict[str, Any]:
    argv = job_argv(job, node)
    start = time.monotonic()
    try:
        proc = lab_exec(
            argv, timeout=job_timeout(job) + 60, workdir=f"{LAB_DIR}/{workdir(job.user, job.lane)}"
        )
        rc, out, err = proc.returncode, proc.stdout, proc.stderr
    except subprocess.TimeoutExpired as exc:
        rc = 124
        out = exc.stdout.decode() if isinstance(exc.stdout, bytes) else exc.stdout or ""
        err = exc.stderr.decode() if isinstance(exc.stderr, bytes) else exc.stderr or ""
    wall = time.monotonic() - start
    path = tap_dir / f"{job.key}.tap"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(out, encoding="utf-8")
    (tap_dir / f"{job.key}.stderr").write_text(err, encoding="utf-8")
    print(
        f"[lane {job.lane} {node}] {job.user} {job.file}: rc={rc} {wall:.0f}s "
        f"(estimate {job.estimate_s:.0f}s)",
        flush=True,
    )
    return {"file": job.file, "user": job.user, "node": node, "rc": rc, "wall_s": round(wall, 1),
            "tests": len(job.tests), "tap": str(path.relative_to(RESULTS))}  # fmt: skip


def run_lab(lanes: int, only: set[str] | None = None, budget_s: float = 900, user: str | None = None) -> None:
    lock = load_lock()
    if lab_exec(["true"], timeout=30).returncode != 0:
        raise HarnessError(f"podman exec {CTL} true failed: is the lab up?")
    image_host = SHARED_HOST / "pyxis-bats" / "images" / IMAGE_NAME
    if not image_host.is_file():
        print(f"building {image_host} ...", flush=True)
        build_image(image_host)
    image_info = json.loads(image_host.with_suffix(".json").read_text(encoding="utf-8"))
    bats_version = ensure_bats(lock["packages"]["bats"])
    with tempfile.TemporaryDirectory(prefix="pyxis-bats.") as tmp:
        prep = prepare(Path(tmp))
        jobs = [
            j
            for j in plan_jobs(prep, lanes)
            if (only is None or j.file in only) and (user is None or j.user == user)
        ]
        stage(prep, {j.user for j in jobs}, lanes)
    tap_dir = RESULTS / "tap"
    if tap_dir.exists() and only is None and user is None:
        shutil.rmtree(tap_dir)
    started = dt.datetime.now(dt.UTC)
    t0 = time.monotonic()

    def lane_worker(lane: int) -> list[dict[str, Any]]:
        done = []
        for j in (j for j in jobs if j.lane == lane):
            if time.monotonic() - t0 > budget_s:  # no new allocation once the lab time budget is spent
                print(
                    f"[lane {lane}] {j.user} {j.file}: not started, budget of {budget_s:.0f} s spent",
                    flush=True,
                )
                why = f"budget of {budget_s:.0f} s spent"
                done.append({"file": j.file, "user": j.user, "node": NODES[lane], "rc": None, "wall_s": 0,
                             "tests": len(j.tests), "tap": None, "not_started": why})  # fmt: skip
                continue
            done.append(run_job(j, NODES[lane], tap_dir))
        return done

    with concurrent.futures.ThreadPoolExecutor(max_workers=lanes) as pool:
        runs = [r for rs in pool.map(lane_worker, range(lanes)) for r in rs]
    meta = {
        "started": started.isoformat(timespec="seconds"),
        "wall_s": round(time.monotonic() - t0, 1),
        "lanes": {str(i): NODES[i] for i in range(lanes)},
        "pyxis": {"version": prep.version, "tarball": prep.tarball.name, "sha256": prep.sha256},
        "bats": bats_version,
        "image": image_info,
        "lab": lab_facts(),
        "srun_timeout_s": SRUN_TIMEOUT_S,
        "runs": sorted(runs, key=lambda r: (r["user"], r["file"])),
    }
    if (only is not None or user is not None) and (RESULTS / "meta.json").is_file():
        old = json.loads((RESULTS / "meta.json").read_text(encoding="utf-8"))
        new = {(r["user"], r["file"]) for r in meta["runs"]}
        keep = [r for r in old["runs"] if (r["user"], r["file"]) not in new]
        rerun = {
            "started": meta["started"],
            "wall_s": meta["wall_s"],
            "only": sorted(only or []),
            "user": user,
        }
        meta["reruns"] = [*old.get("reruns", []), rerun]
        meta["wall_s"] = round(old["wall_s"] + meta["wall_s"], 1)
        meta["started"] = old["started"]
        meta["lanes"] = {**old["lanes"], **meta["lanes"]}
        meta["runs"] = sorted(keep + meta["runs"], key=lambda r: (r["user"], r["file"]))
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "meta.json").write_text(json.dumps(meta, indent=2) + "\n", encoding="utf-8")
    report()


# ----------------------------------------------------------------------------------------------------
# Report
# ----------------------------------------------------------------------------------------------------

# What the run showed about the lab beyond pass/fail (README "Observations").
OBSERVATIONS = (
    "Pyxis 0.24.0's `--container-unshare` (net, ipc, uts) does not work with the pinned Enroot 4.1.2, which "
    "has no ENROOT_UNSHARE_* support: 17 of the 23 failed runs (16 as root, 1 as lcm-user; see their "
    "diagnosis). The lock pairs a Pyxis feature with an Enroot that lacks it: the enroot/pyxis roles "
    "should pin an Enroot that implements it or document `--container-unshare` as unavailable.",
    "`--container-mount-home` fails as root on the lab nodes only (EINVAL binding /root, which has the SSH "
    "key bind-mounted below it by roles/lab); moving the key out of /root (e.g. sshd AuthorizedKeysFile "
    "outside $HOME) would remove the lab-only difference.",
    "Every step with `--container-name=NAME:FLAG` (e.g. `:no_exec`, `:exec`) logs `error: pyxis: "
    "--container-name specified multiple times` and `spank: failed to process option` in slurmd.log, "
    "although the step runs and succeeds (Pyxis stores the name without the flag and compares it with the "
    "flagged value when Slurm calls the option callback a second time): log noise an alert on slurmd "
    "`error:` lines would trip on.",
    "Concurrent steps of one job block on the lab's Slurm 22.05 without --overlap (a step gets all of the "
    "job's CPUs and memory by default); upstream's tests start background and foreground steps side by "
    "side, so the harness exports SLURM_OVERLAP=1. In a probe a pending step stayed pending for 60 s after "
    "the step it waited for had ended.",
    "The lab nodes lack CAP_MKNOD: a squashfs image with device nodes in /dev (as debootstrap leaves them) "
    "fails to unpack (`create_inode: failed to create character device ... Operation not permitted`); the "
    "harness' image drops /dev/* (Enroot mounts /dev anyway); the training image, which works, has none.",
    "The node processes already run under podman's seccomp filter, so the two remap_root seccomp tests "
    "pass whatever Pyxis does (noted on those rows).",
    "Enroot's extra hooks (50-slurm-pmi.sh, 50-slurm-pytorch.sh) are installed only as examples in "
    "/usr/local/share/enroot/hooks.d, not enabled: PMIx/PMI2 and PyTorch env tests would need them.",
)

RERUN = "cd /work/main && . .venv/bin/activate && python tests/pyxis/run_bats.py run"


def collect(prep: Prepared, meta: dict[str, Any]) -> list[dict[str, Any]]:
    runs = {(r["user"], r["file"]): r for r in meta["runs"]}
    records: list[dict[str, Any]] = []
    for t, row in prep.selection:
        base = {"file": t.file, "name": t.name, "line": t.line}
        if not row.users:
            records.append({**base, "user": None, "status": "not-run", "reason": row.reason, "seconds": None})
            continue
        for user in row.users:
            rec = {**base, "user": user, "rewrites": rewrites_in(t.body, t.file)}
            if row.reason:
                rec["reason"] = row.reason
            if row.note:
                rec["note"] = row.note
            got = runs.get((user, t.file))
            if got and got.get("not_started"):
                rec.update(
                    status="not-run", seconds=None, reason=f"not started: the run's {got['not_started']}"
                )
                records.append(rec)
                continue
            tap = parse_tap((RESULTS / got["tap"]).read_text(encoding="utf-8")) if got else []
            hit = next((x for x in tap if x.name == t.name), None)
            if hit is None:
                missing = "(no TAP result: the bats run of this file ended before this test)"
                rec.update(status="failed", seconds=None, output=[missing])
                if got:
                    err = (RESULTS / got["tap"]).with_suffix(".stderr").read_text(encoding="utf-8")
                    rec["output"] += err.splitlines()[-20:]
            else:
                rec.update(status=hit.status, seconds=round(hit.ms / 1000, 1) if hit.ms is not None else None)
                if hit.status == "skipped":
                    rec["skip_reason"] = hit.skip_reason
                if hit.status == "failed":
                    rec["output"] = hit.output
            if rec["status"] == "failed":
                rec["diagnosis"] = DIAGNOSES.get((t.file, t.name, user), "")
            records.append(rec)
    return records


def counts_of(records: Sequence[dict[str, Any]]) -> dict[str, Any]:
    tests = {(r["file"], r["name"]) for r in records}
    out: dict[str, Any] = {"upstream_tests": len(tests)}
    out["not_run"] = sum(1 for r in records if r["status"] == "not-run")
    for user in ("root", USER):
        mine = [r for r in records if r["user"] == user]
        out[user] = {
            "ran": len(mine),
            "passed": sum(1 for r in mine if r["status"] == "passed"),
            "failed": sum(1 for r in mine if r["status"] == "failed"),
            "skipped_by_bats": sum(1 for r in mine if r["status"] == "skipped"),
        }
    out["tests_run"] = len({(r["file"], r["name"]) for r in records if r["user"]})
    return out


def _md(s: str) -> str:
    return s.replace("|", "\\|").replace("\n", " ")


def render_readme(records: Sequence[dict[str, Any]], meta: dict[str, Any], counts: dict[str, Any]) -> str:
    lab = meta["lab"]
    img = meta["image"]
    c_root, c_user = counts["root"], counts[USER]
    pyx = meta["pyxis"]
    trimmed = ", ".join(f"`{x}`" for x in img["trimmed"])
    extra_root = f", {c_root['skipped_by_bats']} skipped by the test" if c_root["skipped_by_bats"] else ""
    extra_user = f", {c_user['skipped_by_bats']} skipped by the test" if c_user["skipped_by_bats"] else ""
    reruns = "".join(
        f" Rerun {r['started']} ({r['wall_s']:.0f} s): {', '.join(r['only']) or 'all files'}"
        f" as {r['user'] or 'both users'}."
        for r in meta.get("reruns", [])
    )
    lines = [
        "# Pyxis' own bats tests on the lab",
        "",
        f"Pyxis {pyx['version']} (`{pyx['tarball']}`, sha256 `{pyx['sha256'][:16]}...`, "
        f"lcm_lock.artifacts.pyxis): its `tests/*.bats`, run with {meta['bats']} (lcm_lock.packages.bats) "
        f"on lab-ctl against the podman lab, {meta['started']}, {meta['wall_s']:.0f} s of lab time in "
        f"{len(meta['lanes'])} lanes ({', '.join(meta['lanes'].values())}).{reruns} Generated by "
        "`tests/pyxis/run_bats.py` (tests/pyxis/README.md); results.json has every test, tap/ the raw TAP "
        "and salloc output of each run.",
        "",
        "## Counts",
        "",
        f"- upstream tests: {counts['upstream_tests']}; run: {counts['tests_run']}; "
        f"not run: {counts['not_run']}",
        f"- as root: {c_root['ran']} ran, {c_root['passed']} passed, {c_root['failed']} failed{extra_root}",
        f"- as {USER} (uid {USER_UID}): {c_user['ran']} ran, {c_user['passed']} passed, "
        f"{c_user['failed']} failed{extra_user}",
        "",
        "## Observations on the lab's Pyxis/Enroot setup",
        "",
        *[f"- {x}" for x in OBSERVATIONS],
        "",
        "## Setup",
        "",
        f"- Image: every `ubuntu[:NN.NN]` reference is `{img['image']}` ({img['bytes'] / 1e6:.1f} MB, "
        f"{img['files']} files, lz4, sha256 `{img['sha256'][:16]}...`): {img['source']}, minus {trimmed}.",
        f"- Slurm: {lab.get('slurm', '?')}; Enroot: {lab.get('enroot', '?')}; "
        f"kernel {lab.get('kernel', '?')}.",
        f"- Pyxis plugstack: `{lab.get('plugstack', '?')}`",
        f"- enroot.conf: `{lab.get('enroot_conf', '?')}`; executable hooks: {lab.get('enroot_hooks', '?')}",
        "- Each test file runs in `salloc -N1 -w <node> --exclusive --overcommit` on lab-ctl (upstream: "
        "`salloc --overcommit bats tests`), with `SLURM_OVERLAP=1` (concurrent steps; tests/pyxis/README.md) "
        f"and every srun of the tests bounded by `timeout {meta['srun_timeout_s']}`.",
        "- Rewrites of the upstream tests (the only changes; run_bats.py REWRITES):",
    ]
    for rw in REWRITES:
        lines.append(f"  - `{rw.id}`: {rw.why}.")
    lines.append(
        "  - `srun-timeout`: common.bash gets "
        f'`srun() {{ timeout ${{PYXIS_BATS_SRUN_TIMEOUT}} srun "$@"; }}` ({meta["srun_timeout_s"]} s).'
    )
    failed = [r for r in records if r["status"] == "failed"]
    lines += ["", "## Failures", ""]
    if not failed:
        lines.append("None.")
    for r in failed:
        lines += [
            f"### {r['file']}: {r['name']} (as {r['user']})",
            "",
            f"Diagnosis: {r.get('diagnosis') or '(none recorded)'}",
            "",
            "```",
            *[x for x in r.get("output", [])][-40:],
            "```",
            "",
        ]
    lines += [
        "## Every test",
        "",
        "| file | test | user | status | s | reason / note |",
        "|---|---|---|---|---|---|",
    ]
    for r in records:
        why = r.get("reason", "")
        if r.get("note"):
            why = (why + "; " if why else "") + "note: " + r["note"]
        if r.get("rewrites"):
            why = (why + "; " if why else "") + "rewrites: " + ", ".join(r["rewrites"])
        if r.get("skip_reason"):
            why = (why + "; " if why else "") + "bats skip: " + r["skip_reason"]
        secs = "" if r.get("seconds") is None else f"{r['seconds']:.1f}"
        lines.append(
            f"| {r['file']} | {_md(r['name'])} | {r['user'] or '-'} | {r['status']} | {secs} | {_md(why)} |"
        )
    lines += [
        "",
        "## Rerun",
        "",
        "On the lab host, as root, with the lab up and idle (it submits one-node allocations to both nodes):",
        "",
        "```sh",
        RERUN,
        "```",
        "",
        "`run --only FILE.bats [--user root|lcm-user]` reruns one file (the other results are kept); "
        "`python tests/pyxis/run_bats.py report` rebuilds this page and results.json from tap/ and "
        "meta.json; `list` prints the selection (tests/pyxis/README.md).",
        "",
    ]
    return "\n".join(lines)


def report() -> None:
    meta = json.loads((RESULTS / "meta.json").read_text(encoding="utf-8"))
    with tempfile.TemporaryDirectory(prefix="pyxis-bats.") as tmp:
        prep = prepare(Path(tmp))
        records = collect(prep, meta)
    counts = counts_of(records)
    doc = {
        "generated_by": "tests/pyxis/run_bats.py",
        "rerun": RERUN,
        "counts": counts,
        **meta,
        "tests": records,
    }
    (RESULTS / "results.json").write_text(json.dumps(doc, indent=2) + "\n", encoding="utf-8")
    (RESULTS / "README.md").write_text(render_readme(records, meta, counts), encoding="utf-8")
    print(json.dumps(counts))


def print_table() -> None:
    with tempfile.TemporaryDirectory(prefix="pyxis-bats.") as tmp:
        prep = prepare(Path(tmp))
    for t, row in prep.selection:
        who = ",".join(row.users) if row.users else "-"
        print(f"{row.status:8} {who:14} {t.file}: {t.name}" + (f"  [{row.reason}]" if row.reason else ""))
    runs = [r for _, r in prep.selection if r.users]
    print(f"{len(prep.selection)} tests: {len(runs)} run, {len(prep.selection) - len(runs)} skipped")


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    sub.add_parser("list")
    p = sub.add_parser("prepare")
    p.add_argument("dir", type=Path)
    p.add_argument("--image", default=LAB_IMAGE)
    p = sub.add_parser("image")
    p.add_argument("--force", action="store_true")
    p = sub.add_parser("run")
    p.add_argument("--lanes", type=int, default=len(NODES), choices=range(1, len(NODES) + 1))
    p.add_argument("--only", action="append", help="one test file (repeatable), e.g. mounts.bats")
    p.add_argument("--user", choices=("root", USER), help="only this user's runs")
    p.add_argument("--budget-s", type=float, default=900, help="start no test file after this many seconds")
    sub.add_parser("report")
    args = ap.parse_args(argv)
    try:
        if args.cmd == "list":
            print_table()
        elif args.cmd == "prepare":
            prep = prepare(args.dir, args.image)
            print(f"{prep.tests_dir}: {sum(1 for _, r in prep.selection if r.users)} tests selected")
        elif args.cmd == "image":
            out = SHARED_HOST / "pyxis-bats" / "images" / IMAGE_NAME
            if out.is_file() and not args.force:
                print(f"{out} exists (--force rebuilds)")
            else:
                print(json.dumps(build_image(out), indent=2))
        elif args.cmd == "run":
            run_lab(args.lanes, set(args.only) if args.only else None, args.budget_s, args.user)
        elif args.cmd == "report":
            report()
    except HarnessError as exc:
        print(f"run_bats: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    with contextlib.suppress(BrokenPipeError):
        sys.exit(main())
