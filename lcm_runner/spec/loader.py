"""Read the cluster spec (the same file Ansible reads) and, for the CLI, an inventory's groups."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

import yaml

from .errors import SpecError, SpecInvalid

SPEC_RELPATH = Path("group_vars/all/cluster.yml")


def spec_file(path: str | Path) -> Path:
    """cluster.yml itself, or inventories/<name>/ holding group_vars/all/cluster.yml."""
    p = Path(path)
    return p / SPEC_RELPATH if p.is_dir() else p


def load_cluster(path: str | Path) -> dict[str, Any]:
    """The `cluster` mapping of a spec file or inventory directory (not validated: see validate())."""
    f = spec_file(path)
    try:
        doc = yaml.safe_load(f.read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError) as exc:
        raise SpecInvalid([SpecError(str(f), None, f"a readable YAML file ({exc})")]) from exc
    if not isinstance(doc, dict) or "cluster" not in doc:
        raise SpecInvalid([SpecError(str(f), None, "a YAML mapping with the top-level key `cluster`")])
    cluster: dict[str, Any] = doc["cluster"]
    return cluster


def load_inventory_groups(inventory_dir: str | Path) -> dict[str, list[str]]:
    """Groups -> hosts of an inventory, through ansible-inventory (any inventory format it reads).

    ansible-inventory is looked up on PATH, then next to sys.executable (the venv's bin/, so that
    `.venv/bin/lcm-runner` works without activating the venv). Every failure is a RuntimeError with a
    one-line message saying what to do (the CLI prints it and exits 2).
    """
    import os
    import sys

    exe = shutil.which("ansible-inventory")
    if exe is None:
        beside = Path(sys.executable).parent / "ansible-inventory"
        if beside.is_file() and os.access(beside, os.X_OK):
            exe = str(beside)
    if exe is None:
        raise RuntimeError(
            f"ansible-inventory not found (not on PATH, not in {Path(sys.executable).parent}): "
            "run scripts/bootstrap (it installs Ansible into .venv) and use .venv/bin/lcm-runner, "
            "or check the spec file alone with --no-inventory"
        )
    try:
        out = subprocess.run(
            [exe, "-i", str(inventory_dir), "--list"], check=True, capture_output=True, text=True
        )
    except OSError as exc:
        raise RuntimeError(f"{exe}: cannot run ({exc})") from exc
    except subprocess.CalledProcessError as exc:
        last = next((ln for ln in reversed(exc.stderr.splitlines()) if ln.strip()), "no message")
        raise RuntimeError(
            f"ansible-inventory -i {inventory_dir} --list failed (exit {exc.returncode}): {last.strip()}"
        ) from exc
    try:
        data = json.loads(out.stdout)
    except json.JSONDecodeError as exc:
        raise RuntimeError(f"ansible-inventory -i {inventory_dir} --list: not JSON ({exc})") from exc
    groups: dict[str, list[str]] = {}

    def hosts_of(name: str, seen: set[str]) -> list[str]:
        if name in seen:
            return []
        seen.add(name)
        g = data.get(name, {})
        hosts = list(g.get("hosts", []))
        for child in g.get("children", []):
            hosts += [h for h in hosts_of(child, seen) if h not in hosts]
        return hosts

    for name in data:
        if name != "_meta":
            groups[name] = hosts_of(name, set())
    return groups
