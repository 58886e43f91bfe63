"""The lock against the spec (lcm_runner/spec/lock_rules.py): an enabled layer's missing entry and version
pairs that disagree are caught in validation, before any host changes, naming the field, the value found
and what is expected; and the layer table agrees with what the roles install."""

from __future__ import annotations

import copy
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from lcm_runner.lock import release_lock
from lcm_runner.spec import fill_defaults, load_cluster, validate
from lcm_runner.spec.lock_rules import layer_needs, lock_errors, role_settings, role_value

ROOT = Path(__file__).resolve().parents[2]
LOCK = release_lock(yaml.safe_load((ROOT / "versions.lock.yml").read_text())["lcm_lock"])
LAB = load_cluster(ROOT / "inventories/lab")
H200 = load_cluster(ROOT / "inventories/example-h200")


def _lock() -> dict[str, Any]:
    return copy.deepcopy(LOCK)


def _h200(**layers: bool) -> dict[str, Any]:
    spec = copy.deepcopy(H200)
    spec["layers"].update(layers)
    return spec


def _msgs(spec: dict[str, Any], lock: dict[str, Any], **settings: Any) -> list[str]:
    return [str(e) for e in validate(spec, None, lock, settings)]


def test_the_repository_lock_fits_both_example_specs() -> None:
    assert _msgs(LAB, _lock()) == []
    assert _msgs(H200, _lock()) == []


def test_missing_entry_of_an_enabled_layer_names_field_and_layer() -> None:
    lock = _lock()
    del lock["artifacts"]["pyxis"]
    (msg,) = _msgs(H200, lock)
    assert msg == (
        "lcm_lock.artifacts.pyxis = null: expected an entry: cluster.layers.pyxis is true and installs it "
        "from the lock"
    )
    assert _msgs(_h200(pyxis=False), lock) == [], "a layer that is off needs nothing"


def test_missing_package_shared_by_layers_names_every_layer() -> None:
    lock = _lock()
    del lock["packages"]["slurm-client"]
    (msg,) = _msgs(H200, lock)
    assert msg.startswith("lcm_lock.packages.slurm-client = null: expected an entry: cluster.layers.slurm")


@pytest.mark.parametrize(
    ("layers", "settings", "kind", "name"),
    [
        ({"nvidia": True}, {}, "artifacts", "nvidia_driver"),
        ({"nvidia": True}, {}, "artifacts", "fabric_manager"),
        ({"nvidia": True}, {"nvidia_driver_source": "debian"}, "packages", "nvidia-driver"),
        ({"rdma": True}, {}, "packages", "rdma-core"),
        ({"rdma": True}, {"rdma_stack": "doca_ofed"}, "artifacts", "doca_ofed"),
        ({"nccl": True}, {"nccl_install_method": "artifact"}, "artifacts", "nccl_dev"),
        ({"enroot": True}, {}, "artifacts", "enroot_caps"),
        ({"enroot": True}, {}, "packages", "squashfuse"),
        ({"slurm": True}, {}, "packages", "libmunge2"),
        ({"slurm": True}, {}, "packages", "slurmd"),
        ({"runner": True}, {}, "packages", "python3-venv"),
        ({"base": True}, {}, "packages", "chrony"),
        ({"monitoring": True}, {}, "packages", "prometheus-node-exporter"),
        ({"monitoring": True}, {}, "packages", "prometheus"),
        ({"monitoring": True}, {}, "packages", "prometheus-alertmanager"),
        ({"monitoring": True}, {}, "artifacts", "grafana"),
        ({"monitoring": True}, {}, "packages", "musl"),
        ({"monitoring": True}, {}, "artifacts", "dcgm"),
        ({"monitoring": True}, {}, "artifacts", "dcgm_proprietary"),
        ({"monitoring": True}, {}, "artifacts", "dcgm_exporter"),
    ],
)
def test_each_layer_needs_its_entries(layers: dict, settings: dict, kind: str, name: str) -> None:
    lock = _lock()
    del lock[kind][name]
    msgs = _msgs(_h200(**layers), lock, **settings)
    assert any(m.startswith(f"lcm_lock.{kind}.{name} = null: expected an entry") for m in msgs), msgs


