"""Storage paths that would land on the node's own system directories are refused in validation, naming
the field, the value and what is expected (a shared mount on /usr, scratch under /etc, an export of /var)."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest

from lcm_runner.spec import load_cluster, validate

ROOT = Path(__file__).resolve().parents[2]
LAB = load_cluster(ROOT / "inventories/lab")


def _msgs(**storage: Any) -> list[str]:
    spec = copy.deepcopy(LAB)
    spec["storage"].update(storage)
    return [str(e) for e in validate(spec)]


@pytest.mark.parametrize(
    ("field", "storage", "where"),
    [
        ("mountpoint", {"mountpoint": "/usr", "checkpoint_dir": "/usr/ckpt"}, "a system directory"),
        ("mountpoint", {"mountpoint": "/var/lib", "checkpoint_dir": "/var/lib/ckpt"}, "a system directory"),
        ("mountpoint", {"mountpoint": "/etc/lcm", "checkpoint_dir": "/etc/lcm/ckpt"}, "inside /etc"),
        ("local_scratch", {"local_scratch": "/etc/lcm-local"}, "inside /etc"),
        ("local_scratch", {"local_scratch": "/tmp"}, "a system directory"),
    ],
)
def test_system_directories_refused(field: str, storage: dict, where: str) -> None:
    msgs = [m for m in _msgs(**storage) if m.startswith(f"cluster.storage.{field} = ")]
    value = storage[field]
    assert msgs and msgs[0].startswith(
        f'cluster.storage.{field} = "{value}": expected a directory of its own'
    )
    assert f"not {where}" in msgs[0] and "/usr" in msgs[0]


def test_nfs_export_of_a_system_directory_refused() -> None:
    msgs = _msgs(type="nfs", nfs={"export_path": "/var"})
    assert any(
        m.startswith('cluster.storage.nfs.export_path = "/var": expected a directory of its own')
        for m in msgs
    )


@pytest.mark.parametrize("path", ["/shared", "/lustre", "/srv/ckpt", "/opt/lcm-ckpt", "/home", "/run/lcm"])
def test_ordinary_directories_accepted(path: str) -> None:
    assert _msgs(mountpoint=path, checkpoint_dir=f"{path}/ckpt") == []
    assert _msgs(local_scratch=f"{path}-local") == []


def test_schema_rule_text_names_every_system_directory() -> None:
    """docs/spec.md (from schema.yml's x-rules) lists the same directories safe.py refuses."""
    from lcm_runner.spec import load_schema
    from lcm_runner.spec.safe import SYSTEM_DIRS, SYSTEM_MOUNTS

    rule = next(r for r in load_schema()["x-rules"] if "the node's own directories" in r)
    for d in SYSTEM_DIRS + SYSTEM_MOUNTS:
        assert f"{d}," in rule or f"{d} " in rule, d
