"""One source of spec defaults: lcm_runner/spec/schema.yml.

Validation fills the schema's defaults in (fill_defaults) and playbooks/validate.yml hands the result to
every host as `cluster`; no role restates a spec default (`cluster.x | default(...)`) in its defaults,
argument_specs, preflight or templates, so a role default can never disagree with the schema again (it
did: task_plugin was task/cgroup in roles/slurm, task/affinity,task/cgroup in the schema).
"""

from __future__ import annotations

import copy
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from _role_render import evaluate

from lcm_runner.spec import fill_defaults, load_schema, validate, validated
from lcm_runner.spec.errors import SpecInvalid

ROOT = Path(__file__).resolve().parents[2]
ROLES = ROOT / "roles"
LAB = yaml.safe_load((ROOT / "inventories/lab/group_vars/all/cluster.yml").read_text())["cluster"]
GROUPS = {"all": ["ctl", "c1"], "controller": ["ctl"], "compute": ["c1"], "monitoring": ["ctl"]}

# `cluster.a.b` (or cluster['a']) followed by a `| default(` filter: a restated spec default.
_RESTATED = re.compile(r"cluster((?:\.[A-Za-z_]\w*)+)\s*(?:\|\s*int\s*)?\|\s*default\(\s*([^)]*)\)")
_JINJA_LITERALS = {"true": True, "false": False, "none": None, "True": True, "False": False}


def _schema_field(dotted: str) -> dict[str, Any] | None:
    node: dict[str, Any] = load_schema()
    for part in dotted.split("."):
        props = node.get("properties", {})
        if part not in props:
            return None
        node = props[part]
    return node


def _literal(text: str) -> Any:
    text = text.strip()
    if text in _JINJA_LITERALS:
        return _JINJA_LITERALS[text]
    return yaml.safe_load(text.replace("''", "'")) if text else None


def _strings(value: Any) -> list[str]:
    if isinstance(value, str):
        return [value]
    if isinstance(value, dict):
        return [s for v in value.values() for s in _strings(v)]
    if isinstance(value, list):
        return [s for v in value for s in _strings(v)]
    return []


def _role_sources() -> list[tuple[str, str]]:
    """(file relative to the repo, text) of every place a role could restate a spec default."""
    out: list[tuple[str, str]] = []
    for role in sorted(p for p in ROLES.iterdir() if p.is_dir()):
        for rel in ("defaults/main.yml", "tasks/preflight.yml", "tasks/validate.yml"):
            f = role / rel
            if f.is_file():
                out.append((str(f.relative_to(ROOT)), f.read_text()))
        spec = role / "meta/argument_specs.yml"
        if spec.is_file():
            doc = yaml.safe_load(spec.read_text()) or {}
            for entry in (doc.get("argument_specs") or {}).values():
                for name, opt in (entry.get("options") or {}).items():
                    if "default" in opt:
                        out += [(f"{spec.relative_to(ROOT)}:{name}", s) for s in _strings(opt["default"])]
        for tpl in sorted((role / "templates").glob("**/*")) if (role / "templates").is_dir() else []:
            if tpl.is_file():
                out.append((str(tpl.relative_to(ROOT)), tpl.read_text()))
    return out


def test_no_role_restates_a_spec_default() -> None:
    """Every `cluster.<field> | default(x)` in a role is reported with the schema's own default."""
    problems = []
    for where, text in _role_sources():
        for m in _RESTATED.finditer(text):
            dotted, restated = m.group(1).lstrip("."), _literal(m.group(2))
            field = _schema_field(dotted)
            schema_default = field.get("default", "(none: a required field)") if field else "(no such field)"
            problems.append(
                f"{where}: cluster.{dotted} | default({m.group(2).strip()}) restates a spec default "
                f"({restated!r}; schema.yml: {schema_default!r}): read the validated cluster instead"
            )
    assert problems == [], "\n".join(problems)


def test_detector_catches_the_old_task_plugin_drift() -> None:
    """The check above would have failed on the drift the issue found (and names both values)."""
    old = "slurm_task_plugin: \"{{ cluster.slurm.task_plugin | default('task/cgroup') }}\""
    (m,) = _RESTATED.finditer(old)
    assert m.group(1) == ".slurm.task_plugin" and _literal(m.group(2)) == "task/cgroup"
    assert _schema_field("slurm.task_plugin")["default"] == "task/affinity,task/cgroup"  # type: ignore[index]


def _spec_fields(role_default: Any) -> list[str]:
    return [m.group(1) for s in _strings(role_default) for m in re.finditer(r"cluster\.([\w.]+)", s)]


