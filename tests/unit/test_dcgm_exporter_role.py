"""roles/dcgm_exporter without GPUs: its templates (rendered by Ansible's own engine), its preflight run for
real on localhost (a PCI tree and a control device in tmp stand for a GPU node), and its verify step run for
real against a local HTTP server that serves a dcgm-exporter page.

tests/unit/fixtures/dcgm/metrics_h200x2.txt is a /metrics page in dcgm-exporter 4.x's format for the spec's
default fields on two H200s (HELP/TYPE lines from the counters file, the labels gpu, UUID, pci_bus_id, device,
modelName, Hostname, DCGM_FI_DRIVER_VERSION, the XID series with err_code/err_msg); the _no_xid and _no_prof
variants drop those fields, as an exporter upgrade that stops publishing them would. dcgmi and dcgm-exporter
cannot run here: the verify test puts two scripts that print their `--version` lines in their place.
"""

from __future__ import annotations

import csv
import http.server
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from _role_render import evaluate, render
from _role_run import H200_GPU, IB_FABRIC, REPO, lock, run_role, spec
from prometheus_client.parser import text_string_to_metric_families
from test_role_shape import PUBLIC_ROLES

ROLE = "dcgm_exporter"
FIXTURES = Path(__file__).parent / "fixtures" / "dcgm"
CATALOG: dict[str, dict[str, str]] = yaml.safe_load((REPO / "roles/dcgm_exporter/vars/main.yml").read_text())[
    "_dcgm_exporter_field_catalog"
]
SCHEMA = yaml.safe_load((REPO / "lcm_runner/spec/schema.yml").read_text())
DEFAULT_FIELDS: list[str] = SCHEMA["properties"]["monitoring"]["properties"]["dcgm"]["properties"]["fields"][
    "default"
]
GPU_SPEC = {"gpu": H200_GPU, "fabric": IB_FABRIC}


def _fields_spec(fields: list[str], **over: Any) -> dict[str, Any]:
    return spec(**GPU_SPEC, monitoring={"dcgm": {"fields": fields}}, **over)


def _csv_rows(text: str) -> list[list[str]]:
    """The counters file as dcgm-exporter reads it: comma-separated, '#' lines and blank lines skipped."""
    lines = [line for line in text.splitlines() if line.strip() and not line.lstrip().startswith("#")]
    return [[cell.strip() for cell in row] for row in csv.reader(lines)]


# ----------------------------------------------------------------------------- the field catalog


def test_both_new_roles_are_under_the_shape_tests() -> None:
    assert {"dcgm_exporter", "grafana"} <= set(PUBLIC_ROLES)


def test_catalog_covers_the_spec_default_and_types_each_field() -> None:
    assert set(DEFAULT_FIELDS) <= set(CATALOG), sorted(set(DEFAULT_FIELDS) - set(CATALOG))
    for name, entry in CATALOG.items():
        assert name.startswith("DCGM_FI_"), name
        assert entry["type"] in {"counter", "gauge"}, name
        assert entry["help"] and "," not in entry["help"], f"{name}: a comma would split the CSV line"


# ----------------------------------------------------------------------------- the counters file and the unit


def test_counters_file_has_exactly_the_spec_fields_with_the_catalog_types() -> None:
    rows = _csv_rows(render(ROLE, "lcm-counters.csv.j2", {"cluster": spec(**GPU_SPEC)}))
    assert [r[0] for r in rows] == DEFAULT_FIELDS
    assert all(len(r) == 3 for r in rows), rows
    assert {r[0]: (r[1], r[2]) for r in rows} == {
        f: (CATALOG[f]["type"], CATALOG[f]["help"]) for f in DEFAULT_FIELDS
    }
    assert dict((r[0], r[1]) for r in rows)["DCGM_FI_DEV_ECC_DBE_VOL_TOTAL"] == "counter"
    assert dict((r[0], r[1]) for r in rows)["DCGM_FI_DEV_GPU_TEMP"] == "gauge"


