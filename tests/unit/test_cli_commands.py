"""Every `lcm-runner` command the docs show is registered, and every subcommand works from the venv's
bin/ without activating the venv.

(a) the `lcm-runner <sub> [<subsub>] [--flags]` lines of README.md, docs/**/*.md, roles/**/*.yml,
    playbooks/*.yml, plugins/**/*.py, the report template and scripts/** (code blocks, inline code,
    argv lists) are parsed against the real argparse parser: the subcommand, its subcommand and every
    flag shown must exist;
(b) `<venv>/bin/lcm-runner <sub> [<subsub>] --help` for every registered command, with a PATH that holds
    neither the venv's bin/ nor any other ansible-inventory or lcm-runner;
(c) the cheap commands for real, the same way: spec validate, lock update, ckpt verify, render,
    nccl-profile --parse-only, report; and the documented scripts answer --help without doing any work.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from lcm_runner import cli

ROOT = Path(__file__).resolve().parents[2]
VENV_BIN = Path(sys.executable).parent  # not resolved: the venv's bin/, whose python runs this test
LCM_RUNNER = VENV_BIN / "lcm-runner"
NCCL_FIXTURES = Path(__file__).parent / "fixtures" / "nccl"

# ----------------------------------------------------------------------------- (a) the documented commands


@dataclass(frozen=True)
class Mention:
    where: str  # file:line
    tokens: tuple[str, ...]  # what follows `lcm-runner`

    def __str__(self) -> str:
        return f"{self.where}: lcm-runner {' '.join(self.tokens)}"


_CMD = re.compile(r"(?<![\w-])lcm-runner(?![\w.-])[ \t]+([^;&#\"'`()\n]*)")
_ARGV = re.compile(r"lcm-runner['\"]\s*,([^\]]*)")
_FENCE = re.compile(r"^ *```.*?$(.*?)^ *```", re.MULTILINE | re.DOTALL)
_INLINE = re.compile(r"`([^`]+)`")


def _strip_comment(line: str) -> str:
    return re.sub(r"(^|\s)#.*", "", line)


def _line_of(text: str, pos: int) -> int:
    return text.count("\n", 0, pos) + 1


def _fragments(path: Path) -> list[tuple[int, str]]:
    """(line, text) pieces of a file where a command line can appear."""
    text = path.read_text(encoding="utf-8", errors="replace")
    out: list[tuple[int, str]] = []
    rest = text
    if path.suffix == ".md" or path.name.endswith(".md.j2"):
        for m in _FENCE.finditer(text):
            first = _line_of(text, m.start(1))
            for i, line in enumerate(m.group(1).split("\n")):
                out.append((first + i, _strip_comment(line)))
        rest = _FENCE.sub(lambda m: "\n" * m.group(0).count("\n"), text)
    elif path.relative_to(ROOT).parts[0] == "scripts":
        for i, line in enumerate(text.split("\n"), 1):
            out.append((i, _strip_comment(line)))
    for m in _INLINE.finditer(rest):
        if "\n\n" not in m.group(1):
            out.append((_line_of(rest, m.start()), " ".join(m.group(1).split())))
    return out


def _mentions(path: Path) -> list[Mention]:
    rel = path.relative_to(ROOT)
    found: list[Mention] = []
    for line, frag in _fragments(path):
        for m in _CMD.finditer(frag):
            found.append(Mention(f"{rel}:{line}", tuple(m.group(1).split())))
    if path.suffix == ".yml":  # argv lists: [..., venv ~ '/bin/lcm-runner', 'all', '--config', x, ...]
        text = path.read_text(encoding="utf-8")
        for m in _ARGV.finditer(text):
            toks = tuple(re.findall(r"['\"]([^'\"]*)['\"]", m.group(1)))
            found.append(Mention(f"{rel}:{_line_of(text, m.start())}", toks))
    return found


def documented_files() -> list[Path]:
    files = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
    files += sorted((ROOT / "roles").rglob("*.yml")) + sorted((ROOT / "playbooks").glob("*.yml"))
    files += sorted((ROOT / "plugins").rglob("*.py")) + sorted(
        (ROOT / "lcm_runner" / "templates").glob("*.j2")
    )
    files += sorted(p for p in (ROOT / "scripts").rglob("*") if p.is_file())
    return files


def all_mentions() -> list[Mention]:
    return [m for f in documented_files() for m in _mentions(f)]


def _subparsers(p: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser] | None:
    for a in p._actions:
        if isinstance(a, argparse._SubParsersAction):
            return dict(a.choices)
    return None


def _options(p: argparse.ArgumentParser) -> set[str]:
    return {s for a in p._actions for s in a.option_strings}


_WORD = re.compile(r"[a-z][a-z0-9-]*(\|[a-z][a-z0-9-]*)*")
_FLAG = re.compile(r"--?[A-Za-z][\w-]*")


def check_mention(parser: argparse.ArgumentParser, m: Mention) -> list[str]:
    """Problems of one documented command line (empty when its commands and flags all exist)."""
    if not m.tokens or not _WORD.fullmatch(m.tokens[0]):
        return []  # `lcm-runner --help`, `lcm-runner <sub>`: no subcommand named
    top = _subparsers(parser) or {}
    problems = []
    for name in m.tokens[0].split("|"):
        if name not in top:
            problems.append(f"{m}: {name!r} is not an lcm-runner command (registered: {', '.join(top)})")
            continue
        target, rest = top[name], list(m.tokens[1:])
        nested = _subparsers(target)
        if nested is not None and rest and _WORD.fullmatch(rest[0]):
            if rest[0] not in nested:
                problems.append(f"{m}: 'lcm-runner {name} {rest[0]}' is not registered ({', '.join(nested)})")
                continue
            target, rest = nested[rest[0]], rest[1:]
        known = _options(target)
        for tok in rest:
            flag = tok.strip("[]|,").split("=")[0]
            if _FLAG.fullmatch(flag) and flag not in known:
                problems.append(
                    f"{m}: {flag} is not an option of 'lcm-runner {name}' ({', '.join(sorted(known))})"
                )
    return problems


MENTIONS = all_mentions()


def test_the_extractor_finds_the_documented_commands() -> None:
    """Guard against an extractor that silently finds nothing: these are known to be in the docs."""
    seen = {m.tokens[:2] for m in MENTIONS} | {m.tokens[:1] for m in MENTIONS}
    for want in [
        ("spec", "validate"),
        ("lock", "update"),
        ("ckpt", "verify"),
        ("render",),
        ("report",),
        ("train",),
        ("all",),
        ("nccl-profile", "--parse-only"),
        ("baseline|resume|fault|nccl-profile|report",),
    ]:
        assert want in seen, f"no `lcm-runner {' '.join(want)}` found in the docs any more"
    wheres = {m.where.split(":")[0] for m in MENTIONS}
    assert {"README.md", "roles/_artifacts/tasks/preflight.yml", "roles/lcm_runner/tasks/train.yml"} <= wheres
    assert any(w.startswith("scripts/") for w in wheres)


@pytest.mark.parametrize("mention", MENTIONS, ids=lambda m: m.where)
def test_documented_command_is_registered(mention: Mention) -> None:
    assert check_mention(cli.build_parser(), mention) == []


def test_checker_catches_a_wrong_command_and_a_wrong_flag() -> None:
    ap = cli.build_parser()
    assert check_mention(ap, Mention("x:1", ("spec", "validate", "-i", "inventories/lab"))) == []
    assert check_mention(ap, Mention("x:1", ("lock", "update", "d", "[--lock", "l]", "[--dry-run]"))) == []
    assert "not an lcm-runner command" in check_mention(ap, Mention("x:1", ("speck", "validate")))[0]
    assert "is not registered" in check_mention(ap, Mention("x:1", ("lock", "upgrade")))[0]
    assert (
        "--inventroy is not an option" in check_mention(ap, Mention("x:1", ("render", "--inventroy", "i")))[0]
    )


def test_inline_code_across_a_line_break_is_read(tmp_path: Path) -> None:
    doc = ROOT / "README.md"
    got = [m for m in _mentions(doc) if m.tokens[:2] == ("spec", "validate")]
    assert any("inventories/<name>" in m.tokens for m in got), got


# ----------------------------------------------------------------------------- (b) --help without activation


def _path_without_venv() -> str:
    """PATH minus the venv's bin/ and minus any directory with an ansible-inventory or lcm-runner."""
    keep = []
    for d in os.environ.get("PATH", "").split(os.pathsep):
        if not d:
            continue
        p = Path(d)
        if p.resolve() == VENV_BIN.resolve():
            continue
        if (p / "ansible-inventory").exists() or (p / "lcm-runner").exists():
            continue
        keep.append(d)
    for d in ("/usr/bin", "/bin"):  # python3 for the lab's dynamic inventory (#!/usr/bin/env python3)
        if d not in keep and not (Path(d) / "ansible-inventory").exists():
            keep.append(d)
    return os.pathsep.join(keep)


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONPATH", "PYTHONHOME")}
    env["PATH"] = _path_without_venv()
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    return env


