"""site.yml's unchanged check: the controller's inputs fingerprint
(plugins/action/lcm_converge_fingerprint.py), the node's record and check
(plugins/module_utils/lcm_converge_state.py), and the plays' wiring.

On real files and a real git repository in a temporary tree; the lab test
(tests/lab/test_converge_unchanged.py) runs it against the nodes."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import ansible.module_utils
import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]


def _load(name: str, path: Path) -> ModuleType:
    utils = str(ROOT / "plugins/module_utils")
    if utils not in ansible.module_utils.__path__:
        ansible.module_utils.__path__.append(utils)
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


fpm = _load("lcm_converge_fingerprint", ROOT / "plugins/action/lcm_converge_fingerprint.py")
gen = _load("lcm_generation", ROOT / "plugins/modules/lcm_generation.py")
state = _load("lcm_converge_state_utils", ROOT / "plugins/module_utils/lcm_converge_state.py")


# ---------------------------------------------------------------- the controller's fingerprint


def _git(repo: Path, *args: str) -> None:
    subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True)


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    r = tmp_path / "proj"
    for rel, text in {
        "site.yml": "- name: x\n",
        "roles/slurm/templates/slurm.conf.j2": "ClusterName={{ c }}\n",
        "inventories/lab/group_vars/all/cluster.yml": "cluster: {name: lab}\n",
        "docs/scale.md": "# scale\n",
        "tests/unit/test_x.py": "x = 1\n",
        "benchmarks/run": "#!/bin/sh\n",
        "README.md": "# readme\n",
        ".gitignore": ".lab/\n",
    }.items():
        (r / rel).parent.mkdir(parents=True, exist_ok=True)
        (r / rel).write_text(text)
    _git(r, "init", "-q")
    _git(r, "add", "-A")
    return r


def _fp(repo: Path, **kw: object) -> str:
    args: dict = {
        "inventory_sources": [str(repo / "inventories/lab")],
        "groups": {"all": ["lab-ctl", "lab-node1"], "compute": ["lab-node1"]},
        "extra_vars": {},
        "cli": {"tags": ("all",), "skip_tags": (), "subset": None, "check": False},
        "env": {"LAB_COMPUTE_NODES": "2", "HOME": "/root"},
    }
    args.update(kw)
    return fpm.fingerprint(repo, **args)[0]


def test_same_inputs_same_fingerprint_and_what_went_in(repo: Path) -> None:
    digest, summary = fpm.fingerprint(
        repo,
        [str(repo / "inventories/lab")],
        {"all": ["a"]},
        {},
        {"tags": ("all",)},
        {"LAB_COMPUTE_NODES": "1", "PATH": "/bin"},
    )
    assert re.fullmatch(r"[0-9a-f]{64}", digest)
    assert digest == _fp(repo, groups={"all": ["a"]}, env={"LAB_COMPUTE_NODES": "1", "PATH": "/usr/bin"})
    # site.yml, the template, the inventory file, .gitignore (docs/ tests/ benchmarks/ README.md: not inputs)
    assert summary["project_files"] == 4
    assert summary["inventory_files"] == 1
    assert summary["env"] == ["LAB_COMPUTE_NODES"]


@pytest.mark.parametrize(
    "change",
    [
        "role-file",
        "untracked-role-file",
        "deleted-file",
        "inventory",
        "inventory-outside",
        "mode-irrelevant-bytes",
    ],
)
def test_any_input_file_change_changes_the_fingerprint(repo: Path, tmp_path: Path, change: str) -> None:
    outside = tmp_path / "hosts.yml"
    outside.write_text("all: {hosts: {a: {}}}\n")
    inv = [str(repo / "inventories/lab"), str(outside)]
    before = _fp(repo, inventory_sources=inv)
    if change == "role-file":
        (repo / "roles/slurm/templates/slurm.conf.j2").write_text("ClusterName={{ c }}\nX=1\n")
    elif change == "untracked-role-file":
        (repo / "roles/slurm/templates/gres.conf.j2").write_text("")
    elif change == "deleted-file":
        (repo / "roles/slurm/templates/slurm.conf.j2").unlink()
    elif change == "inventory":
        (repo / "inventories/lab/group_vars/all/cluster.yml").write_text("cluster: {name: lab2}\n")
    elif change == "inventory-outside":
        outside.write_text("all: {hosts: {a: {}, b: {}}}\n")
    else:
        # one byte moved between two files: the same total, a different content
        (repo / "site.yml").write_text("- name: \n")
        (repo / "roles/slurm/templates/slurm.conf.j2").write_text("ClusterName={{ c }}\nx")
    assert _fp(repo, inventory_sources=inv) != before


def test_files_no_play_reads_and_ignored_files_are_not_inputs(repo: Path) -> None:
    before = _fp(repo)
    (repo / "docs/scale.md").write_text("# changed\n")
    (repo / "tests/unit/test_x.py").write_text("x = 2\n")
    (repo / "benchmarks/new.py").write_text("")
    (repo / "README.md").write_text("# changed\n")
    (repo / ".lab").mkdir()
    (repo / ".lab/ssh_key").write_text("secret")
    os.utime(repo / "site.yml", (1, 1))
    assert _fp(repo) == before


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("extra_vars", {"slurm_version": "24.11"}),
        ("extra_vars", {"lcm_target_group": "compute"}),
        ("cli", {"tags": ("slurm",), "skip_tags": (), "subset": None, "check": False}),
        ("cli", {"tags": ("all",), "skip_tags": ("monitoring",), "subset": None, "check": False}),
        ("cli", {"tags": ("all",), "skip_tags": (), "subset": "lab-node1", "check": False}),
        ("cli", {"tags": ("all",), "skip_tags": (), "subset": None, "check": True}),
        ("env", {"LAB_COMPUTE_NODES": "3", "HOME": "/root"}),
        ("env", {"LAB_COMPUTE_NODES": "2", "LCM_LAB_MIRROR": "/srv/mirror", "HOME": "/root"}),
        ("groups", {"all": ["lab-ctl", "lab-node1", "lab-node2"], "compute": ["lab-node1", "lab-node2"]}),
    ],
)
def test_command_line_environment_and_inventory_are_inputs(repo: Path, field: str, value: object) -> None:
    assert _fp(repo, **{field: value}) != _fp(repo)


MOLECULE_INVENTORY = """# Molecule managed