def test_nfs_storage_needs_the_nfs_packages_other_types_do_not() -> None:
    lock = _lock()
    del lock["packages"]["nfs-kernel-server"]
    assert _msgs(LAB, lock) == []
    spec = copy.deepcopy(LAB)
    spec["storage"] = {"type": "nfs", "mountpoint": "/mnt/ckpt", "checkpoint_dir": "/mnt/ckpt/c"}
    (msg,) = _msgs(spec, lock)
    assert "lcm_lock.packages.nfs-kernel-server = null" in msg and "cluster.layers.storage" in msg


MONITORING_ENTRIES = [
    ("packages", "prometheus"),
    ("packages", "prometheus-node-exporter"),
    ("packages", "prometheus-alertmanager"),
    ("packages", "adduser"),
    ("artifacts", "grafana"),
    ("artifacts", "dcgm"),
    ("artifacts", "dcgm_proprietary"),
    ("artifacts", "dcgm_exporter"),
]


def _without(*entries: tuple[str, str]) -> dict[str, Any]:
    lock = _lock()
    for kind, name in entries:
        del lock[kind][name]
    return lock


def test_monitoring_off_needs_none_of_its_entries() -> None:
    assert _msgs(_h200(monitoring=False), _without(*MONITORING_ENTRIES)) == []


def test_grafana_off_needs_no_grafana_entries() -> None:
    spec = _h200()
    spec["monitoring"] = {"grafana": {"enabled": False}}
    assert (
        _msgs(spec, _without(("artifacts", "grafana"), ("packages", "musl"), ("packages", "adduser"))) == []
    )
    (msg,) = _msgs(_h200(), _without(("artifacts", "grafana")))
    assert msg == (
        "lcm_lock.artifacts.grafana = null: expected an entry: cluster.layers.monitoring is true and "
        "installs it from the lock"
    )


def test_a_cluster_without_gpus_needs_no_dcgm() -> None:
    lab = copy.deepcopy(LAB)
    lab["layers"]["monitoring"] = True
    lab["monitoring"] = {"grafana": {"enabled": False}}  # as the lab sets it
    dcgm = [("artifacts", "dcgm"), ("artifacts", "dcgm_proprietary"), ("artifacts", "dcgm_exporter")]
    assert _msgs(lab, _without(*dcgm)) == []
    assert [m.split(" = ")[0] for m in _msgs(_h200(), _without(*dcgm))] == [
        f"lcm_lock.{k}.{n}" for k, n in dcgm
    ]


def test_dcgm_fields_without_profiling_need_no_proprietary_package() -> None:
    spec = _h200()
    spec["monitoring"] = {"dcgm": {"fields": ["DCGM_FI_DEV_XID_ERRORS", "DCGM_FI_DEV_GPU_TEMP"]}}
    lock = _without(("artifacts", "dcgm_proprietary"))
    assert _msgs(spec, lock) == []
    spec["monitoring"]["dcgm"]["fields"].append("DCGM_FI_PROF_SM_ACTIVE")
    (msg,) = _msgs(spec, lock)
    assert msg.startswith("lcm_lock.artifacts.dcgm_proprietary = null: expected an entry")


def test_dcgm_exporter_tag_starts_with_the_dcgm_version() -> None:
    lock = _lock()
    lock["artifacts"]["dcgm_exporter"]["version"] = "4.1.1-4.0.4"
    (msg,) = _msgs(H200, lock)
    assert msg == (
        'lcm_lock.artifacts.dcgm_exporter = "4.1.1-4.0.4": expected a tag starting with 4.2.3- like '
        "lcm_lock.artifacts.dcgm 4.2.3-1 (dcgm-exporter is tagged <DCGM version>-<exporter version> and "
        "built for that DCGM)"
    )
    lock["artifacts"]["dcgm_exporter"]["version"] = "4.2.3-4.1.3"
    assert _msgs(H200, lock) == [], "another exporter release for the same DCGM"
    lock["artifacts"]["dcgm_exporter"]["version"] = "4.2.30-4.1.1"
    assert len(_msgs(H200, lock)) == 1, "4.2.30 is not 4.2.3"
    spec = _h200()
    spec["gpu"] = {"model": "none", "count_per_node": 0, "gres_type": "", "nvswitch": False}
    spec["layers"].update(nvidia=False, nccl=False)
    assert _msgs(spec, lock) == [], "no GPUs, no DCGM: no pair"


def test_dcgm_profiling_module_is_the_core_release() -> None:
    lock = _lock()
    lock["artifacts"]["dcgm_proprietary"]["version"] = "4.2.2-1"
    (msg,) = _msgs(H200, lock)
    assert msg == (
        'lcm_lock.artifacts.dcgm_proprietary = "4.2.2-1": expected version 4.2.3-1 like '
        "lcm_lock.artifacts.dcgm (DCGM's profiling module and its core are one release)"
    )


