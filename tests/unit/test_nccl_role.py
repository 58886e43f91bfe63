"""roles/nccl: the filter plugin, and the role's real task files run on localhost with paths in tmp."""

from __future__ import annotations

import importlib.util
import subprocess
from pathlib import Path

import jinja2
import pytest
from _role_run import H200_GPU, IB_FABRIC, REPO, lock, run_role, spec

_spec = importlib.util.spec_from_file_location("nccl_conf", REPO / "roles/nccl/filter_plugins/nccl_conf.py")
assert _spec and _spec.loader
nccl_conf = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(nccl_conf)


def _render_plain(cluster: dict, debug: str = "WARN", extra: dict | None = None) -> str:
    """The runner's template rendered by plain Jinja2 (as `lcm-runner render` does)."""
    env = jinja2.Environment(trim_blocks=True, undefined=jinja2.StrictUndefined)
    tpl = env.from_string((REPO / "lcm_runner/templates/nccl_env.sh.j2").read_text())
    return tpl.render(cluster=cluster, nccl_debug=debug, nccl_extra_env=extra or {})


def test_parse_reads_the_runner_template_for_infiniband():
    text = _render_plain(spec(gpu=H200_GPU, fabric=IB_FABRIC))
    parsed = nccl_conf.parse_nccl_env(text)
    entries = parsed["entries"]
    assert entries["NCCL_IB_HCA"] == "=" + ",".join(f"mlx5_{i}" for i in range(8))
    assert entries["NCCL_P2P_LEVEL"] == "NVL"
    assert entries["NCCL_NVLS_ENABLE"] == "1"
    assert "NCCL_IB_DISABLE" not in entries
    assert "GLOO_SOCKET_IFNAME" not in entries  # not an NCCL parameter: never in nccl.conf
    assert parsed["runtime_only"] == []


def test_parse_quoting_defaults_and_runtime_values():
    text = "\n".join(
        [
            "# comment",
            "export NCCL_A='it'\\''s'",
            'export NCCL_B="${NCCL_B:-8388608}"',
            "export NCCL_C=plain",
            'export NCCL_D="$(cat /etc/x)"',
            "export NCCL_E='$LITERAL'",
            "export OTHER=1",
            "NCCL_F=not-exported",
        ]
    )
    parsed = nccl_conf.parse_nccl_env(text)
    assert parsed["entries"] == {
        "NCCL_A": "it's",
        "NCCL_B": "8388608",
        "NCCL_C": "plain",
        "NCCL_E": "$LITERAL",
    }
    assert parsed["runtime_only"] == ["NCCL_D"]


def test_parse_rejects_an_unreadable_export():
    with pytest.raises(nccl_conf.NcclConfError, match="line 1"):
        nccl_conf.parse_nccl_env("export NCCL_X='unterminated")
    with pytest.raises(nccl_conf.NcclConfError, match="NCCL_Y has an unquoted value with spaces"):
        nccl_conf.parse_nccl_env("export NCCL_Y=a b")


@pytest.mark.parametrize(
    ("value", "ifaces", "unmatched"),
    [
        ("eth0", ["lo", "eth0"], []),
        ("eth", ["lo", "eth0"], []),
        ("=eth", ["lo", "eth0"], ["=eth"]),
        ("ib0,eth0", ["lo", "eth0"], ["ib0"]),
        ("^docker,lo", ["eth0"], []),
        ("ens", ["lo", "eth0"], ["ens"]),
    ],
)
def test_ifname_unmatched(value, ifaces, unmatched):
    assert nccl_conf.ifname_unmatched(value, ifaces) == unmatched


def _paths(tmp_path: Path) -> dict[str, str]:
    return {
        "nccl_conf_path": str(tmp_path / "nccl.conf"),
        "nccl_env_path": str(tmp_path / "nccl_env.sh"),
        "lcm_managed_dir": str(tmp_path / "managed.d"),
    }


