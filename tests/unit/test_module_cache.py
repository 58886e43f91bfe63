"""roles/common's bytecode cache for Ansible module payloads (templates/lcm_module_cache.py.j2).

The role's own tasks (tasks/module_cache.yml) install the path hook into the site directory of a throwaway
venv, which then serves as the node interpreter (ansible_python_interpreter) of real ansible-playbook runs:
the modules of those runs go through the hook, so what is tested is what a node does on every task.
"""

from __future__ import annotations

import hashlib
import marshal
import os
import stat
import subprocess
import sys
import types
import zipfile
from importlib.util import MAGIC_NUMBER
from pathlib import Path

import ansible
import pytest
from _role_run import run_role


def _venv(root: Path) -> tuple[Path, Path]:
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(root)], check=True)
    python = root / "bin" / "python"
    site = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        check=True, capture_output=True, text=True,
    ).stdout.strip()  # fmt: skip
    return python, Path(site)


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("module-cache")
    python, site = _venv(root / "venv")
    return {
        "root": root,
        "python": python,
        "site": site,
        "cache": root / "cache",
        "tmpfiles": root / "tmpfiles.conf",
    }


def _vars(node: dict[str, Path], **over: object) -> dict[str, object]:
    return {
        "common_module_cache": True,
        "ansible_python_interpreter": str(node["python"]),
        "_common_module_cache_dir": str(node["cache"]),
        "_common_module_cache_site": str(node["site"]),
        "_common_module_cache_tmpfiles": str(node["tmpfiles"]),
    } | over


def _entries(cache: Path) -> dict[str, tuple[int, float]]:
    return {p.name: (p.stat().st_ino, p.stat().st_mtime) for p in cache.iterdir()}


def test_the_role_installs_the_hook_and_every_later_module_compiles_from_the_cache(
    node: dict[str, Path], tmp_path: Path
) -> None:
    first = run_role("common", tmp_path, _vars(node), tasks_from="module_cache")
    assert first.rc == 0, first.stdout[-3000:]
    assert stat.S_IMODE(node["cache"].stat().st_mode) == 0o700
    assert (node["site"] / "lcm-module-cache.pth").read_text() == "import lcm_module_cache\n"
    hook = (node["site"] / "lcm_module_cache.py").read_text()
    assert f"_DIR = {str(node['cache'])!r}".replace("'", '"') in hook
    assert node["tmpfiles"].read_text() == f"d {node['cache']} 0700 root root 30d\n"
    # the tasks after the .pth was written already ran their modules through it
    entries = _entries(node["cache"])
    assert len(entries) >= 10, entries
    assert all(len(name) == 64 and set(name) <= set("0123456789abcdef") for name in entries)
    # keyed by the interpreter's magic number and the source: basic.py as the controller ships it
    basic = Path(ansible.__file__).parent / "module_utils" / "basic.py"
    assert hashlib.sha256(MAGIC_NUMBER + basic.read_bytes()).hexdigest() in entries

    again = run_role("common", tmp_path, _vars(node), tasks_from="module_cache")
    assert again.rc == 0 and again.changed == 0, again.stdout[-3000:]
    # the second run's modules were served from the cache: no entry rewritten (the role's first tasks,
    # which ran before the hook existed, add the files only their modules import)
    after = _entries(node["cache"])
    assert {k: after[k] for k in entries} == entries
    third = run_role("common", tmp_path, _vars(node), tasks_from="module_cache")
    assert third.rc == 0 and third.changed == 0, third.stdout[-3000:]
    assert _entries(node["cache"]) == after


def test_damaged_entries_are_compiled_again_and_the_tasks_still_run(
    node: dict[str, Path], tmp_path: Path
) -> None:
    assert run_role("common", tmp_path, _vars(node), tasks_from="module_cache").rc == 0
    damaged = sorted(node["cache"].iterdir())
    assert damaged
    for i, p in enumerate(damaged):  # truncated, garbage, empty, a valid marshal of a non-code value
        p.write_bytes([b"\xe3\x00\x00", b"not marshal data", b"", b"i\x01\x00\x00\x00"][i % 4])
    run = run_role("common", tmp_path, _vars(node), tasks_from="module_cache")
    assert run.rc == 0 and run.changed == 0, run.stdout[-3000:]
    # basic.py, which every module imports, was compiled again and its entry replaced by a valid one
    basic = Path(ansible.__file__).parent / "module_utils" / "basic.py"
    entry = node["cache"] / hashlib.sha256(MAGIC_NUMBER + basic.read_bytes()).hexdigest()
    assert entry in damaged
    assert isinstance(marshal.loads(entry.read_bytes()), types.CodeType)