def test_an_enroot_without_caps_setting_needs_no_caps_artifact() -> None:
    lock = _lock()
    del lock["artifacts"]["enroot_caps"]
    assert _msgs(H200, lock, enroot_caps=False) == []


def test_fabric_manager_must_equal_the_driver() -> None:
    lock = _lock()
    lock["artifacts"]["fabric_manager"]["version"] = "570.195.03-1"
    (msg,) = _msgs(H200, lock)
    assert msg == (
        'lcm_lock.artifacts.fabric_manager = "570.195.03-1": expected version 580.159.04 like '
        "lcm_lock.artifacts.nvidia_driver (Fabric Manager must equal the driver version)"
    )
    spec = _h200()
    spec["gpu"]["nvswitch"] = False
    assert _msgs(spec, lock) == [], "no NVSwitch, no Fabric Manager"


def test_fabric_manager_against_the_debian_driver() -> None:
    """With nvidia_driver_source debian the driver version is the nvidia-driver package's (535 here)."""
    msgs = _msgs(H200, _lock(), nvidia_driver_source="debian")
    assert any(
        m.startswith('lcm_lock.artifacts.fabric_manager = "580.159.04-1": expected version 535.309.01')
        for m in msgs
    )


def test_nccl_built_for_a_cuda_the_driver_cannot_run() -> None:
    lock = _lock()
    lock["artifacts"]["nvidia_driver"]["version"] = "570.195.03"
    lock["artifacts"]["fabric_manager"]["version"] = "570.195.03-1"
    (msg,) = _msgs(H200, lock)
    assert msg == (
        'lcm_lock.artifacts.nvidia_driver = "570.195.03": expected a driver >= 580.65.06: '
        "lcm_lock.artifacts.nccl 2.28.9-1+cuda13.0 is built for CUDA 13.0, which needs it"
    )
    spec = _h200(nccl=False)
    assert _msgs(spec, lock) == [], "no nccl layer, no pair"


def test_slurm_packages_and_pyxis_headers_are_one_release() -> None:
    lock = _lock()
    lock["packages"]["libslurm-dev"] = "23.02.6-1"
    (msg,) = _msgs(H200, lock)
    assert msg == (
        'lcm_lock.packages.libslurm-dev = "23.02.6-1": expected version 22.05.8-4+deb12u3 like '
        "lcm_lock.packages.slurm-client (one Slurm release on every node; pyxis is built against these "
        "headers)"
    )
    assert _msgs(_h200(pyxis=False), lock) == [], "without pyxis the headers are not installed"
    lock["packages"]["slurmd"] = "23.02.6-1"
    assert any(
        m.startswith('lcm_lock.packages.slurmd = "23.02.6-1"') for m in _msgs(_h200(pyxis=False), lock)
    )


@pytest.mark.parametrize(
    ("kind", "name", "why"),
    [
        ("packages", "libmunge2", "munge and its library"),
        ("artifacts", "enroot_caps", "enroot+caps is built for one enroot"),
        ("artifacts", "nccl_dev", "the NCCL runtime and its headers"),
    ],
)
def test_other_version_pairs(kind: str, name: str, why: str) -> None:
    lock = _lock()
    if kind == "packages":
        lock[kind][name] = "9.9-1"
    else:
        lock[kind][name]["version"] = "9.9-1"
    msgs = _msgs(H200, lock)
    assert any(
        m.startswith(f'lcm_lock.{kind}.{name} = "9.9-1": expected version') and why in m for m in msgs
    ), msgs


def test_lock_shape_errors_still_reported_with_a_bad_spec() -> None:
    spec = copy.deepcopy(LAB)
    spec["name"] = "Bad Name"
    lock = _lock()
    lock["packages"]["chrony"] = "4.*"
    msgs = _msgs(spec, lock)
    assert any(m.startswith("cluster.name") for m in msgs)
    assert 'lcm_lock.packages.chrony = "4.*": expected an exact Debian version string' in msgs


def test_lock_errors_directly() -> None:
    assert lock_errors(fill_defaults(LAB), "not a mapping")[0].path == "lcm_lock"


def _literal_list(role: str, name: str) -> list[str]:
    value = role_value(role, name)
    assert isinstance(value, list), f"roles/{role} {name} must stay a literal list (lock_rules reads it)"
    return value