---
all:
  vars:
    molecule_file: '{{ lookup(''env'', ''MOLECULE_FILE'') }}'
ungrouped:
  vars: {}
"""


def test_molecules_own_inventory_is_left_out_and_any_other_extra_one_counts(
    repo: Path, tmp_path: Path
) -> None:
    """molecule passes its generated inventory (no hosts, molecule_* lookups, made from molecule.yml) before
    the project's: its converge and a plain `ansible-playbook site.yml` must be one fingerprint (the CI of
    2026-12-06 differed by it: 5 inventory files against 4). Any other inventory source is an input."""
    mol = tmp_path / "molecule.AbCd.default" / "inventory"
    mol.mkdir(parents=True)
    (mol / "ansible_inventory.yml").write_text(MOLECULE_INVENTORY)
    plain = [str(repo / "inventories/lab")]
    digest, summary = fpm.fingerprint(repo, [str(mol), *plain], {"all": ["a"]}, {}, {"tags": ("all",)}, {})
    assert digest == fpm.fingerprint(repo, plain, {"all": ["a"]}, {}, {"tags": ("all",)}, {})[0]
    assert summary["inventory_files"] == 1 and summary["molecule_inventory_files_left_out"] == 1
    other = tmp_path / "site-inventory"
    other.mkdir()
    (other / "hosts.yml").write_text(MOLECULE_INVENTORY.replace("# Molecule managed", "# a site's own"))
    assert (
        fpm.fingerprint(repo, [str(other), *plain], {"all": ["a"]}, {}, {"tags": ("all",)}, {})[0] != digest
    )


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("extra_vars", {"lcm_converge_full": True}),
        (
            "cli",
            {"tags": ("all",), "skip_tags": ("molecule-notest", "notest"), "subset": None, "check": False},
        ),
        # molecule's idempotence run adds molecule-idempotence-notest to its converge's --skip-tags
        (
            "cli",
            {
                "tags": ("all",),
                "skip_tags": ("molecule-notest", "notest", "molecule-idempotence-notest"),
                "subset": None,
                "check": False,
            },
        ),
        (
            "env",
            {"LAB_COMPUTE_NODES": "2", "HOME": "/home/x", "MOLECULE_FILE": "/x", "ANSIBLE_FORCE_COLOR": "0"},
        ),
        ("env", {"LAB_COMPUTE_NODES": "2", "HOME": "/root", "LCM_LAB": "1", "LCM_TEST_SERIAL": "1"}),
        ("groups", {"compute": ["lab-node1"], "all": ["lab-node1", "lab-ctl"]}),
    ],
)
def test_what_does_not_change_the_converged_state_is_not_an_input(
    repo: Path, field: str, value: object
) -> None:
    assert _fp(repo, **{field: value}) == _fp(repo)


def test_every_environment_variable_a_converge_reads_is_an_input() -> None:
    """An env lookup in a play, role or inventory script that the fingerprint left out would let a changed
    value pass as 'unchanged'."""
    lookup = re.compile(r"lookup\(\s*'(?:ansible\.builtin\.)?env'\s*,\s*'([A-Z0-9_]+)'")
    script = re.compile(r"""(?:environ|env)(?:\.get\(|\[)\s*["']([A-Z0-9_]+)["']""")
    files = [
        *ROOT.glob("roles/**/*.yml"),
        *ROOT.glob("roles/**/*.j2"),
        *ROOT.glob("playbooks/*.yml"),
        *ROOT.glob("inventories/**/*.yml"),
        *ROOT.glob("inventories/*/hosts.py"),
        *ROOT.glob("plugins/**/*.py"),
        ROOT / "site.yml",
    ]
    found = {m for f in files for rx in (lookup, script) for m in rx.findall(f.read_text())}
    assert {"LAB_COMPUTE_NODES", "LCM_LAB_MIRROR", "HOME"} <= found  # the scan sees the known ones
    assert found <= fpm.ENV_INPUTS | fpm.ENV_NOT_INPUTS, found - fpm.ENV_INPUTS - fpm.ENV_NOT_INPUTS


def test_no_task_carries_the_skip_tags_left_out() -> None:
    """molecule passes --skip-tags molecule-notest,notest (idempotence: molecule-idempotence-notest too):
    left out only while no task uses them."""
    for path in [*ROOT.glob("roles/*/tasks/*.yml"), *ROOT.glob("playbooks/*.yml"), ROOT / "site.yml"]:
        for tag in fpm.UNUSED_SKIP_TAGS:
            assert not re.search(rf"\b{re.escape(tag)}\b", path.read_text()), f"{path} uses the tag {tag}"


def test_without_git_the_tree_is_walked(tmp_path: Path) -> None:
    r = tmp_path / "plain"
    (r / "roles/a").mkdir(parents=True)
    (r / "roles/a/x.yml").write_text("a\n")
    (r / ".venv/lib").mkdir(parents=True)
    (r / ".venv/lib/big.py").write_text("")
    (r / "docs").mkdir()
    (r / "docs/a.md").write_text("")
    assert fpm.project_files(r) == ["roles/a/x.yml"]
    before = _fp(r, inventory_sources=[])
    (r / "roles/a/x.yml").write_text("b\n")
    assert _fp(r, inventory_sources=[]) != before


def test_the_project_itself_fingerprints_quickly() -> None:
    _, summary = fpm.fingerprint(ROOT, [str(ROOT / "inventories/lab")], {}, {}, {}, {})
    assert summary["project_files"] > 300
    assert not any(f.startswith(("docs/", "tests/")) for f in fpm.project_files(ROOT))
    assert "site.yml" in fpm.project_files(ROOT)


# ---------------------------------------------------------------- the node's record and check


class Packages:
    def __init__(self, **versions: str | None) -> None:
        self.v = dict(versions)

    def __call__(self, names: list[str]) -> dict[str, str | None]:
        return {n: self.v.get(n) for n in names}


class Units:
    """Stands in for systemctl on the unit level (the lab test asks the nodes' systemd)."""

    def __init__(self, *active: str) -> None:
        self.active = set(active)

    def __call__(self, units: list[str]) -> dict[str, bool]:
        return {u: u in self.active for u in units}


@pytest.fixture
def node(tmp_path: Path) -> dict:
    etc = tmp_path / "etc"
    etc.mkdir()
    (etc / "slurm.conf").write_text("ClusterName=lab\n")
    managed = tmp_path / "managed.d"
    managed.mkdir()
    (managed / "slurm.json").write_text(
        json.dumps(
            {
                "role": "slurm",
                "files": [str(etc / "slurm.conf")],
                "packages": ["slurmd"],
                "services": ["slurmd", "x"],
            }
        )
    )
    t = {"etc": etc, "managed": managed, "gens": tmp_path / "generations", "pk": Packages(slurmd="24.11.5-1")}
    gen.record(t["gens"], t["managed"], "L1", "S1", "rev", pkg_query=t["pk"])
    return t


def _check(t: dict, fp: str = "F1", units: Units | None = None) -> list[str]:
    return state.check(t["gens"], t["managed"], fp, t["pk"], units or Units("slurmd"))


def test_mark_then_unchanged_and_mark_is_idempotent(node: dict) -> None:
    assert _check(node) == [f"no record of a complete converge ({node['gens'] / 'converged.json'})"]
    changed, rec = state.mark(node["gens"], node["managed"], "F1", active_query=Units("slurmd"))
    # only the units active at the converge are expected to stay active ("x" was not)
    assert changed and rec == {"fingerprint": "F1", "generation": 1, "services": ["slurmd"]}
    assert oct((node["gens"] / "converged.json").stat().st_mode & 0o777) == "0o600"
    assert state.mark(node["gens"], node["managed"], "F1", active_query=Units("slurmd"))[0] is False
    assert _check(node) == []


def test_a_second_mark_of_the_same_state_keeps_the_first_record(node: dict) -> None:
    """The idempotence run: the same fingerprint and generation; a unit's state flapping in between (a timer's
    oneshot, a service still starting) changes nothing."""
    state.mark(node["gens"], node["managed"], "F1", active_query=Units("slurmd"))
    before = (node["gens"] / "converged.json").read_bytes()
    changed, rec = state.mark(node["gens"], node["managed"], "F1", active_query=Units("slurmd", "x"))
    assert changed is False and rec["services"] == ["slurmd"]
    assert (node["gens"] / "converged.json").read_bytes() == before
    # a new fingerprint is a new record
    changed, rec = state.mark(node["gens"], node["managed"], "F2", active_query=Units("slurmd", "x"))
    assert changed and rec == {"fingerprint": "F2", "generation": 1, "services": ["slurmd", "x"]}


def test_only_running_services_count_not_oneshots_or_unknown_units() -> None:
    show = (
        "Id=slurmd.service\nType=simple\nActiveState=active\n\n"
        "Id=lcm-slurm-metrics.service\nType=oneshot\nActiveState=active\n\n"
        "Id=munge.service\nType=forking\nActiveState=activating\n\n"
        "Id=nope.service\nType=\nActiveState=inactive\n"
    )
    units = [
        "slurmd.service",
        "lcm-slurm-metrics.service",
        "munge.service",
        "nope.service",
        "missing.service",
    ]
    assert state.parse_show(show, units) == {
        "slurmd.service": True,
        "lcm-slurm-metrics.service": False,
        "munge.service": False,
        "nope.service": False,
        "missing.service": False,
    }
    assert state.parse_show("", ["a.service"]) == {"a.service": False}


def test_check_mode_mark_writes_nothing(node: dict) -> None:
    changed, _ = state.mark(node["gens"], node["managed"], "F1", check=True, active_query=Units())
    assert changed and not (node["gens"] / "converged.json").exists()


@pytest.mark.parametrize(
    "what", ["fingerprint", "file", "mode", "package", "service", "generation", "manifest"]
)
def test_every_change_since_the_converge_is_a_reason(node: dict, what: str) -> None:
    state.mark(node["gens"], node["managed"], "F1", active_query=Units("slurmd"))
    fp, units = "F1", Units("slurmd")
    expect = {
        "fingerprint": "inputs changed",
        "file": "drift: slurm file",
        "mode": "drift: slurm file",
        "package": "drift: slurm package slurmd",
        "service": "service slurmd is not active",
        "generation": "current generation is 2, the last converge recorded 1",
        "manifest": "drift: slurm manifest",
    }[what]
    if what == "fingerprint":
        fp = "F2"
    elif what == "file":
        (node["etc"] / "slurm.conf").write_text("ClusterName=hand-edited\n")
    elif what == "mode":
        os.chmod(node["etc"] / "slurm.conf", 0o666)
    elif what == "package":
        node["pk"].v["slurmd"] = "24.11.6-1"
    elif what == "service":
        units = Units()
    elif what == "generation":
        (node["etc"] / "slurm.conf").write_text("ClusterName=other\n")
        gen.record(node["gens"], node["managed"], "L1", "S1", "rev", pkg_query=node["pk"])
    else:
        (node["managed"] / "slurm.json").unlink()
    reasons = _check(node, fp, units)
    assert any(expect in r for r in reasons), reasons


def test_an_unreadable_record_is_a_reason_not_a_crash(node: dict) -> None:
    node["gens"].mkdir(exist_ok=True)
    (node["gens"] / "converged.json").write_text("{not json")
    reasons = _check(node)
    assert len(reasons) == 1 and "unreadable" in reasons[0]
    (node["gens"] / "converged.json").write_text('{"generation": 1}')
    assert "no fingerprint" in _check(node)[0]


def test_no_generation_at_all_is_a_reason(tmp_path: Path) -> None:
    reasons = state.check(tmp_path / "g", tmp_path / "m", "F1", Packages(), Units())
    assert reasons and "no record" in reasons[0]


# ---------------------------------------------------------------- the plays' wiring

EXCLUDE = "{{ ':!lcm_unchanged' if 'lcm_unchanged' in groups else '' }}"


def test_site_checks_after_validating_and_before_the_lab_and_every_layer() -> None:
    imports = [p["ansible.builtin.import_playbook"] for p in yaml.safe_load((ROOT / "site.yml").read_text())]
    assert imports[:3] == ["playbooks/validate.yml", "playbooks/unchanged.yml", "playbooks/lab.yml"]
    assert imports[-1] == "playbooks/generation.yml"
    for rel in imports[2:]:
        for play in yaml.safe_load((ROOT / rel).read_text()):
            if "hosts" in play:
                assert play["hosts"].endswith(EXCLUDE), (
                    f"{rel}: play {play['name']!r} does not leave out lcm_unchanged"
                )


def test_the_check_runs_whatever_the_tags_and_molecule_forces_only_the_idempotence_run(
    tmp_path: Path,
) -> None:
    """molecule's converge is a plain site.yml (it records the fingerprint), its idempotence run (the same
    playbook with --skip-tags molecule-idempotence-notest) is forced: the expression, evaluated by real
    ansible-playbook both ways."""
    (play,) = yaml.safe_load((ROOT / "playbooks/unchanged.yml").read_text())
    assert "always" in play["tags"]
    converge = yaml.safe_load((ROOT / "molecule/default/converge.yml").read_text())
    expr = converge[0]["vars"]["lcm_converge_full"]
    probe = tmp_path / "probe.yml"
    probe.write_text(yaml.safe_dump([{
        "hosts": "localhost", "gather_facts": False, "vars": {"lcm_converge_full": expr},
        "tasks": [{"ansible.builtin.debug": {"msg": "full={{ lcm_converge_full | bool }}"}}],
    }]))  # fmt: skip
    exe = str(Path(sys.executable).parent / "ansible-playbook")
    for skip, want in (([], "full=False"), (["--skip-tags", "molecule-notest,notest"], "full=False"),
                       (["--skip-tags", "molecule-idempotence-notest"], "full=True")):  # fmt: skip
        out = subprocess.run([exe, "-i", "localhost,", "-c", "local", str(probe), *skip],
                             capture_output=True, text=True, check=False, timeout=120)  # fmt: skip
        assert out.returncode == 0 and want in out.stdout, (skip, out.stdout[-1500:])
    gen_play = yaml.safe_load((ROOT / "playbooks/generation.yml").read_text())[0]
    (mark,) = [t for t in gen_play["tasks"] if t.get("lcm_converge_state", {}).get("state") == "mark"]
    assert "not ansible_check_mode" in mark["when"]
    assert "not (lcm_converge_full | default(false) | bool)" in mark["when"]