def _minimal() -> dict[str, Any]:
    """The lab spec with every optional field left out (so only the schema's defaults can fill them)."""
    spec = copy.deepcopy(LAB)
    for section, keys in (
        ("slurm", ["proctrack_type", "task_plugin", "bind_any_address", "node_slots", "accounting"]),
    ):
        for key in keys:
            spec[section].pop(key, None)
    for part in spec["slurm"]["partitions"]:
        part.pop("default", None)
        part.pop("max_time", None)
    spec["slurm"]["partitions"][0]["default"] = True
    spec["layers"].pop("base", None)
    return spec


ROLE_DEFAULTS = [
    (role.name, name)
    for role in sorted(ROLES.iterdir())
    if (role / "defaults/main.yml").is_file()
    for name, value in (yaml.safe_load((role / "defaults/main.yml").read_text()) or {}).items()
    if _spec_fields(value) and re.fullmatch(r"\{\{\s*cluster\.[\w.]+\s*\}\}", str(value).strip())
]


@pytest.mark.parametrize(("role", "name"), ROLE_DEFAULTS, ids=[f"{r}.{n}" for r, n in ROLE_DEFAULTS])
def test_role_default_of_a_spec_field_is_the_schema_default(role: str, name: str) -> None:
    """A role variable that is just `{{ cluster.<field> }}` evaluates to the schema's default of that field
    when the spec leaves the field out (the spec validate.yml hands over has the default filled in)."""
    value = yaml.safe_load((ROLES / role / "defaults/main.yml").read_text())[name]
    (dotted,) = _spec_fields(value)
    field = _schema_field(dotted)
    assert field is not None, f"roles/{role}: {name} reads cluster.{dotted}, which the schema does not define"
    spec = _minimal()
    if dotted.startswith("storage.nfs."):
        spec["storage"] = {"type": "nfs", "mountpoint": "/mnt/ckpt", "checkpoint_dir": "/mnt/ckpt/c"}
    elif dotted == "storage.fstype":
        spec["storage"] = {"type": "existing", "mountpoint": "/lustre", "checkpoint_dir": "/lustre/c"}
    got = evaluate(role, name, {"cluster": fill_defaults(spec)})
    if "default" in field:
        assert got == field["default"], (
            f"roles/{role} {name} = {got!r}, schema.yml's default of cluster.{dotted}: {field['default']!r}"
        )


def test_every_role_default_renders_from_the_filled_in_lab_spec() -> None:
    """No role variable derived from the spec needs a field the filled-in spec lacks (lab shape)."""
    for role in sorted(ROLES.iterdir()):
        f = role / "defaults/main.yml"
        if not f.is_file():
            continue
        for name, value in (yaml.safe_load(f.read_text()) or {}).items():
            fields = _spec_fields(value)
            if fields and not any(d.startswith("storage.nfs") for d in fields):
                evaluate(role.name, name, {"cluster": fill_defaults(_minimal()), "role_path": str(role)})


def test_fill_defaults_fills_every_schema_default() -> None:
    spec = _minimal()
    assert validate(spec, GROUPS) == []
    filled = fill_defaults(spec)
    assert filled["slurm"]["task_plugin"] == "task/affinity,task/cgroup"
    assert filled["slurm"]["proctrack_type"] == "proctrack/cgroup"
    assert filled["slurm"]["bind_any_address"] is False
    assert filled["slurm"]["partitions"][0] == {
        "name": "batch",
        "groups": ["compute"],
        "default": True,
        "max_time": "UNLIMITED",
    }
    assert filled["fabric"]["topology"] == []
    assert filled["storage"]["local_scratch"] == "/var/lib/lcm-local"
    assert filled["storage"]["fstype"] == ""
    assert "nfs" not in filled["storage"], "storage.nfs is filled only for storage type nfs"
    assert filled["layers"]["base"] is True
    assert spec["slurm"].get("task_plugin") is None, "the input is not modified"
    assert fill_defaults(filled) == filled, "idempotent"
    # The filled-in spec is itself valid (roles/lcm_runner writes it to the nodes as cluster.yml).
    assert validate(filled, GROUPS) == []
    assert validate(fill_defaults(copy.deepcopy(LAB)), GROUPS) == []


def test_fill_defaults_keeps_given_values_and_fills_nfs_for_type_nfs() -> None:
    spec = copy.deepcopy(LAB)
    spec["storage"] = {"type": "nfs", "mountpoint": "/mnt/ckpt", "checkpoint_dir": "/mnt/ckpt/c"}
    spec["storage"]["nfs"] = {"threads": 64}
    filled = fill_defaults(spec)
    assert filled["slurm"]["task_plugin"] == "task/cgroup"  # the lab's own value stays
    assert filled["storage"]["nfs"]["threads"] == 64
    assert filled["storage"]["nfs"]["server_group"] == "controller"
    assert "hard" in filled["storage"]["nfs"]["mount_options"].split(",")
    del spec["storage"]["nfs"]
    assert fill_defaults(spec)["storage"]["nfs"]["version"] == "4.2"