def run_cli(*args: str, cwd: Path = ROOT, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """`<venv>/bin/lcm-runner args...` as a user who did not activate the venv."""
    return subprocess.run(
        [str(LCM_RUNNER), *args], cwd=cwd, env=_env(), capture_output=True, text=True, timeout=timeout
    )


def registered_commands() -> list[tuple[str, ...]]:
    top = _subparsers(cli.build_parser()) or {}
    out: list[tuple[str, ...]] = []
    for name, p in top.items():
        out.append((name,))
        out += [(name, s) for s in (_subparsers(p) or {})]
    return out


needs_venv_cli = pytest.mark.skipif(
    not LCM_RUNNER.is_file(), reason=f"no {LCM_RUNNER} (run scripts/bootstrap)"
)


def test_the_restricted_path_really_has_no_venv() -> None:
    path = _path_without_venv()
    assert str(VENV_BIN) not in path.split(os.pathsep)
    assert shutil.which("ansible-inventory", path=path) is None
    assert shutil.which("lcm-runner", path=path) is None


def test_every_documented_kind_of_command_is_registered() -> None:
    cmds = set(registered_commands())
    for want in [("spec", "validate"), ("spec", "docs"), ("lock", "update"), ("ckpt", "verify")]:
        assert want in cmds
    for name in ("render", "report", "train", "baseline", "resume", "fault", "nccl-profile", "all"):
        assert (name,) in cmds


def test_every_external_module_imports_here(capsys: pytest.CaptureFixture[str]) -> None:
    """In the project venv nothing is a stub: every EXTERNAL module imported and registered itself."""
    top = _subparsers(cli.build_parser()) or {}
    assert set(cli.EXTERNAL) <= set(top)
    assert "warning" not in capsys.readouterr().err
    for name in cli.EXTERNAL:
        assert top[name].get_default("unavailable") is None, top[name].get_default("unavailable")


@needs_venv_cli
@pytest.mark.parametrize("cmd", registered_commands(), ids=" ".join)
def test_help_works_without_activation(cmd: tuple[str, ...], tmp_path: Path) -> None:
    r = run_cli(*cmd, "--help", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith(f"usage: lcm-runner {' '.join(cmd)}"), r.stdout[:200]
    assert r.stderr == ""


@needs_venv_cli
def test_top_level_help_lists_spec_and_lock_and_no_stub(tmp_path: Path) -> None:
    r = run_cli("--help", cwd=tmp_path)
    assert r.returncode == 0 and r.stderr == ""
    for name in ("spec", "lock", "ckpt", "render", "report", "train", "nccl-profile"):
        assert re.search(rf"^\s+{re.escape(name)}\b", r.stdout, re.MULTILINE), name
    assert "UNAVAILABLE" not in r.stdout


@needs_venv_cli
def test_module_fallback_without_activation(tmp_path: Path) -> None:
    """`<venv>/bin/python -m lcm_runner spec validate ...`: the fallback the issue saw crash."""
    r = subprocess.run(
        [str(VENV_BIN / "python"), "-m", "lcm_runner", "spec", "validate", str(ROOT / "inventories" / "lab")],
        cwd=tmp_path,
        env=_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 0, r.stderr
    assert "cluster spec 'lab' valid" in r.stdout and "Traceback" not in r.stderr


# ----------------------------------------------------------------------------- (c) the cheap ones, for real


@needs_venv_cli
@pytest.mark.parametrize("form", [("inventories/lab",), ("-i", "inventories/lab")], ids=["positional", "-i"])
def test_spec_validate_lab(form: tuple[str, ...]) -> None:
    r = run_cli("spec", "validate", *form)
    assert r.returncode == 0, r.stderr
    lock = "inventories/lab/group_vars/all/lock.yml"
    assert r.stdout.strip() == f"inventories/lab: cluster spec 'lab' valid with the lock {lock}"


@needs_venv_cli
def test_spec_validate_checks_the_lock_the_layers_need(tmp_path: Path) -> None:
    """example-h200 turns the GPU layer on: a lock without the driver entry is refused, naming it."""
    doc = yaml.safe_load((ROOT / "versions.lock.yml").read_text())
    del doc["lcm_lock"]["artifacts"]["nvidia_driver"]
    lock = tmp_path / "lock.yml"
    lock.write_text(yaml.safe_dump(doc))
    ok = run_cli("spec", "validate", "inventories/example-h200")
    assert ok.returncode == 0, ok.stderr
    r = run_cli("spec", "validate", "inventories/example-h200", "--lock", str(lock))
    assert r.returncode == 2, r.stdout
    assert "nvidia_driver" in r.stderr and "Traceback" not in r.stderr


def _lab_copy(tmp_path: Path) -> Path:
    inv = tmp_path / "inventories" / "lab"
    shutil.copytree(ROOT / "inventories" / "lab", inv, symlinks=True)
    return inv


@needs_venv_cli
def test_spec_validate_broken_copy_names_the_field(tmp_path: Path) -> None:
    inv = _lab_copy(tmp_path)
    spec = inv / "group_vars" / "all" / "cluster.yml"
    doc = yaml.safe_load(spec.read_text())
    doc["cluster"]["gpu"]["model"] = "a100"
    spec.write_text(yaml.safe_dump(doc))
    r = run_cli("spec", "validate", "-i", str(inv))
    assert r.returncode == 2
    assert "cluster.gpu.model" in r.stderr and "a100" in r.stderr and "Traceback" not in r.stderr


@needs_venv_cli
def test_spec_validate_missing_inventory_is_one_line(tmp_path: Path) -> None:
    r = run_cli("spec", "validate", str(tmp_path / "nope"))
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert "nope" in r.stderr


def test_spec_validate_without_ansible_inventory_anywhere(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(shutil, "which", lambda *_a, **_k: None)
    monkeypatch.setattr(sys, "executable", str(tmp_path / "bin" / "python"))
    assert cli.main(["spec", "validate", str(ROOT / "inventories" / "lab")]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1, err
    assert "ansible-inventory not found" in err and "scripts/bootstrap" in err and "--no-inventory" in err
    # --no-inventory needs no ansible-inventory
    assert cli.main(["spec", "validate", "--no-inventory", str(ROOT / "inventories" / "lab")]) == 0


def test_spec_validate_needs_exactly_one_inventory(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["spec", "validate"]) == 2
    assert cli.main(["spec", "validate", "inventories/lab", "-i", "inventories/lab"]) == 2
    assert "give the inventory once" in capsys.readouterr().err


@needs_venv_cli
def test_lock_update_hashes_a_file(tmp_path: Path) -> None:
    lock = tmp_path / "versions.lock.yml"
    shutil.copy(ROOT / "versions.lock.yml", lock)
    arts = yaml.safe_load(lock.read_text())["lcm_lock"]["artifacts"]
    name = next(n for n, a in arts.items() if a.get("sha256") is None)
    dl = tmp_path / "dl"
    dl.mkdir()
    (dl / arts[name]["filename"]).write_bytes(b"artifact bytes for the test")
    digest = hashlib.sha256(b"artifact bytes for the test").hexdigest()
    r = run_cli("lock", "update", str(dl), "--lock", str(lock), "--dry-run")
    assert r.returncode == 0, r.stderr
    assert digest in r.stdout and "would update 1 artifact(s)" in r.stdout
    assert yaml.safe_load(lock.read_text())["lcm_lock"]["artifacts"][name]["sha256"] is None
    r = run_cli("lock", "update", str(dl), "--lock", str(lock))
    assert r.returncode == 0, r.stderr
    assert f"{name}: {arts[name]['filename']}" in r.stdout and "(unlocked)" in r.stdout
    assert yaml.safe_load(lock.read_text())["lcm_lock"]["artifacts"][name]["sha256"] == digest


@needs_venv_cli
def test_lock_update_refuses_an_unknown_file(tmp_path: Path) -> None:
    lock = tmp_path / "versions.lock.yml"
    shutil.copy(ROOT / "versions.lock.yml", lock)
    before = lock.read_text()
    (tmp_path / "dl").mkdir()
    (tmp_path / "dl" / "whatever-1.0.tar.gz").write_bytes(b"x")
    r = run_cli("lock", "update", str(tmp_path / "dl"), "--lock", str(lock))
    assert r.returncode == 2 and "matches no artifact" in r.stderr and "Traceback" not in r.stderr
    assert lock.read_text() == before


@needs_venv_cli
@pytest.mark.parametrize("kind", ["missing", "empty"])
def test_ckpt_verify_without_checkpoints_is_a_clear_error(kind: str, tmp_path: Path) -> None:
    d = tmp_path / "save"
    if kind == "empty":
        d.mkdir()
    r = run_cli("ckpt", "verify", str(d))
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1
    assert ("not a directory" if kind == "missing" else "no checkpoint") in r.stderr


@needs_venv_cli
def test_render_into_a_tmp_dir(tmp_path: Path) -> None:
    out = tmp_path / "run"
    r = run_cli("render", "-i", "inventories/lab", "-c", "configs/lab.yml", "--run-dir", str(out))
    assert r.returncode == 0, r.stderr
    assert (out / "train_2node.sbatch").is_file() and (out / "nccl_env.sh").is_file()
    assert "#SBATCH" in (out / "train_2node.sbatch").read_text()


@needs_venv_cli
def test_nccl_profile_parse_only_on_the_fixture_logs(tmp_path: Path) -> None:
    logs = NCCL_FIXTURES / "h200x2-shm"
    assert sorted(logs.glob("nccl.*.log")), "fixture logs missing"
    r = run_cli("nccl-profile", "--parse-only", str(logs))  # no -c needed to parse
    assert r.returncode in (0, 1), r.stderr  # the verdict is the parser's
    assert "NCCL logs: 2 file(s)" in r.stdout and "verdict:" in r.stdout
    r = run_cli("nccl-profile", "--parse-only", str(tmp_path / "none"))
    assert r.returncode == 2 and "Traceback" not in r.stderr


@needs_venv_cli
def test_nccl_profile_without_config_or_parse_only() -> None:
    r = run_cli("nccl-profile")
    assert r.returncode == 2 and "--config/-c is required" in r.stderr


@needs_venv_cli
def test_report_on_a_missing_run_dir(tmp_path: Path) -> None:
    r = run_cli("report", "--run-dir", str(tmp_path / "nope"))
    assert r.returncode == 2 and "Traceback" not in r.stderr


# ----------------------------------------------------------------------------- a module that cannot load


def test_missing_dependency_gives_a_one_line_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "lcm_fake_trainer.py").write_text("import torch\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setitem(sys.modules, "torch", None)  # import torch -> ModuleNotFoundError(name='torch')
    monkeypatch.setitem(cli.EXTERNAL, "fake-train", "lcm_fake_trainer")
    ap = cli.build_parser()
    assert "warning" not in capsys.readouterr().err  # a missing optional dependency is not a bug
    stub = (_subparsers(ap) or {})["fake-train"]
    assert "needs the Python module 'torch'" in stub.get_default("unavailable")
    assert cli.main(["fake-train", "--help"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1
    assert err.startswith(
        "lcm-runner fake-train: unavailable: lcm_fake_trainer needs the Python module 'torch'"
    )
    assert "pip install -e '.[train]'" in err  # the extra of pyproject.toml that provides torch


def test_a_broken_project_module_is_loud(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setitem(cli.EXTERNAL, "bogus", "lcm_runner.no_such_module")
    cli.build_parser()
    err = capsys.readouterr().err
    assert "warning: `lcm-runner bogus` unavailable: lcm_runner.no_such_module failed to import" in err
    assert cli.main(["bogus", "x"]) == 2
    assert "lcm-runner bogus: unavailable: lcm_runner.no_such_module" in capsys.readouterr().err


# ----------------------------------------------------------------------------- the scripts README documents


def _script(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(ROOT / "scripts" / args[0]), *args[1:]],
        cwd=ROOT,
        env=_env(),
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_readme_scripts_exist() -> None:
    readme = (ROOT / "README.md").read_text()
    named = set(re.findall(r"scripts/([\w-]+)", readme))
    assert {"lab", "test", "bootstrap", "gen-spec-docs", "faults"} <= named
    for name in named:
        p = ROOT / "scripts" / name
        assert p.is_file() and os.access(p, os.X_OK), f"README names scripts/{name}"


@pytest.mark.parametrize(
    ("argv", "rc"),
    [
        (("lab",), 2),
        (("lab", "--help"), 0),
        (("lab", "sideways"), 2),
        (("lab", "up", "now"), 2),
        (("test", "--help"), 0),
        (("test", "--everything"), 2),
        (("bootstrap", "--help"), 0),
        (("bootstrap", "-x"), 2),
        (("faults", "--help"), 2),
    ],
    ids=lambda v: " ".join(v) if isinstance(v, tuple) else f"rc{v}",
)
def test_script_usage_without_doing_anything(argv: tuple[str, ...], rc: int) -> None:
    """Only the usage line: no bootstrap, no playbook, no pytest (all of those print before working)."""
    r = _script(*argv)
    assert r.returncode == rc, r.stdout + r.stderr
    out = r.stdout + r.stderr
    assert f"usage: scripts/{argv[0]}" in out
    assert "[bootstrap]" not in out and "PLAY" not in out and "=====" not in out
    if rc == 0:
        assert r.stdout.startswith("usage:")


def test_gen_spec_docs_help_without_activation() -> None:
    r = _script("gen-spec-docs", "--help")
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("usage: gen-spec-docs")
