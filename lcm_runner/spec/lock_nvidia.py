"""The NVIDIA driver's part of the lock rules (lock_rules.py uses these): version normalisation, the Debian
packages of the chosen kernel module flavour, the lock entry that holds the driver version, and the
flavour settings checked before any host changes."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from .errors import SpecError

# Debian packages built from the driver's own sources (nvidia-graphics-drivers,
# nvidia-open-gpu-kernel-modules): each one the inventory installs must carry the driver's upstream
# version (the kernel module loads only with the user space of its release; the open modules need the GSP
# firmware of their release).
DRIVER_RELEASE_PACKAGES = (
    "nvidia-kernel-dkms",
    "nvidia-open-kernel-dkms",
    "nvidia-smi",
    "firmware-nvidia-gsp",
)
KERNEL_MODULE_FLAVOURS = ("open", "proprietary")
# GPU models whose driver runs only with the open kernel modules (Blackwell).
OPEN_ONLY_MODELS = ("b200",)


def upstream_version(version: str) -> str:
    """'1:535.309.01-0+deb12u1' -> '535.309.01'; '580.159.04-1' -> '580.159.04' (also roles/nvidia_driver's
    `upstream_version` filter)."""
    v = str(version).strip()
    v = v.split(":", 1)[1] if re.match(r"^\d+:", v) else v
    return v.split("-", 1)[0]


def version_tuple(version: str) -> tuple[int, ...]:
    return tuple(int(p) for p in re.findall(r"\d+", version))


def nvidia_debian_packages(settings: Mapping[str, Any]) -> list[str]:
    """roles/nvidia_driver vars/main.yml _nvidia_driver_debian_install: nvidia_driver_debian_packages with the
    kernel module package of nvidia_driver_kernel_module (from nvidia_driver_debian_kernel_packages)."""
    kernel = settings["nvidia_driver_debian_kernel_packages"] or {}
    flavour = kernel.get(settings["nvidia_driver_kernel_module"]) if isinstance(kernel, Mapping) else None
    others = set(kernel.values()) if isinstance(kernel, Mapping) else set()
    base = [str(n) for n in settings["nvidia_driver_debian_packages"] if n not in others]
    return base + ([str(flavour)] if flavour else [])


def driver_entry(s: Mapping[str, Any]) -> tuple[str, str]:
    """The lock entry whose version is the driver version (roles/nvidia_driver vars/main.yml)."""
    if s["nvidia_driver_source"] == "debian":
        return ("packages", str(s["nvidia_driver_debian_packages"][0]))
    return ("artifacts", str(s["nvidia_driver_artifact"]))


def nvidia_settings(cluster: Mapping[str, Any], s: Mapping[str, Any]) -> list[SpecError]:
    """nvidia_driver_kernel_module: a known flavour, open on Blackwell; a Debian package for it."""
    if not cluster["layers"]["nvidia"]:
        return []
    flavour, model = s["nvidia_driver_kernel_module"], cluster["gpu"]["model"]
    if flavour not in KERNEL_MODULE_FLAVOURS:
        return [SpecError("nvidia_driver_kernel_module", flavour, "open or proprietary")]
    if flavour != "open" and model in OPEN_ONLY_MODELS:
        return [
            SpecError(
                "nvidia_driver_kernel_module",
                flavour,
                f"open: cluster.gpu.model is {model} (Blackwell), whose GPUs run only with the open "
                "kernel modules",
            )
        ]
    kernel = s["nvidia_driver_debian_kernel_packages"]
    if s["nvidia_driver_source"] == "debian" and not (isinstance(kernel, Mapping) and kernel.get(flavour)):
        return [
            SpecError(
                "nvidia_driver_debian_kernel_packages",
                kernel,
                f"a Debian package for nvidia_driver_kernel_module={flavour} "
                "(e.g. open: nvidia-open-kernel-dkms)",
            )
        ]
    return []
