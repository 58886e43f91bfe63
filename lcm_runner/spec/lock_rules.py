"""The lock (versions.lock.yml, `lcm_lock`) against the spec: the entries every enabled layer installs, and
the version pairs that must agree, within the spec's Debian release (the shape and that release's view of
the lock: lock_shape). Checked on the controller before any host changes.

What a layer installs is read from the roles themselves (their defaults/main.yml and vars/main.yml, with
the inventory's overrides of a role's public settings), so the roles stay the one place that names their
packages; only the conditions the roles write as Jinja (which packages a node role adds) are spelled out
here, and tests/unit/test_spec_lock.py checks them against the role files.

    lock_errors(cluster, lock, settings={"nvidia_driver_source": "debian"})

Over ~300 lines: one table of what every layer installs and one of the version pairs that must agree, side by
side so a layer's entry and its pairs are read together.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from functools import cache
from pathlib import Path
from typing import Any

import yaml

from .errors import SpecError
from .lock_nvidia import (
    DRIVER_RELEASE_PACKAGES,
    driver_entry,
    nvidia_debian_packages,
    nvidia_settings,
    upstream_version,
    version_tuple,
)
from .lock_shape import check_lock, in_release, release_view

ROLES_DIR = Path(__file__).resolve().parents[2] / "roles"

# Minimum Linux driver of each CUDA major version (NVIDIA's CUDA release notes, table "CUDA Toolkit and
# Minimum Required Driver Version for CUDA Minor Version Compatibility"): an NCCL built for +cudaX.Y
# needs at least this driver.
CUDA_MIN_DRIVER = {11: "450.80.02", 12: "525.60.13", 13: "580.65.06"}

# The monitoring layer's Debian packages: node_exporter (every node), Prometheus and Alertmanager (monitoring
# hosts); Grafana and DCGM come from the lock's artifacts (layer_needs).
MONITORING_PACKAGES = ("prometheus-node-exporter", "prometheus", "prometheus-alertmanager")

# Public role settings the lock needs depend on (the inventory may override each; absent = the role's
# default from roles/<role>/defaults/main.yml).
SETTINGS = {
    "common_packages": "common",
    "nvidia_driver_source": "nvidia_driver",
    "nvidia_driver_artifact": "nvidia_driver",
    "nvidia_driver_fabric_manager_artifact": "nvidia_driver",
    "nvidia_driver_debian_packages": "nvidia_driver",
    "nvidia_driver_kernel_module": "nvidia_driver",
    "nvidia_driver_debian_kernel_packages": "nvidia_driver",
    "rdma_stack": "rdma",
    "rdma_inbox_packages": "rdma",
    "rdma_doca_artifact": "rdma",
    "nccl_install_method": "nccl",
    "nccl_artifacts": "nccl",
    "enroot_caps": "enroot",
    "enroot_install_method": "enroot",
}


@cache
def _role_file(role: str, sub: str) -> dict[str, Any]:
    path = ROLES_DIR / role / sub / "main.yml"
    if not path.is_file():
        return {}
    data = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    return data if isinstance(data, dict) else {}


def role_value(role: str, name: str) -> Any:
    """roles/<role>/{defaults,vars}/main.yml's literal value of name (KeyError when absent)."""
    for sub in ("vars", "defaults"):
        data = _role_file(role, sub)
        if name in data:
            return data[name]
    raise KeyError(f"roles/{role}: no variable {name}")


