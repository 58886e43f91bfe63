"""Runner layer (roles/lcm_runner) on every cluster node: the trainer venv, its imports, the CLI.

Run: pytest tests/infra/test_runner.py --hosts=ansible://all --ansible-inventory=inventories/<name>
"""

from __future__ import annotations

import json
import shlex
from typing import Any

import pytest
import yaml
from conftest import REPO, cluster_spec, role_var

IMPORT_CHECK = (REPO / "roles/lcm_runner/files/import_check.py").read_text(encoding="utf-8")


def _pins(lock_file: str) -> dict[str, str]:
    pins = {}
    for line in (REPO / "requirements" / lock_file).read_text(encoding="utf-8").splitlines():
        line = line.split("#", 1)[0].strip()
        if "==" in line:
            name, version = line.split("==", 1)
            pins[name.strip().lower()] = version.strip()
    return pins


@pytest.fixture
def venv(host: Any) -> str:
    if not cluster_spec(host)["layers"].get("runner", False):
        pytest.skip("cluster.layers.runner is off")
    return role_var(host, "lcm_runner", "lcm_runner_venv")


def test_venv_exists(host: Any, venv: str) -> None:
    python = host.file(f"{venv}/bin/python")
    assert python.exists and python.is_executable
    assert host.file(f"{venv}/.lcm_runner_install.json").exists


def _bundle_dir(host: Any) -> str:
    """lcm_runner_venv_bundle_dir as the role resolves it (the inventory's, or the default's rule)."""
    from conftest import host_vars

    if "lcm_runner_venv_bundle_dir" in host_vars(host):
        return str(host_vars(host)["lcm_runner_venv_bundle_dir"])
    spec = cluster_spec(host)
    mount = spec.get("storage", {}).get("mountpoint") or ""
    return f"{mount}/.lcm/venv-bundles" if spec["layers"].get("storage") and mount else ""


def test_the_venv_came_from_pip_once_per_bundle(host: Any, venv: str) -> None:
    """With a bundle directory (the shared storage) the venv's third-party part was installed by pip once
    and unpacked elsewhere: the install stamp names the bundle this node's venv came from, and that bundle
    is there with its recorded sha256."""
    stamp = json.loads(host.file(f"{venv}/.lcm_runner_install.json").content_string)
    came = str(stamp.get("venv_from", ""))
    where = _bundle_dir(host)
    if not where:
        assert came.startswith("pip"), stamp
        return
    assert came.startswith("bundle venv-"), stamp
    name = came.split()[1]
    tar = host.file(f"{where}/{name}")
    assert tar.exists and host.file(f"{where}/{name}.sha256").exists, f"{where}/{name}"
    recorded = host.file(f"{where}/{name}.sha256").content_string.strip()
    assert (
        len(recorded) == 64
        and host.check_output(f"sha256sum < {shlex.quote(tar.path)}").split()[0] == recorded
    )


def test_trainer_imports_work_in_the_venv(host: Any, venv: str) -> None:
    out = host.check_output(f"{venv}/bin/python -W ignore -c {shlex.quote(IMPORT_CHECK)}")
    torch_pin = _pins("node.lock")["torch"]
    mcore_pin = _pins("megatron.lock")["megatron-core"]
    assert f"torch {torch_pin}" in out, out
    assert f"megatron-core {mcore_pin}" in out, out
    assert "lcm_runner " in out, out


def test_installed_versions_match_the_locks(host: Any, venv: str) -> None:
    frozen = {}
    for line in host.check_output(
        f"{venv}/bin/python -m pip freeze --disable-pip-version-check"
    ).splitlines():
        if "==" in line:
            name, version = line.split("==", 1)
            frozen[name.lower().replace("_", "-")] = version
    for name, version in (_pins("node.lock") | _pins("megatron.lock")).items():
        got = frozen.get(name.replace("_", "-"))
        assert got is not None, f"{name} not installed in {venv}"
        assert got.split("+")[0] == version, f"{name} {got} installed, lock pins {version}"


def test_cli_answers_help(host: Any, venv: str) -> None:
    for cli in (f"{venv}/bin/lcm-runner", "/usr/local/bin/lcm-runner"):
        result = host.run(f"{cli} --help")
        assert result.rc == 0, result.stderr
        assert "usage" in result.stdout.lower()


def test_spec_on_the_node_is_the_inventory_spec(host: Any, venv: str) -> None:
    home = role_var(host, "lcm_runner", "lcm_runner_home")
    on_node = yaml.safe_load(host.file(f"{home}/cluster.yml").content_string)
    assert on_node == {"cluster": cluster_spec(host)}


def test_managed_manifest(host: Any, venv: str) -> None:
    manifest = json.loads(host.file("/var/lib/lcm/managed.d/lcm_runner.json").content_string)
    assert manifest["role"] == "lcm_runner"
    assert manifest["packages"] == ["python3-venv"]
    for path in manifest["files"]:
        assert host.file(path).exists, path