def test_validated_returns_the_filled_spec_or_raises() -> None:
    assert validated(_minimal(), GROUPS)["slurm"]["task_plugin"] == "task/affinity,task/cgroup"
    bad = _minimal()
    bad["slurm"]["task_plugin"] = "task/bogus"
    with pytest.raises(SpecInvalid) as exc:
        validated(bad, GROUPS)
    assert "cluster.slurm.task_plugin" in str(exc.value) and '"task/bogus"' in str(exc.value)


HOSTS = """
all:
  vars: {ansible_connection: local}
  children:
    cluster:
      children:
        controller: {hosts: {ctl: {}}}
        compute: {hosts: {c1: {}}}
        monitoring: {hosts: {ctl: {}}}
"""

SITE = f"""
- name: Validate
  ansible.builtin.import_playbook: {ROOT}/playbooks/validate.yml
- name: Show what a later play sees
  hosts: all
  gather_facts: false
  tasks:
    - name: SHOW
      ansible.builtin.debug:
        msg: "SEEN {{{{ cluster | to_json }}}} END"
"""


def _play(tmp_path: Path, spec: dict[str, Any], *args: str) -> subprocess.CompletedProcess[str]:
    inv = tmp_path / "inv"
    (inv / "group_vars" / "all").mkdir(parents=True, exist_ok=True)
    (inv / "hosts.yml").write_text(HOSTS)
    (inv / "group_vars" / "all" / "cluster.yml").write_text(yaml.safe_dump({"cluster": spec}))
    shutil.copy(ROOT / "versions.lock.yml", inv / "group_vars" / "all" / "lock.yml")
    (tmp_path / "site.yml").write_text(SITE)
    env = {**os.environ, "ANSIBLE_CONFIG": str(ROOT / "ansible.cfg"), "ANSIBLE_NOCOLOR": "1"}
    exe = shutil.which("ansible-playbook") or shutil.which(
        "ansible-playbook", path=str(Path(sys.executable).parent)
    )
    assert exe, "ansible-playbook neither on PATH nor next to this python"
    return subprocess.run(
        [exe, "-i", str(inv), str(tmp_path / "site.yml"), *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=180,
        check=False,
    )


def _seen(stdout: str) -> list[dict[str, Any]]:
    return [json.loads(m) for m in re.findall(r'"SEEN (.*?) END"', stdout.replace('\\"', '"'))]


@pytest.mark.slow
@pytest.mark.parametrize("limit", [[], ["--limit", "c1"]], ids=["all", "limit-without-localhost"])
def test_every_later_play_sees_the_filled_in_spec(tmp_path: Path, limit: list[str]) -> None:
    """validate.yml sets `cluster` (schema defaults filled in) on every host, also under a --limit that
    skips its localhost play; group_vars' partial spec is what they would see otherwise."""
    out = _play(tmp_path, _minimal(), *limit)
    assert out.returncode == 0, out.stdout[-3000:]
    seen = _seen(out.stdout)
    assert len(seen) == (1 if limit else 2), out.stdout[-3000:]
    for cluster in seen:
        assert cluster == fill_defaults(_minimal())


@pytest.mark.slow
def test_limit_without_localhost_still_validates(tmp_path: Path) -> None:
    bad = _minimal()
    bad["slurm"]["task_plugin"] = "task/bogus"
    out = _play(tmp_path, bad, "--limit", "c1")
    assert out.returncode != 0
    assert 'cluster.slurm.task_plugin = \\"task/bogus\\": expected one of' in out.stdout, out.stdout[-3000:]
    assert "SEEN" not in out.stdout


def _not_mine_restated() -> list[str]:
    """Spec defaults restated in the playbooks and in role files outside defaults/preflight/templates."""
    files = sorted(ROOT.glob("playbooks/*.yml")) + sorted(ROLES.glob("*/tasks/*.yml"))
    files += sorted(ROLES.glob("*/vars/main.yml")) + sorted(ROLES.glob("*/handlers/*.yml"))
    out = []
    for f in files:
        if f.name == "validate.yml" and f.parent.name == "playbooks":
            continue
        for m in _RESTATED.finditer(f.read_text()):
            out.append(f"{f.relative_to(ROOT)}: cluster{m.group(1)} | default({m.group(2).strip()})")
    return out


def test_no_playbook_or_role_task_restates_a_spec_default() -> None:
    assert _not_mine_restated() == [], "\n".join(_not_mine_restated())