def role_settings(overrides: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """SETTINGS' values: the override where given, else the role's default."""
    overrides = overrides or {}
    return {
        name: overrides[name] if name in overrides else role_value(role, name)
        for name, role in SETTINGS.items()
    }


def layer_needs(cluster: Mapping[str, Any], settings: Mapping[str, Any]) -> list[tuple[str, str, str]]:
    """(layer, "packages" | "artifacts", name) for every lock entry an enabled layer installs.

    cluster is a validated, filled-in spec; settings are role_settings().
    """
    layers, gpu, storage = cluster["layers"], cluster["gpu"], cluster["storage"]
    out: list[tuple[str, str, str]] = []

    def need(layer: str, kind: str, names: Any) -> None:
        out.extend((layer, kind, str(n)) for n in names)

    if layers.get("base", True):
        need("base", "packages", settings["common_packages"])
    if layers["nvidia"]:
        if settings["nvidia_driver_source"] == "debian":
            need("nvidia", "packages", nvidia_debian_packages(settings))
        else:
            need("nvidia", "artifacts", [settings["nvidia_driver_artifact"]])
            need("nvidia", "packages", ["dkms"])  # roles/nvidia_driver/tasks/install.yml (artifact path)
        if gpu["nvswitch"]:
            need("nvidia", "artifacts", [settings["nvidia_driver_fabric_manager_artifact"]])
    if layers["rdma"]:
        if settings["rdma_stack"] == "doca_ofed":
            need("rdma", "artifacts", [settings["rdma_doca_artifact"]])
        else:
            need("rdma", "packages", settings["rdma_inbox_packages"])
    if layers["nccl"] and settings["nccl_install_method"] == "artifact":
        need("nccl", "artifacts", settings["nccl_artifacts"])
    if layers["enroot"]:
        need("enroot", "packages", role_value("enroot", "_enroot_dep_packages"))
        if settings["enroot_install_method"] == "source":  # roles/enroot/tasks/install_source.yml
            need("enroot", "packages", role_value("enroot", "_enroot_build_packages"))
            need("enroot", "artifacts", ["enroot_src"])
        else:
            need("enroot", "artifacts", ["enroot", "enroot_caps"] if settings["enroot_caps"] else ["enroot"])
    if layers["pyxis"]:
        need("pyxis", "packages", role_value("pyxis", "_pyxis_build_packages"))
        need("pyxis", "artifacts", ["pyxis"])  # roles/pyxis/tasks/install.yml
    if layers["slurm"]:
        need("slurm", "packages", role_value("munge", "_munge_packages"))
        # roles/slurm/vars/main.yml _slurm_packages: the common ones, slurmctld (controller), slurmd (compute)
        need("slurm", "packages", [*role_value("slurm", "_slurm_packages_common"), "slurmctld", "slurmd"])
        if cluster["slurm"]["accounting"]["enabled"]:
            # roles/slurmdbd/vars/main.yml: slurmdbd + its MySQL plugin, MariaDB (server, client, PyMySQL)
            need("slurm", "packages", role_value("slurmdbd", "_slurmdbd_slurm_packages"))
            need("slurm", "packages", role_value("slurmdbd", "_slurmdbd_mariadb_packages"))
    if layers["storage"] and storage["type"] == "nfs":
        # roles/shared_storage/vars/main.yml _shared_storage_packages (server and clients)
        need("storage", "packages", ["nfs-kernel-server", "nfs-common"])
    if layers["runner"]:
        need("runner", "packages", role_value("lcm_runner", "_lcm_runner_packages"))
    if layers["monitoring"]:
        mon = cluster["monitoring"]
        # roles/node_exporter, roles/prometheus, roles/alertmanager: Debian's packages (docs/monitoring.md)
        need("monitoring", "packages", MONITORING_PACKAGES)
        if mon["grafana"]["enabled"]:
            need("monitoring", "packages", role_value("grafana", "_grafana_dep_packages"))
            need("monitoring", "artifacts", ["grafana"])  # roles/grafana/tasks/install.yml
        if gpu["count_per_node"] > 0:
            # roles/dcgm_exporter/vars/main.yml _dcgm_exporter_artifacts: -proprietary only for DCGM_FI_PROF_*
            dcgm = ["dcgm", "dcgm_proprietary"] if _dcgm_prof(mon) else ["dcgm"]
            need("monitoring", "artifacts", [*dcgm, "dcgm_exporter"])
    return out


def _dcgm_prof(monitoring: Mapping[str, Any]) -> bool:
    """Any DCGM_FI_PROF_* field (DCGM's profiling module, in the -proprietary package)."""
    return any(str(f).startswith("DCGM_FI_PROF_") for f in monitoring["dcgm"]["fields"])


def _version(lock: Mapping[str, Any], kind: str, name: str) -> str | None:
    entry = (lock.get(kind) or {}).get(name)
    if kind == "artifacts":
        entry = entry.get("version") if isinstance(entry, dict) else None
    return entry if isinstance(entry, str) and entry else None


def _path(kind: str, name: str) -> str:
    return f"lcm_lock.{kind}.{name}"


def lock_errors(
    cluster: Mapping[str, Any], lock: Any, settings: Mapping[str, Any] | None = None
) -> list[SpecError]:
    """Shape, the entries the enabled layers need, and version pairs, of lock for the filled-in cluster."""
    errors = check_lock(lock)
    if errors:
        return errors
    view = release_view(cluster, lock)
    if isinstance(view, SpecError):
        return [view]
    lock, prefix = view
    return [in_release(e, prefix) for e in _release_errors(cluster, lock, settings)]


def _release_errors(
    cluster: Mapping[str, Any], lock: Mapping[str, Any], settings: Mapping[str, Any] | None
) -> list[SpecError]:
    """lock_errors against a lock whose packages are the release's."""
    errors: list[SpecError] = []
    s = role_settings(settings)
    errors += nvidia_settings(cluster, s)
    hints = _missing_hints(cluster, lock, s)
    missing: dict[tuple[str, str], list[str]] = {}
    for layer, kind, name in layer_needs(cluster, s):
        if (lock.get(kind) or {}).get(name) is None:
            missing.setdefault((kind, name), []).append(layer)
    for (kind, name), by in missing.items():
        layers = ", ".join(f"cluster.layers.{layer}" for layer in dict.fromkeys(by))
        hint = hints.get((kind, name), "")
        errors.append(
            SpecError(
                _path(kind, name), None, f"an entry: {layers} is true and installs it from the lock{hint}"
            )
        )
    return errors + _pairs(cluster, lock, s)


def _missing_hints(
    cluster: Mapping[str, Any], lock: Mapping[str, Any], s: Mapping[str, Any]
) -> dict[tuple[str, str], str]:
    """What a missing nvidia entry must be: the version it must have, from the driver's entry."""
    if not cluster["layers"]["nvidia"]:
        return {}
    driver = driver_entry(s)
    version = _version(lock, *driver)
    out: dict[tuple[str, str], str] = {}
    source = f"nvidia_driver_source={s['nvidia_driver_source']}"
    out[driver] = f" ({source}: the driver version every check expects)"
    if version is None:
        return out
    at = f"at the driver's version {upstream_version(version)} ({_path(*driver)} {version})"
    if cluster["gpu"]["nvswitch"]:
        fm = ("artifacts", str(s["nvidia_driver_fabric_manager_artifact"]))
        out[fm] = f"; cluster.gpu.nvswitch is true: Fabric Manager {at}"
    if s["nvidia_driver_source"] == "debian":
        for name in nvidia_debian_packages(s):
            if name in DRIVER_RELEASE_PACKAGES:
                extra = (
                    "; Debian 12 has it in contrib (source nvidia-open-gpu-kernel-modules)"
                    if name == "nvidia-open-kernel-dkms"
                    else ""
                )
                out[("packages", name)] = (
                    f" ({source}, nvidia_driver_kernel_module={s['nvidia_driver_kernel_module']}) {at}{extra}"
                )
    return out


def _same(
    lock: Mapping[str, Any], why: str, entries: list[tuple[str, str]], upstream: bool = False
) -> list[SpecError]:
    """Every present entry has the first present entry's version (upstream part only when upstream)."""
    present = [(k, n, v) for k, n in entries if (v := _version(lock, k, n)) is not None]
    if len(present) < 2:
        return []
    k0, n0, v0 = present[0]
    norm = upstream_version if upstream else str
    return [
        SpecError(_path(k, n), v, f"version {norm(v0)} like {_path(k0, n0)} ({why})")
        for k, n, v in present[1:]
        if norm(v) != norm(v0)
    ]


def _pairs(cluster: Mapping[str, Any], lock: Mapping[str, Any], s: Mapping[str, Any]) -> list[SpecError]:
    """Versions that must agree, for the layers that are on (what the roles would find at converge)."""
    layers, gpu = cluster["layers"], cluster["gpu"]
    e: list[SpecError] = []
    debian = s["nvidia_driver_source"] == "debian"
    driver = driver_entry(s)
    driver_version = _version(lock, *driver)
    if layers["nvidia"] and gpu["nvswitch"]:
        fm = ("artifacts", s["nvidia_driver_fabric_manager_artifact"])
        e += _same(lock, "Fabric Manager must equal the driver version", [driver, fm], upstream=True)
    if layers["nvidia"] and debian:
        release = [("packages", n) for n in nvidia_debian_packages(s) if n in DRIVER_RELEASE_PACKAGES]
        e += _same(lock, "built from the driver's release", [driver, *release], upstream=True)
    if layers["slurm"]:
        slurm = [*role_value("slurm", "_slurm_packages_common"), "slurmctld", "slurmd"]
        if layers["pyxis"]:
            slurm += role_value("pyxis", "_pyxis_build_packages")[:2]  # libslurm-dev, ...-plugins-dev
        why = "one Slurm release on every node" + (
            "; pyxis is built against these headers" if layers["pyxis"] else ""
        )
        e += _same(lock, why, [("packages", n) for n in slurm])
        if cluster["slurm"]["accounting"]["enabled"]:
            dbd = [slurm[0], *role_value("slurmdbd", "_slurmdbd_slurm_packages")]
            e += _same(lock, "slurmdbd is the Slurm release of the nodes", [("packages", n) for n in dbd])
            mariadb = [
                n for n in role_value("slurmdbd", "_slurmdbd_mariadb_packages") if n.startswith("mariadb-")
            ]
            e += _same(
                lock, "the MariaDB server and its client are one release", [("packages", n) for n in mariadb]
            )
        e += _same(
            lock, "munge and its library", [("packages", n) for n in role_value("munge", "_munge_packages")]
        )
    if layers["enroot"]:
        # a cluster may mix paths over time (a site moving from its own build to the .debs): one release
        e += _same(
            lock,
            "the release .debs and the source build are one Enroot release",
            [("artifacts", "enroot_src"), ("artifacts", "enroot")],
        )
    if layers["enroot"] and s["enroot_caps"] and s["enroot_install_method"] != "source":
        e += _same(
            lock,
            "enroot+caps is built for one enroot",
            [("artifacts", "enroot"), ("artifacts", "enroot_caps")],
        )
    nccl_names = list(s["nccl_artifacts"])
    nccl_used = (
        layers["nccl"] and gpu["count_per_node"] > 0 and s["nccl_install_method"] in ("auto", "artifact")
    )
    if nccl_used:
        e += _same(lock, "the NCCL runtime and its headers", [("artifacts", n) for n in nccl_names])
    if nccl_used and layers["nvidia"] and driver_version:
        for name in nccl_names:
            ver = _version(lock, "artifacts", name)
            m = re.search(r"\+cuda(\d+)\.(\d+)", ver or "")
            if not m or int(m.group(1)) not in CUDA_MIN_DRIVER:
                continue
            need = CUDA_MIN_DRIVER[int(m.group(1))]
            if version_tuple(upstream_version(driver_version)) < version_tuple(need):
                e.append(
                    SpecError(
                        _path(*driver),
                        driver_version,
                        f"a driver >= {need}: {_path('artifacts', name)} {ver} is built for CUDA "
                        f"{m.group(1)}.{m.group(2)}, which needs it",
                    )
                )
                break  # one error per driver (the NCCL artifacts share a version: checked above)
    if layers["monitoring"] and gpu["count_per_node"] > 0:
        e += _dcgm_pairs(cluster, lock)
    return e


def _dcgm_pairs(cluster: Mapping[str, Any], lock: Mapping[str, Any]) -> list[SpecError]:
    """dcgm-exporter is tagged <DCGM version>-<exporter version> (built for it); -proprietary equals -core."""
    e: list[SpecError] = []
    dcgm, exporter = _version(lock, "artifacts", "dcgm"), _version(lock, "artifacts", "dcgm_exporter")
    if dcgm and exporter and not exporter.startswith(upstream_version(dcgm) + "-"):
        e.append(
            SpecError(
                _path("artifacts", "dcgm_exporter"),
                exporter,
                f"a tag starting with {upstream_version(dcgm)}- like {_path('artifacts', 'dcgm')} {dcgm} "
                "(dcgm-exporter is tagged <DCGM version>-<exporter version> and built for that DCGM)",
            )
        )
    if _dcgm_prof(cluster["monitoring"]):
        e += _same(
            lock,
            "DCGM's profiling module and its core are one release",
            [("artifacts", "dcgm"), ("artifacts", "dcgm_proprietary")],
        )
    return e
