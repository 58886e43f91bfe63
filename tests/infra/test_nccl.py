"""NCCL layer (roles/nccl) on every cluster node: /etc/nccl.conf and nccl_env.sh agree with the spec and
with each other; nccl_env.sh is exactly the runner template's rendering (one source).

Run: pytest tests/infra/test_nccl.py --hosts=ansible://all --ansible-inventory=inventories/<name>
"""

from __future__ import annotations

from typing import Any

import jinja2
import pytest
from conftest import REPO, cluster_spec, role_var

CONF = "/etc/nccl.conf"
ENV = "/etc/profile.d/nccl_env.sh"


@pytest.fixture
def spec(host: Any) -> dict[str, Any]:
    spec = cluster_spec(host)
    if not spec["layers"].get("nccl", False):
        pytest.skip("cluster.layers.nccl is off")
    return spec


def _conf(host: Any) -> dict[str, str]:
    out = {}
    for line in host.file(CONF).content_string.splitlines():
        if line.strip() and not line.startswith("#"):
            name, value = line.split("=", 1)
            out[name] = value
    return out


def test_files_exist(host: Any, spec: dict[str, Any]) -> None:
    for path in (CONF, ENV):
        f = host.file(path)
        assert f.exists and f.user == "root" and f.mode == 0o644, path


def test_nccl_env_is_the_runner_templates_rendering(host: Any, spec: dict[str, Any]) -> None:
    env = jinja2.Environment(trim_blocks=True, undefined=jinja2.StrictUndefined)
    template = env.from_string((REPO / "lcm_runner/templates/nccl_env.sh.j2").read_text(encoding="utf-8"))
    expected = template.render(
        cluster=spec,
        nccl_debug=role_var(host, "nccl", "nccl_debug"),
        nccl_extra_env=role_var(host, "nccl", "nccl_extra_env"),
    )
    assert host.file(ENV).content_string == expected


def test_conf_follows_the_spec(host: Any, spec: dict[str, Any]) -> None:
    conf = _conf(host)
    fabric = spec["fabric"]
    assert conf["NCCL_SOCKET_IFNAME"] == fabric["socket_ifname"]
    if fabric["type"] == "ethernet":
        assert conf["NCCL_IB_DISABLE"] == "1"
        assert "NCCL_IB_HCA" not in conf
    else:
        assert conf["NCCL_IB_HCA"] == "=" + ",".join(fabric["hcas"])
        assert "NCCL_IB_DISABLE" not in conf
    assert conf["NCCL_DEBUG"] == role_var(host, "nccl", "nccl_debug")


def test_sourced_env_equals_conf(host: Any, spec: dict[str, Any]) -> None:
    out = host.check_output(f"env -i bash -c 'set -a; . {ENV}; env'")
    sourced = dict(line.split("=", 1) for line in out.splitlines() if line.startswith("NCCL_"))
    assert sourced == _conf(host)


def test_socket_interface_exists(host: Any, spec: dict[str, Any]) -> None:
    ifname = spec["fabric"]["socket_ifname"]
    if ifname.startswith("^"):
        pytest.skip("an exclusion list selects no particular interface")
    names = host.file("/sys/class/net").listdir()
    wanted = [e for e in ifname.lstrip("=").split(",") if e]
    exact = ifname.startswith("=")
    for entry in wanted:
        assert any((n == entry) if exact else n.startswith(entry) for n in names), (entry, names)


def test_nccl_library_present_on_gpu_nodes(host: Any, spec: dict[str, Any]) -> None:
    if int(spec["gpu"]["count_per_node"]) == 0:
        pytest.skip(
            "no GPUs in the spec: jobs use gloo, NCCL is not installed (docs/layers-gpu-fabric-nccl.md)"
        )
    found = host.run(
        "ldconfig -p | grep -c libnccl.so; find /usr /opt -xdev -name 'libnccl.so*' 2>/dev/null | head -1"
    ).stdout
    assert "libnccl.so" in found or int(found.split()[0]) > 0