def test_role_lab_spec_renders_both_files_and_is_idempotent(tmp_path):
    vars_ = {"cluster": spec()} | _paths(tmp_path)
    first = run_role("nccl", tmp_path, vars_)
    assert first.rc == 0, first.failed_msgs or first.stderr
    conf = (tmp_path / "nccl.conf").read_text()
    assert "NCCL_SOCKET_IFNAME=lo\n" in conf
    assert "NCCL_IB_DISABLE=1\n" in conf
    assert "NCCL_DEBUG=WARN\n" in conf
    env_sh = (tmp_path / "nccl_env.sh").read_text()
    assert env_sh == _render_plain(spec()), (
        "Ansible and plain Jinja2 must render the one template identically"
    )
    # nccl_env.sh sourced by bash exports exactly nccl.conf's NCCL_* values.
    out = subprocess.run(
        ["env", "-i", "bash", "-c", f"set -a; . {tmp_path / 'nccl_env.sh'}; env"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    sourced = sorted(line for line in out.splitlines() if line.startswith("NCCL_"))
    assert sourced == sorted(line for line in conf.splitlines() if line.startswith("NCCL_"))
    manifest = (tmp_path / "managed.d/nccl.json").read_text()
    assert str(tmp_path / "nccl.conf") in manifest and '"role": "nccl"' in manifest
    assert "install method: none" in first.task("Say how NCCL")["msg"]
    second = run_role("nccl", tmp_path, vars_)
    assert second.rc == 0 and second.changed == 0


def test_role_h200_spec_without_locked_artifacts_uses_torch_wheel_and_renders_ib(tmp_path):
    no_artifacts = lock() | {"artifacts": {}}
    vars_ = {
        "cluster": spec(gpu=H200_GPU, fabric=IB_FABRIC),
        "lcm_lock": no_artifacts,
        "nccl_extra_env": {"NCCL_BUFFSIZE": "8388608"},
    } | _paths(tmp_path)
    run = run_role("nccl", tmp_path, vars_)
    assert run.rc == 0, run.failed_msgs or run.stderr
    assert "install method: torch_wheel" in run.task("Say how NCCL")["msg"]
    conf = (tmp_path / "nccl.conf").read_text()
    assert "NCCL_IB_HCA==mlx5_0,mlx5_1,mlx5_2,mlx5_3,mlx5_4,mlx5_5,mlx5_6,mlx5_7\n" in conf
    assert "NCCL_P2P_LEVEL=NVL\n" in conf and "NCCL_NVLS_ENABLE=1\n" in conf
    assert "NCCL_BUFFSIZE=8388608\n" in conf
    assert "NCCL_IB_DISABLE" not in conf


def test_role_with_gpus_and_unlocked_artifacts_stops_before_installing(tmp_path):
    # The real lock names nccl/nccl_dev with sha256 null: auto picks the artifact path, _artifacts refuses.
    vars_ = {"cluster": spec(gpu=H200_GPU, fabric=IB_FABRIC)} | _paths(tmp_path)
    run = run_role("nccl", tmp_path, vars_)
    assert run.rc != 0
    assert any("not locked (sha256 is null)" in m and "libnccl2_" in m for m in run.failed_msgs), (
        run.failed_msgs
    )
    assert not (tmp_path / "nccl.conf").exists()


def test_role_fails_when_socket_ifname_matches_no_interface(tmp_path):
    fabric = {"type": "ethernet", "hcas": [], "rate_gbps": 0, "socket_ifname": "ib9", "roce_gid_index": None}
    run = run_role("nccl", tmp_path, {"cluster": spec(fabric=fabric)} | _paths(tmp_path))
    assert run.rc != 0
    msgs = " ".join(run.failed_msgs)
    assert "cluster.fabric.socket_ifname=ib9: ib9 matches no interface on localhost" in msgs
    assert not (tmp_path / "nccl.conf").exists(), "nothing is written when preflight fails"