def test_counters_file_follows_a_custom_field_list() -> None:
    fields = ["DCGM_FI_DEV_GPU_TEMP", "DCGM_FI_DEV_XID_ERRORS", "DCGM_FI_DEV_SM_CLOCK"]
    text = render(ROLE, "lcm-counters.csv.j2", {"cluster": _fields_spec(fields)})
    assert [r[0] for r in _csv_rows(text)] == fields
    assert "profiling module" not in text, "no DCGM_FI_PROF_ field: no profiling note"
    with_prof = render(
        ROLE, "lcm-counters.csv.j2", {"cluster": _fields_spec([*fields, "DCGM_FI_PROF_SM_ACTIVE"])}
    )
    assert "profiling module (datacenter-gpu-manager-4-proprietary)" in with_prof


def _unit(listen: str, **over: Any) -> dict[str, str]:
    text = render(
        ROLE,
        "dcgm-exporter.service.j2",
        {"cluster": spec(**GPU_SPEC), "lcm_lock": lock(), "_monitoring_listen_address": listen, **over},
    )
    lines = [line for line in text.splitlines() if "=" in line and not line.startswith("#")]
    return dict(line.split("=", 1) for line in lines)


def test_unit_listens_on_the_cluster_address_with_the_counters_file_as_its_user() -> None:
    unit = _unit("10.20.0.11")
    argv = unit["ExecStart"].split()
    assert argv[0] == "/usr/local/bin/dcgm-exporter"
    assert argv[argv.index("-f") + 1] == "/etc/dcgm-exporter/lcm-counters.csv"
    assert argv[argv.index("-a") + 1] == "10.20.0.11:9400"
    assert argv[argv.index("-r") + 1] == "127.0.0.1:5555", "reads the nvidia-dcgm service, no embedded engine"
    assert argv[argv.index("-c") + 1] == "15000", "collects as often as Prometheus scrapes (15 s default)"
    assert "0.0.0.0" not in unit["ExecStart"]
    assert unit["User"] == "dcgm-exporter" and unit["Group"] == "dcgm-exporter"
    assert unit["Requires"] == "nvidia-dcgm.service"
    assert (
        _unit("10.20.0.11", dcgm_exporter_port=9500)["ExecStart"].split()[argv.index("-a") + 1]
        == "10.20.0.11:9500"
    )


# ----------------------------------------------------------------------------- the preflight, run for real


def _pci_tree(tmp_path: Path, gpus: int) -> Path:
    """A PCI device tree shaped like /sys/bus/pci/devices of an HGX node (vendor/class files)."""
    root = tmp_path / "pci"
    devices = [("0x10de", "0x030200")] * gpus + [("0x10de", "0x068000"), ("0x15b3", "0x020700")]
    root.mkdir()
    for i, (vendor, klass) in enumerate(devices):
        d = root / f"0000:{i + 0x18:02x}:00.0"
        d.mkdir()
        (d / "vendor").write_text(vendor + "\n")
        (d / "class").write_text(klass + "\n")
    return root


def _gpu_host(tmp_path: Path, gpus: int = 8, ctl: bool = True) -> dict[str, str]:
    """Private paths pointing the role at a GPU node's sysfs and /dev/nvidiactl in tmp."""
    nvidiactl = tmp_path / "nvidiactl"
    if ctl:
        nvidiactl.write_text("")
    return {
        "_dcgm_exporter_sysfs_pci": str(_pci_tree(tmp_path, gpus)),
        "_dcgm_exporter_nvidiactl": str(nvidiactl),
    }


def _locked(**artifacts: dict[str, Any]) -> dict[str, Any]:
    """The repository lock with the DCGM entries locked (a sha256 that only stands for one)."""
    lk = lock()
    for name in ("dcgm", "dcgm_proprietary", "dcgm_exporter"):
        lk["artifacts"][name] = {**lk["artifacts"][name], "sha256": "ab" * 32, **artifacts.get(name, {})}
    return lk


def _preflight(tmp_path: Path, cluster: dict[str, Any], **extra: Any):
    return run_role(ROLE, tmp_path, {"cluster": cluster} | extra, tags="dcgm_exporter_preflight")


def _skip_msg(run) -> str:
    return str(run.task("Say why DCGM and dcgm-exporter are skipped").get("msg", ""))


def test_unknown_field_fails_the_preflight_naming_it(tmp_path: Path) -> None:
    run = _preflight(tmp_path, _fields_spec(["DCGM_FI_DEV_GPU_TEMP", "DCGM_FI_DEV_NOT_A_FIELD"]))
    assert run.rc != 0
    (msg,) = run.failed_msgs
    assert "cluster.monitoring.dcgm.fields has DCGM_FI_DEV_NOT_A_FIELD, not in the field catalog" in msg
    assert "DCGM_FI_DEV_GPU_TEMP" not in msg