@pytest.mark.parametrize("unsafe", ["group-writable", "other-owner"])
def test_a_cache_directory_others_may_write_is_not_used(tmp_path: Path, unsafe: str) -> None:
    python, site = _venv(tmp_path / "venv")
    cache = tmp_path / "cache"
    own = {"root": tmp_path, "python": python, "site": site, "cache": cache, "tmpfiles": tmp_path / "t.conf"}
    assert run_role("common", tmp_path, _vars(own), tasks_from="module_cache").rc == 0
    assert list(cache.iterdir())
    for p in cache.iterdir():
        p.unlink()
    if unsafe == "group-writable":
        cache.chmod(0o770)
    else:
        os.chown(cache, 65534, 65534)
    # a module through the hook (the role itself would put the directory back to root 0700)
    env = {k: v for k, v in os.environ.items() if not k.startswith("ANSIBLE_")}
    probe = subprocess.run(
        [str(Path(sys.executable).parent / "ansible"), "localhost", "-c", "local", "-i", "localhost,",
         "-m", "ansible.builtin.stat", "-a", "path=/", "-e", f"ansible_python_interpreter={python}"],
        capture_output=True, text=True, check=False, env=env | {"ANSIBLE_LOCAL_TEMP": str(tmp_path / ".tmp")},
    )  # fmt: skip
    assert probe.returncode == 0 and '"exists": true' in probe.stdout, probe.stdout + probe.stderr
    assert list(cache.iterdir()) == []


def test_only_module_payloads_are_served_by_the_hook(node: dict[str, Path], tmp_path: Path) -> None:
    assert run_role("common", tmp_path, _vars(node), tasks_from="module_cache").rc == 0
    for name in ("plain.zip", "x_payload.zip"):
        with zipfile.ZipFile(tmp_path / name, "w") as z:
            z.writestr("pkg/__init__.py", "X = 1\n")
            z.writestr(
                "pkg/mod.py",
                "import pkg\nY = pkg.X + 1\n\ndef boom():\n    raise ValueError('from the zip')\n",
            )
    code = (
        "import sys, traceback; sys.path.insert(0, sys.argv[1]); import pkg.mod\n"
        "print(pkg.mod.Y, type(pkg.mod.__loader__).__name__, pkg.mod.__file__)\n"
        "try:\n    pkg.mod.boom()\nexcept ValueError:\n    traceback.print_exc(file=sys.stdout)\n"
    )
    out = {}
    for name in ("plain.zip", "x_payload.zip"):
        for _ in range(2):  # the second time from the cache
            p = subprocess.run(
                [str(node["python"]), "-c", code, str(tmp_path / name)], capture_output=True, text=True
            )
            assert p.returncode == 0, p.stderr
            out.setdefault(name, []).append(p.stdout)
    assert out["plain.zip"][0].startswith(f"2 zipimporter {tmp_path}/plain.zip/pkg/mod.py")
    for text in out["x_payload.zip"]:
        assert text.startswith(f"2 _PayloadImporter {tmp_path}/x_payload.zip/pkg/mod.py")
        # tracebacks still show the source line (linecache asks the loader)
        assert "raise ValueError('from the zip')" in text
    assert out["x_payload.zip"][0] == out["x_payload.zip"][1]


def test_off_removes_the_hook_its_pth_and_the_cache(node: dict[str, Path], tmp_path: Path) -> None:
    site, cache = tmp_path / "site", tmp_path / "cache"
    on = _vars(node, _common_module_cache_site=str(site), _common_module_cache_dir=str(cache),
               _common_module_cache_tmpfiles=str(tmp_path / "t.conf"))  # fmt: skip
    assert run_role("common", tmp_path, on, tasks_from="module_cache").rc == 0
    assert (site / "lcm-module-cache.pth").exists() and cache.is_dir()
    off = run_role("common", tmp_path, on | {"common_module_cache": False}, tasks_from="module_cache")
    assert off.rc == 0, off.stdout[-3000:]
    assert not (site / "lcm-module-cache.pth").exists()
    assert not (site / "lcm_module_cache.py").exists()
    assert not (tmp_path / "t.conf").exists() and not cache.exists()
