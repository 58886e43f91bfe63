"""roles/lcm_runner preflight, run for real on localhost: the install key and the pip-path check.

The install itself (venv + torch + megatron-core + the wheel) is exercised on the lab by the runner layer
and checked by tests/infra/test_runner.py.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from _role_run import REPO, run_role, spec


def _source(tmp_path: Path) -> Path:
    """A snapshot of the checkout's package + locks (the live tree may change under a running test)."""
    src = tmp_path / "src"
    if not src.exists():
        shutil.copytree(REPO / "lcm_runner", src / "lcm_runner", ignore=shutil.ignore_patterns("__pycache__"))
        shutil.copytree(REPO / "requirements", src / "requirements")
        shutil.copy(REPO / "pyproject.toml", src / "pyproject.toml")
    return src


def _preflight(tmp_path: Path, **extra):
    base = {
        "cluster": spec(),
        "lcm_runner_source_dir": str(_source(tmp_path)),
        "lcm_runner_home": str(tmp_path / "opt"),
        "lcm_runner_venv": str(tmp_path / "opt/venv"),
        "lcm_runner_build_dir": str(tmp_path / "build"),
    }
    return run_role("lcm_runner", tmp_path, base | extra, tags="lcm_runner_preflight")


def _keys(run) -> tuple[str, str, str]:
    facts = run.task("Compute the source hash")["ansible_facts"]
    return facts["_lcm_runner_src_key"], facts["_lcm_runner_key"], facts["_lcm_runner_deps_key"]


def test_install_key_follows_pip_options_and_source_key_does_not(tmp_path):
    a = _preflight(tmp_path)
    b = _preflight(tmp_path)
    c = _preflight(tmp_path, lcm_runner_pip_index_url="http://127.0.0.1:9/simple")
    for run in (a, b, c):
        assert run.rc == 0, run.failed_msgs or run.stderr[-2000:]
    assert _keys(a) == _keys(b), "same inputs, same keys: a second converge installs nothing"
    assert _keys(a)[0] == _keys(c)[0], "the wheel does not depend on pip options"
    assert _keys(a)[1] != _keys(c)[1], "another index means another install"
    (tmp_path / "src/requirements/node.lock").write_text("torch==2.13.0\n")
    d = _preflight(tmp_path)
    assert _keys(d)[0] == _keys(a)[0] and _keys(d)[1] != _keys(a)[1], "a lock change means another install"
    (tmp_path / "src/lcm_runner/__init__.py").write_text('__version__ = "0.1.1"\n')
    e = _preflight(tmp_path)
    assert _keys(e)[0] != _keys(d)[0], "a source change means another wheel"
    assert _keys(e)[2] == _keys(d)[2], "... but not another pip install of torch and megatron-core"


def test_preflight_names_a_missing_find_links_folder(tmp_path):
    run = _preflight(
        tmp_path, lcm_runner_pip_find_links=[str(tmp_path / "no-wheels"), "https://mirror.invalid/w"]
    )
    assert run.rc != 0
    assert run.failed_msgs == [
        f"localhost lacks {tmp_path / 'no-wheels'} (from lcm_runner_pip_find_links / lcm_runner_pip_cert); "
        "mount or copy it onto the node, or change the variable."
    ]


def test_preflight_rejects_a_relative_venv(tmp_path):
    run = _preflight(tmp_path, lcm_runner_venv="opt/venv")
    assert run.rc != 0
    assert "lcm_runner_venv (opt/venv)" in " ".join(run.failed_msgs)


def _verify(tmp_path: Path, key: str, pyver: str = "3.11"):
    """tasks/run.yml alone, with a venv whose python and CLI are scripts that log each start."""
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True, exist_ok=True)
    log = tmp_path / "starts.log"
    for name, out in (
        ("python", "python 3.11 torch 2.x megatron-core 0.x lcm_runner 0.x"),
        ("cli", "usage: lcm-runner"),
    ):
        script = venv / "bin" / name
        script.write_text(f'#!/bin/sh\necho {name} >> {log}\necho "{out}"\n')
        script.chmod(0o755)
    extra = {
        "lcm_runner_venv": str(venv),
        "_lcm_runner_bin_link": str(venv / "bin/cli"),
        "_lcm_runner_key": key,
        "_lcm_runner_pyver": {"stdout": pyver},
    }
    run = run_role("lcm_runner", tmp_path, extra, tasks_from="run")
    assert run.rc == 0, run.failed_msgs or run.stderr[-2000:]
    starts = log.read_text().split() if log.exists() else []
    log.unlink(missing_ok=True)
    return run, starts


def test_the_venv_is_verified_once_per_install_key_and_python(tmp_path):
    run, starts = _verify(tmp_path, "k1")
    assert starts == ["python", "cli"] and run.changed == 1, (
        "a new install: imports and CLI checked, recorded"
    )
    assert (tmp_path / "venv/.lcm_runner_verified").read_text() == "k1 python 3.11\n"
    run, starts = _verify(tmp_path, "k1")
    assert starts == [] and run.changed == 0, "the same install: no torch start on a no-op converge"
    _, starts = _verify(tmp_path, "k2")
    assert starts == ["python", "cli"], "another install key: verified again"
    _, starts = _verify(tmp_path, "k2", pyver="3.13")
    assert starts == ["python", "cli"], "another node Python: verified again"
    (tmp_path / "venv/.lcm_runner_verified").unlink()
    _, starts = _verify(tmp_path, "k2", pyver="3.13")
    assert starts == ["python", "cli"], (
        "a venv without the record (a new venv from the bundle): verified again"
    )


def test_a_failed_verification_records_nothing_and_the_next_converge_checks_again(tmp_path):
    _verify(tmp_path, "k1")
    good = (tmp_path / "venv/bin/python").read_text()
    (tmp_path / "venv/bin/python").write_text("#!/bin/sh\necho 'ModuleNotFoundError: torch' >&2\nexit 1\n")
    extra = {
        "lcm_runner_venv": str(tmp_path / "venv"),
        "_lcm_runner_bin_link": str(tmp_path / "venv/bin/cli"),
        "_lcm_runner_key": "k2",
        "_lcm_runner_pyver": {"stdout": "3.11"},
    }
    run = run_role("lcm_runner", tmp_path, extra, tasks_from="run")
    assert run.rc != 0 and "ModuleNotFoundError" in str(run.task("Import megatron.core"))
    assert (tmp_path / "venv/.lcm_runner_verified").read_text() == "k1 python 3.11\n", "k2 not recorded"
    (tmp_path / "venv/bin/python").write_text(good)
    _, starts = _verify(tmp_path, "k2")
    assert starts == ["python", "cli"], "the failed install key is checked again by the next converge"