def test_no_gpus_in_the_spec_skips_the_whole_role_saying_why(tmp_path: Path) -> None:
    run = run_role(ROLE, tmp_path, {"cluster": spec()})  # the lab's shape: count_per_node 0
    assert run.rc == 0, run.failed_msgs or run.stderr[-2000:]
    assert (
        _skip_msg(run)
        == "dcgm_exporter skipped on localhost: cluster.gpu.count_per_node is 0: no GPUs to monitor."
    )
    ran = [r["task"] for r in run.results if not r["result"].get("skipped")]
    assert not [t for t in ran if "Install" in t or "Render" in t or "Enable" in t or "Fetch" in t], ran


@pytest.mark.parametrize(
    ("gpus", "ctl", "reason"),
    [
        (0, True, "has no NVIDIA GPU on its PCI bus"),
        (8, False, "the NVIDIA driver is not loaded (the gpu layer, roles/nvidia_driver, installs it)"),
    ],
)
def test_a_host_without_usable_gpus_is_skipped_saying_why(
    tmp_path: Path, gpus: int, ctl: bool, reason: str
) -> None:
    run = run_role(ROLE, tmp_path, {"cluster": spec(**GPU_SPEC), **_gpu_host(tmp_path, gpus, ctl)})
    assert run.rc == 0, run.failed_msgs or run.stderr[-2000:]
    assert reason in _skip_msg(run)
    assert run.task("Decide whether this host has GPUs")["ansible_facts"]["_dcgm_exporter_active"] is False


def test_site_built_exporter_needs_a_mirror(tmp_path: Path) -> None:
    run = _preflight(tmp_path, spec(**GPU_SPEC), **_gpu_host(tmp_path))
    assert run.rc != 0
    (msg,) = run.failed_msgs
    assert "lcm_lock.artifacts.dcgm_exporter is a binary the site builds" in msg
    assert "docs/monitoring-production.md" in msg and "set lcm_mirror" in msg


def test_unlocked_artifacts_fail_naming_the_lock_update(tmp_path: Path) -> None:
    run = _preflight(tmp_path, spec(**GPU_SPEC), lcm_mirror=str(tmp_path), **_gpu_host(tmp_path))
    assert run.rc != 0
    (msg,) = run.failed_msgs
    assert msg.startswith(
        "not locked (sha256 is null): datacenter-gpu-manager-4-core_4.2.3-1_amd64.deb, "
        "datacenter-gpu-manager-4-proprietary_4.2.3-1_amd64.deb, dcgm-exporter-4.2.3-4.1.1-linux-amd64.tar.gz"
    )
    assert "`lcm-runner lock update <dir>`" in msg


@pytest.mark.parametrize(
    ("artifacts", "expect"),
    [
        ({"dcgm_exporter": {"version": "4.1.1-4.0.4"}}, "4.1.1-4.0.4 must start with 4.2.3-"),
        (
            {"dcgm_proprietary": {"version": "4.2.2-1"}},
            "lcm_lock.artifacts.dcgm_proprietary (4.2.2-1) must equal",
        ),
    ],
)
def test_dcgm_and_exporter_versions_are_pinned_together(tmp_path: Path, artifacts: dict, expect: str) -> None:
    run = _preflight(
        tmp_path,
        spec(**GPU_SPEC),
        lcm_mirror=str(tmp_path),
        lcm_lock=_locked(**artifacts),
        **_gpu_host(tmp_path),
    )
    assert run.rc != 0
    assert expect in " ".join(run.failed_msgs)


def test_without_prof_fields_no_proprietary_package_is_needed(tmp_path: Path) -> None:
    lk = _locked(dcgm_proprietary={"version": "4.2.2-1"})
    run = _preflight(
        tmp_path,
        _fields_spec(["DCGM_FI_DEV_XID_ERRORS"]),
        lcm_mirror=str(tmp_path),
        lcm_lock=lk,
        **_gpu_host(tmp_path),
    )
    assert run.rc == 0, run.failed_msgs


