"""Every `cluster.<path>` a role, template or playbook reads exists in the spec validate.yml hands them
(the schema's defaults filled in), for every inventory's spec: a path the filled spec lacks would fail on
a host, after earlier layers changed it. Sections the schema fills only for one storage type are read
behind that type's guard on the same line."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from lcm_runner.spec.schema import fill_defaults

ROOT = Path(__file__).resolve().parents[2]
SPECS = sorted(ROOT.glob("inventories/*/group_vars/all/cluster.yml"))
SOURCES = sorted(
    [*ROOT.glob("roles/*/**/*.yml"), *ROOT.glob("roles/*/templates/**/*.j2"), *ROOT.glob("playbooks/*.yml")]
)
REF = re.compile(r"\bcluster((?:\.[a-z_]+)+)")
PROSE = re.compile(r"^\s*(#|description:|- [A-Z`])")
# section -> the guard a line reading it must carry (the schema fills the section only then)
GUARDED = {"storage.nfs": "if cluster.storage.type == "}


def _has(d: Any, path: str) -> bool:
    for key in path.split("."):
        if not (isinstance(d, dict) and key in d):
            return False
        d = d[key]
    return True


def _refs() -> list[tuple[str, str, str]]:
    out = []
    for f in SOURCES:
        for n, line in enumerate(f.read_text().splitlines(), 1):
            if PROSE.match(line):  # a comment or an argument's description: no expression
                continue
            for m in REF.finditer(line):
                path = m.group(1).lstrip(".")
                if path == "yml":  # cluster.yml, a file name
                    continue
                out.append((path, f"{f.relative_to(ROOT)}:{n}", line))
    return out


def test_the_scan_sees_the_roles_reading_the_spec() -> None:
    paths = {p for p, _, _ in _refs()}
    assert {"storage.type", "slurm.partitions", "gpu.count_per_node", "layers.slurm"} <= paths


@pytest.mark.parametrize("spec_file", SPECS, ids=lambda p: p.parts[-4])
def test_every_spec_path_read_exists_in_the_filled_spec(spec_file: Path) -> None:
    spec = fill_defaults(yaml.safe_load(spec_file.read_text())["cluster"])
    missing = []
    for path, where, line in _refs():
        if _has(spec, path):
            continue
        guard = next((g for sec, g in GUARDED.items() if path == sec or path.startswith(sec + ".")), None)
        if guard and guard in line:
            continue
        missing.append(f"{where}: cluster.{path}")
    assert missing == [], "\n".join(missing)
