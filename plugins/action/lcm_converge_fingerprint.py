"""Action plugin (controller only): the sha256 of everything a site.yml converge reads on the controller.

Two runs with the same fingerprint converge the nodes to the same state, so a node whose last complete
converge had this fingerprint, and that has not drifted since (plugins/modules/lcm_converge_state.py), has
nothing to do. The inputs:
- the project's files as git sees them (tracked and untracked, not ignored; the bytes, not the
  modification times), except docs/, tests/, benchmarks/ and the top-level README.md, which no play reads;
- every inventory source (files, or directories walked), by content;
- the inventory's groups and their hosts as this run resolved them (a dynamic inventory's output);
- the command line: extra vars (parsed, @files read; `lcm_converge_full` itself left out: it changes how
  the converge runs, not what it converges to), --tags, --skip-tags (without molecule's `molecule-notest`,
  `notest` and `molecule-idempotence-notest`, which no task carries), --limit and --check;
- the environment variables a converge reads: LAB_COMPUTE_NODES (the lab inventory) and LCM_LAB_MIRROR (the
  lab's mirror); HOME only places the artifact cache, whose files are checked against the lock's sha256
  (tests/unit/test_converge_unchanged.py fails when a play, role or inventory reads another one);
- the ansible-core version.
Anything else a play could read (a mirror directory, the artifact cache) is pinned by sha256 in the lock,
which is a project file.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from ansible import context
from ansible.module_utils.ansible_release import __version__ as ansible_version
from ansible.plugins.action import ActionBase
from ansible.utils.vars import load_extra_vars

__all__ = ["ActionModule", "fingerprint", "project_files"]

EXCLUDED_PREFIXES = ("docs/", "tests/", "benchmarks/")
EXCLUDED_FILES = frozenset({"README.md"})
ENV_INPUTS = frozenset({"LAB_COMPUTE_NODES", "LCM_LAB_MIRROR"})
ENV_NOT_INPUTS = frozenset({"HOME"})
UNUSED_SKIP_TAGS = frozenset({"molecule-notest", "notest", "molecule-idempotence-notest"})
NOT_AN_INPUT_VARS = frozenset({"lcm_converge_full"})
_SKIP_DIRS = frozenset(
    {".git", ".venv", "__pycache__", ".cache", ".lab", ".pytest_cache", ".ruff_cache", "runs"}
)


def _walk(root: Path) -> list[str]:
    out: list[str] = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if d not in _SKIP_DIRS and not d.endswith(".egg-info"))
        for f in filenames:
            if not f.endswith((".pyc", ".retry")):
                out.append(str((Path(dirpath) / f).relative_to(root)))
    return sorted(out)


def project_files(root: Path) -> list[str]:
    """The project's files relative to root: git's view (tracked + untracked, not ignored) or a walk."""
    proc = subprocess.run(
        ["git", "-C", str(root), "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        capture_output=True,
        check=False,
    )
    files = sorted(set(proc.stdout.decode().split("\0")) - {""}) if proc.returncode == 0 else _walk(root)
    return [
        f
        for f in files
        if not f.startswith(EXCLUDED_PREFIXES) and f not in EXCLUDED_FILES and (root / f).is_file()
    ]


MOLECULE_MARK = b"# Molecule managed"


def molecule_managed(path: Path) -> bool:
    """Molecule's own inventory file (it passes one beside the project's: its first line says so). It holds
    no host or group, only molecule_* variables looked up from molecule's environment, and is made from
    molecule.yml, which the project files cover: leaving it out makes molecule's converge and a plain
    `ansible-playbook site.yml` of the same inputs one fingerprint."""
    try:
        with path.open("rb") as f:
            return f.read(len(MOLECULE_MARK)) == MOLECULE_MARK
    except OSError:
        return False


def _hash_tree(h: Any, label: str, root: Path, names: Iterable[str]) -> int:
    n = 0
    for name in names:
        data = (root / name).read_bytes()
        h.update(f"{label}\0{name}\0{len(data)}\0".encode())
        h.update(data)
        n += 1
    return n


def _canonical(value: Any) -> str:
    return json.dumps(value, sort_keys=True, default=str, separators=(",", ":"))


def fingerprint(
    root: Path,
    inventory_sources: Sequence[str],
    groups: Mapping[str, Sequence[str]],
    extra_vars: Mapping[str, Any],
    cli: Mapping[str, Any],
    env: Mapping[str, str],
    version: str = ansible_version,
) -> tuple[str, dict[str, Any]]:
    """(sha256 hex, a summary of what went in) of a converge's inputs."""
    h = hashlib.sha256()
    n_project = _hash_tree(h, "project", root, project_files(root))
    n_inventory = 0
    n_molecule = 0
    for src in sorted({str(Path(s).resolve()) for s in inventory_sources if s and Path(s).exists()}):
        p = Path(src)
        names = _walk(p) if p.is_dir() else [p.name]
        base = p if p.is_dir() else p.parent
        kept = [n for n in names if not molecule_managed(base / n)]
        n_molecule += len(names) - len(kept)
        if kept:
            n_inventory += _hash_tree(h, f"inventory:{src}" if p.is_dir() else "inventory", base, kept)
    ev = {k: v for k, v in extra_vars.items() if k not in NOT_AN_INPUT_VARS}
    skip = sorted(set(cli.get("skip_tags") or ()) - UNUSED_SKIP_TAGS)
    run = {
        "groups": {g: sorted(hs) for g, hs in groups.items()},
        "extra_vars": ev,
        "tags": sorted(set(cli.get("tags") or ("all",))),
        "skip_tags": skip,
        "limit": cli.get("subset"),
        "check": bool(cli.get("check")),
        "env": {k: v for k, v in sorted(env.items()) if k in ENV_INPUTS},
        "ansible": version,
    }
    h.update(b"run\0" + _canonical(run).encode())
    summary = {
        "project_files": n_project,
        "inventory_files": n_inventory,
        "molecule_inventory_files_left_out": n_molecule,
        "extra_vars": sorted(ev),
        "tags": run["tags"],
        "skip_tags": skip,
        "limit": run["limit"],
        "check": run["check"],
        "env": sorted(run["env"]),
    }
    return h.hexdigest(), summary


class ActionModule(ActionBase):
    TRANSFERS_FILES = False
    _VALID_ARGS = frozenset(("root",))

    def run(self, tmp: Any = None, task_vars: dict[str, Any] | None = None) -> dict[str, Any]:
        result = super().run(tmp, task_vars)
        task_vars = task_vars or {}
        root = Path(self._task.args.get("root") or task_vars.get("playbook_dir") or ".")
        top = subprocess.run(
            ["git", "-C", str(root), "rev-parse", "--show-toplevel"],
            capture_output=True,
            text=True,
            check=False,
        )
        if top.returncode == 0 and top.stdout.strip():
            root = Path(top.stdout.strip())
        sources = task_vars.get("ansible_inventory_sources") or list(context.CLIARGS.get("inventory") or ())
        digest, summary = fingerprint(
            root,
            [str(s) for s in sources],
            task_vars.get("groups", {}),
            load_extra_vars(self._loader),
            context.CLIARGS,
            os.environ,
        )
        result.update(changed=False, fingerprint=digest, summary={"root": str(root), **summary})
        return result