@pytest.mark.parametrize(("bind_any", "address"), [(False, "127.0.0.1"), (True, "0.0.0.0")])
def test_a_locked_gpu_host_passes_and_listens_on_the_cluster_address(
    tmp_path: Path, bind_any: bool, address: str
) -> None:
    cluster = spec(**GPU_SPEC, monitoring={"bind_any_address": bind_any})  # socket_ifname lo: 127.0.0.1
    run = _preflight(tmp_path, cluster, lcm_mirror=str(tmp_path), lcm_lock=_locked(), **_gpu_host(tmp_path))
    assert run.rc == 0, run.failed_msgs or run.stderr[-2000:]
    assert run.task("Decide whether this host has GPUs")["ansible_facts"]["_dcgm_exporter_active"] is True
    listen = run.task("Set the listen address")["ansible_facts"]["_monitoring_listen_address"]
    assert listen == address
    argv = _unit(listen)["ExecStart"].split()
    assert argv[argv.index("-a") + 1] == f"{address}:9400"


# ----------------------------------------------------------------------------- the field check on real pages


def _page(name: str) -> str:
    return (FIXTURES / name).read_text()


def _missing(body: str, fields: list[str] | None = None) -> list[str]:
    cluster = spec(**GPU_SPEC) if fields is None else _fields_spec(fields)
    return evaluate(ROLE, "_dcgm_exporter_missing", {"cluster": cluster, "_dcgm_exporter_metrics_body": body})


def test_fixtures_are_valid_exposition_text() -> None:
    names = {f.name for f in text_string_to_metric_families(_page("metrics_h200x2.txt"))}
    assert names == set(DEFAULT_FIELDS)


def test_field_check_passes_on_a_full_page() -> None:
    assert _missing(_page("metrics_h200x2.txt")) == []


def test_field_check_names_the_dropped_xid_field() -> None:
    assert _missing(_page("metrics_h200x2_no_xid.txt")) == ["DCGM_FI_DEV_XID_ERRORS"]


def test_field_check_needs_a_sample_not_just_help_and_type() -> None:
    body = "".join(
        line + "\n"
        for line in _page("metrics_h200x2.txt").splitlines()
        if not line.startswith("DCGM_FI_DEV_GPU_TEMP{")
    )
    assert "# HELP DCGM_FI_DEV_GPU_TEMP" in body
    assert _missing(body) == ["DCGM_FI_DEV_GPU_TEMP"]
    assert _missing("") == DEFAULT_FIELDS
    # A field whose name is a prefix of a published one is not taken for it.
    assert _missing(_page("metrics_h200x2.txt"), ["DCGM_FI_DEV_FB"]) == ["DCGM_FI_DEV_FB"]


@pytest.mark.parametrize(
    ("out", "seen"),
    [
        ("DCGM Exporter version 4.2.3-4.1.1\n", "4.2.3-4.1.1"),
        ("\ndcgmi  version: 4.2.3\n\n", "4.2.3"),
        ("Error: unknown flag\n", "(none)"),
        ("", "(none)"),
    ],
)
def test_version_lines_are_read(out: str, seen: str) -> None:
    assert (
        evaluate(
            ROLE, "_dcgm_exporter_exporter_seen", {"cluster": spec(), "_dcgm_exporter_exporter_out": out}
        )
        == seen
    )


# ----------------------------------------------------------------------------- the verify step, run for real


