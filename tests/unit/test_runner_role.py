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
