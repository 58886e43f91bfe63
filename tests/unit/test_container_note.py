"""Where the ranks ran: the trainer's `rootfs` (procutil.root_mount, from mountinfo) and the report's
note built from the start events (report.slo.container_note)."""

from __future__ import annotations

from pathlib import Path

from lcm_runner.report.slo import container_note
from lcm_runner.telemetry import Record
from lcm_runner.train.procutil import in_enroot_container, root_mount

# The first lines of /proc/self/mountinfo inside a Pyxis container on the lab, and on a lab node.
IN_PYXIS = (
    "388 341 0:57 /var/lib/lcm-local/enroot/data/user-0/pyxis_38_38.0 / rw,nosuid,nodev,relatime - overlay "
    "overlay rw,lowerdir=/var/lib/containers/storage/overlay/l/6KKM\n"
    "389 388 0:60 / /proc rw,nosuid,nodev,noexec,relatime - proc proc rw\n"
)
IN_PYXIS_SQUASHFUSE = (
    "419 351 0:103 / / rw,nosuid,nodev,relatime - overlay overlay rw,lowerdir=/var/lib/lcm-local/enroot/"
    "runtime/user-0/overlay/lower,upperdir=/var/lib/lcm-local/enroot/runtime/user-0/overlay/upper,"
    "workdir=/var/lib/lcm-local/enroot/runtime/user-0/overlay/work,redirect_dir=nofollow,uuid=null\n"
    "420 419 0:93 / /proc rw,nosuid,nodev,noexec,relatime - proc proc rw\n"
)
ON_NODE = (
    "341 300 0:52 / / rw,relatime - overlay overlay rw,lowerdir=/var/lib/containers/storage/overlay/l/X\n"
    "342 341 0:54 / /proc rw,nosuid,nodev,noexec,relatime - proc proc rw\n"
)


def test_root_mount_names_the_enroot_rootfs_inside_a_container(tmp_path: Path) -> None:
    (tmp_path / "in").write_text(IN_PYXIS)
    (tmp_path / "on").write_text(ON_NODE)
    assert root_mount(str(tmp_path / "in")) == "/var/lib/lcm-local/enroot/data/user-0/pyxis_38_38.0"
    (tmp_path / "fuse").write_text(IN_PYXIS_SQUASHFUSE)
    on_node = root_mount(str(tmp_path / "on"))
    assert on_node == "/"  # podman's overlay without upperdir in these options
    squashfuse = root_mount(str(tmp_path / "fuse"))
    assert squashfuse == "/ upper=/var/lib/lcm-local/enroot/runtime/user-0/overlay/upper"
    assert in_enroot_container(squashfuse) and in_enroot_container(root_mount(str(tmp_path / "in")))
    assert not in_enroot_container(on_node)
    assert not in_enroot_container("/ upper=/var/lib/containers/storage/overlay/4435/diff")
    assert root_mount(str(tmp_path / "missing")) == ""
    assert not in_enroot_container(root_mount())  # this test process: not in an Enroot container


def _start(job: str, rank: int, rootfs: str | None) -> Record:
    data = {} if rootfs is None else {"rootfs": rootfs}
    return Record(ts=1.0, event="start", rank=rank, attempt=0, job=job, data=data)


def test_container_note_counts_rank_starts_inside_and_outside() -> None:
    inside = [
        _start(j, r, f"/scratch/enroot/data/user-0/pyxis_{j}_{j}.0") for j in ("7", "8") for r in range(4)
    ]
    assert container_note(inside) == "containers: all 8 rank starts ran inside Pyxis containers (2 job(s))"
    outside = [_start("9", r, "/") for r in range(4)]
    assert (
        container_note(outside) == "containers: none; all 4 rank starts ran on the nodes' own root filesystem"
    )
    assert container_note(inside + outside).startswith("containers: 8 of 12 rank starts ran inside")
    assert container_note([_start("1", 0, None)]) == ""  # an older trainer recorded no rootfs