class _Page(http.server.BaseHTTPRequestHandler):
    body = b""

    def do_GET(self) -> None:
        code = 200 if self.path == "/metrics" else 404
        self.send_response(code)
        self.send_header("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
        self.send_header("Content-Length", str(len(self.body) if code == 200 else 0))
        self.end_headers()
        if code == 200:
            self.wfile.write(self.body)

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def serve() -> Iterator[Any]:
    """serve(text) -> port: an HTTP server on 127.0.0.1 answering /metrics with text."""
    servers: list[http.server.ThreadingHTTPServer] = []

    def start(text: str) -> int:
        handler = type("Page", (_Page,), {"body": text.encode()})
        server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        servers.append(server)
        return server.server_address[1]

    yield start
    for server in servers:
        server.shutdown()
        server.server_close()


def _version_script(tmp_path: Path, name: str, line: str) -> str:
    path = tmp_path / name
    path.write_text(f"#!/bin/sh\nprintf '%s\\n' '{line}'\n")
    path.chmod(0o755)
    return str(path)


def _verify(
    tmp_path: Path,
    port: int,
    exporter: str = "DCGM Exporter version 4.2.3-4.1.1",
    dcgmi: str = "dcgmi  version: 4.2.3",
):
    return run_role(
        ROLE,
        tmp_path,
        {
            "cluster": spec(**GPU_SPEC),
            "_monitoring_listen_address": "127.0.0.1",
            "_monitoring_local_address": "127.0.0.1",
            "dcgm_exporter_port": port,
            "dcgm_exporter_verify_timeout_s": 4,
            "_dcgm_exporter_binary": _version_script(tmp_path, "dcgm-exporter", exporter),
            "_dcgm_exporter_dcgmi": _version_script(tmp_path, "dcgmi", dcgmi),
        },
        tasks_from="verify",
    )


def test_verify_passes_on_a_full_page_at_the_locked_versions(tmp_path: Path, serve) -> None:
    run = _verify(tmp_path, serve(_page("metrics_h200x2.txt")))
    assert run.rc == 0, run.failed_msgs or run.stderr[-2000:]
    assert run.task("Fail unless every configured DCGM field")["msg"] == (
        "localhost: dcgm-exporter publishes all 24 configured DCGM fields"
    )
    assert run.task("Fail unless dcgm-exporter and DCGM are the locked versions")["msg"] == (
        "localhost: dcgm-exporter 4.2.3-4.1.1, DCGM 4.2.3"
    )


def test_verify_fails_listing_the_field_an_upgrade_dropped(tmp_path: Path, serve) -> None:
    run = _verify(tmp_path, serve(_page("metrics_h200x2_no_xid.txt")))
    assert run.rc != 0
    (msg,) = run.failed_msgs
    assert "publishes no sample of 1 configured field(s): DCGM_FI_DEV_XID_ERRORS (" in msg
    assert "profiling module" not in msg


def test_verify_says_where_profiling_fields_come_from(tmp_path: Path, serve) -> None:
    run = _verify(tmp_path, serve(_page("metrics_h200x2_no_prof.txt")))
    assert run.rc != 0
    (msg,) = run.failed_msgs
    prof = [f for f in DEFAULT_FIELDS if f.startswith("DCGM_FI_PROF_")]
    assert f"publishes no sample of {len(prof)} configured field(s): {', '.join(prof)}" in msg
    assert (
        "DCGM's profiling module, which nv-hostengine loads from the datacenter-gpu-manager-4-proprietary"
        in msg
    )
    assert "`dcgmi modules -l` must show Profiling Loaded" in msg


def test_verify_fails_on_other_versions_than_the_lock(tmp_path: Path, serve) -> None:
    run = _verify(
        tmp_path,
        serve(_page("metrics_h200x2.txt")),
        exporter="DCGM Exporter version 4.4.1-4.6.0",
        dcgmi="dcgmi  version: 4.4.1",
    )
    assert run.rc != 0
    (msg,) = run.failed_msgs
    assert "--version` says 4.4.1-4.6.0 (lcm_lock.artifacts.dcgm_exporter: 4.2.3-4.1.1)" in msg
    assert "`dcgmi --version` says 4.4.1 (lcm_lock.artifacts.dcgm: 4.2.3)" in msg


def test_verify_fails_when_the_page_has_no_dcgm_data(tmp_path: Path, serve) -> None:
    port = serve("# HELP go_goroutines Number of goroutines.\n# TYPE go_goroutines gauge\ngo_goroutines 12\n")
    run = _verify(tmp_path, port)  # answers, but nothing collected yet (DCGM not reachable, say)
    assert run.rc != 0
    (msg,) = run.failed_msgs
    assert msg.startswith(f"http://127.0.0.1:{port}/metrics showed no DCGM data within 4 s (status 200: OK")
    assert "journalctl -u dcgm-exporter and journalctl -u nvidia-dcgm say why" in msg


def test_verify_fails_when_nothing_listens(tmp_path: Path, serve) -> None:
    import socket

    with socket.socket() as s:  # a port nothing listens on (bound, never listening)
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
        run = _verify(tmp_path, port)
    assert run.rc != 0
    (msg,) = run.failed_msgs
    assert msg.startswith(f"http://127.0.0.1:{port}/metrics showed no DCGM data within 4 s (status -1:")