def test_layer_table_reads_the_roles_own_lists() -> None:
    """lock_rules reads the package lists from the roles; the conditions it spells out match the role's."""
    s = role_settings()
    needs = {(layer, name) for layer, _, name in layer_needs(fill_defaults(H200), s)}
    for name in _literal_list("common", "common_packages"):
        assert ("base", name) in needs
    for name in _literal_list("munge", "_munge_packages") + _literal_list("slurm", "_slurm_packages_common"):
        assert ("slurm", name) in needs
    # roles/slurm/vars/main.yml adds slurmctld (controller) and slurmd (compute): lock_rules names both.
    slurm_vars = (ROOT / "roles/slurm/vars/main.yml").read_text()
    assert re.search(r"\['slurmctld'\] if _slurm_is_controller", slurm_vars)
    assert re.search(r"\['slurmd'\] if _slurm_is_compute", slurm_vars)
    # roles/shared_storage: nfs-kernel-server and nfs-common, as lock_rules says.
    storage_vars = (ROOT / "roles/shared_storage/vars/main.yml").read_text()
    assert "['nfs-kernel-server', 'nfs-common']" in storage_vars
    # roles/enroot: enroot_caps adds the caps artifact; roles/pyxis fetches the pyxis artifact.
    assert (
        "['enroot', 'enroot_caps'] if enroot_caps | bool else ['enroot']"
        in (ROOT / "roles/enroot/vars/main.yml").read_text()
    )
    assert "_artifacts_names: [pyxis]" in (ROOT / "roles/pyxis/tasks/install.yml").read_text()
    assert "_packages_names: [dkms]" in (ROOT / "roles/nvidia_driver/tasks/install.yml").read_text()
    for name in _literal_list("pyxis", "_pyxis_build_packages") + _literal_list(
        "enroot", "_enroot_dep_packages"
    ):
        assert any(n == name for _, n in needs)
    assert ("runner", "python3-venv") in needs
    # roles/grafana: its deb's dependencies (read from the role) and its artifact; roles/dcgm_exporter: the
    # -proprietary package only with DCGM_FI_PROF_* fields, as lock_rules says.
    for name in _literal_list("grafana", "_grafana_dep_packages"):
        assert ("monitoring", name) in needs
    assert role_value("grafana", "_grafana_artifact") == "grafana"
    assert (
        '_artifacts_names: ["{{ _grafana_artifact }}"]'
        in (ROOT / "roles/grafana/tasks/install.yml").read_text()
    )
    dcgm_vars = (ROOT / "roles/dcgm_exporter/vars/main.yml").read_text()
    assert "['dcgm', 'dcgm_proprietary'] if _dcgm_exporter_prof_fields else ['dcgm']" in dcgm_vars
    assert "select('match', '^DCGM_FI_PROF_')" in dcgm_vars
    assert role_value("dcgm_exporter", "_dcgm_exporter_artifact") == "dcgm_exporter"
    assert {("monitoring", n) for n in ("dcgm", "dcgm_proprietary", "dcgm_exporter", "prometheus")} <= needs


def test_validate_playbook_failure_names_the_lock_field(tmp_path: Path) -> None:
    """The Ansible side: playbooks/validate.yml reports a missing lock entry before any host task."""
    import test_spec_playbook as tsp

    inv = tsp._inventory(tmp_path, tsp._spec())
    lock_file = inv / "group_vars" / "all" / "lock.yml"
    doc = yaml.safe_load(lock_file.read_text())
    del doc["lcm_lock"]["artifacts"]["pyxis"]
    lock_file.write_text(yaml.safe_dump(doc))
    out = tsp._run(tmp_path, inv)
    assert out.returncode != 0
    assert "lcm_lock.artifacts.pyxis = null: expected an entry: cluster.layers.pyxis is true" in out.stdout
    assert "MARKER host task ran" not in out.stdout


def test_validate_playbook_takes_role_settings_from_the_inventory(tmp_path: Path) -> None:
    """An inventory that sets nvidia_driver_source: debian is checked against the Debian driver."""
    import test_spec_playbook as tsp

    inv = tsp._inventory(tmp_path, tsp._spec())
    (inv / "group_vars" / "all" / "settings.yml").write_text("nvidia_driver_source: debian\n")
    out = tsp._run(tmp_path, inv)
    assert out.returncode != 0
    assert (
        "lcm_lock.artifacts.fabric_manager = " in out.stdout and "expected version 535.309.01" in out.stdout
    )
