"""Run this node's commands (nvidia-smi, the kernel log, ibstat/sysfs, Fabric Manager) with timeouts.

A missing tool or a failing command is kept as an Output with text None and the reason: the checks turn
it into a FAIL (GPUs expected, nvidia-smi missing) or a SKIP with that reason (kernel log unreadable),
never into a silent pass. `from_dir` reads the same outputs from files instead (a capture made by
scripts/gpu/capture_health.sh, or tests).
"""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from .expect import Expectation
from .fabric import HcaPort, parse_ibstat, read_sysfs
from .fabricmanager import FabricManagerState

TIMEOUT_S = 60.0
SYSFS_IB = Path("/sys/class/infiniband")
SYSTEMD_DIR = Path("/run/systemd/system")
FM_UNIT = "nvidia-fabricmanager"


@dataclass(frozen=True)
class Output:
    text: str | None  # None: not available (see error)
    error: str = ""


Runner = Callable[[Sequence[str], float], Output]


def run(argv: Sequence[str], timeout: float = TIMEOUT_S) -> Output:
    """argv's stdout, or None with the reason (not installed, timed out, exit status and stderr)."""
    if shutil.which(argv[0]) is None:
        return Output(None, f"{argv[0]} not found on PATH")
    try:
        p = subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout, check=False)
    except subprocess.TimeoutExpired:
        return Output(None, f"{' '.join(argv)} timed out after {timeout:g} s")
    except OSError as e:
        return Output(None, f"{' '.join(argv)}: {e.strerror or e}")
    if p.returncode != 0:
        err = " ".join((p.stderr or p.stdout).split())[:300]
        return Output(None, f"{' '.join(argv)} exited {p.returncode}: {err}")
    return Output(p.stdout)


@dataclass
class Raw:
    """Everything the checks read, as collected on the node."""

    smi_xml: Output
    topo: Output
    nvlink: Output
    kernel_log: Output
    ports: dict[tuple[str, int], HcaPort] | None
    ports_error: str = ""
    fm: FabricManagerState = field(default_factory=lambda: FabricManagerState(None, None))


def kernel_log(runner: Runner) -> Output:
    """dmesg, else journalctl -k (this boot); None with both reasons when neither can be read."""
    d = runner(["dmesg"], TIMEOUT_S)
    if d.text is not None and "not permitted" not in d.text:
        return d
    j = runner(["journalctl", "-k", "-b", "--no-pager", "-q"], TIMEOUT_S)
    if j.text is not None and j.text.strip() and "insufficient permissions" not in j.text:
        return j
    why_j = j.error or ("no entries (insufficient permissions?)" if j.text is not None else "")
    return Output(None, f"dmesg: {d.error or 'restricted'}; journalctl -k: {why_j}")


def fabric_manager(runner: Runner, driver: str, systemd_dir: Path = SYSTEMD_DIR) -> FabricManagerState:
    active: str | None = None
    if systemd_dir.is_dir():
        # is-active exits 3 for inactive: the word on stdout is the answer either way.
        r = runner(["systemctl", "is-active", FM_UNIT], 15.0)
        active = (r.text or r.error.rsplit(":", 1)[-1]).strip() or "unknown"
    v = runner(["nv-fabricmanager", "--version"], 15.0)
    if v.text is not None:
        return FabricManagerState(active, v.text, "nv-fabricmanager --version")
    branch = driver.split(".", 1)[0] if driver else ""
    errors = [v.error]
    for pkg in ([f"nvidia-fabricmanager-{branch}"] if branch else []) + ["nvidia-fabricmanager"]:
        d = runner(["dpkg-query", "-W", "-f=${Version}", pkg], 15.0)
        if d.text:
            return FabricManagerState(active, d.text, f"package {pkg}")
        errors.append(d.error or f"{pkg}: no version")
    return FabricManagerState(active, None, error="; ".join(e for e in errors if e))


def collect(
    exp: Expectation,
    runner: Runner = run,
    sysfs_root: Path = SYSFS_IB,
    systemd_dir: Path = SYSTEMD_DIR,
) -> Raw:
    gpus = exp.gpu.count > 0
    none = Output(None, "spec: no GPUs")
    smi = runner(["nvidia-smi", "-q", "-x"], TIMEOUT_S) if gpus else none
    nvlink_wanted = gpus and (exp.gpu.nvlink or exp.gpu.nvswitch)
    topo = runner(["nvidia-smi", "topo", "-m"], TIMEOUT_S) if nvlink_wanted else none
    nvlink = runner(["nvidia-smi", "nvlink", "-s"], TIMEOUT_S) if nvlink_wanted else none
    klog = kernel_log(runner) if gpus else none
    ports, ports_error = None, ""
    if exp.fabric.hcas and exp.fabric.type != "ethernet":
        if sysfs_root.is_dir():
            ports = read_sysfs(sysfs_root, exp.fabric.hcas, exp.fabric.port)
        else:
            ib = runner(["ibstat"], 30.0)
            ports, ports_error = (parse_ibstat(ib.text), "") if ib.text is not None else (None, ib.error)
            if ports is None:
                ports_error = f"{sysfs_root} absent and {ports_error}"
    fm = FabricManagerState(None, None)
    if gpus and exp.gpu.nvswitch and exp.gpu.fabric_manager:
        fm = fabric_manager(runner, exp.gpu.driver, systemd_dir)
    return Raw(smi, topo, nvlink, klog, ports, ports_error, fm)


# File names of scripts/gpu/capture_health.sh's capture.
CAPTURE = {
    "smi_xml": "nvidia-smi-q.xml",
    "topo": "nvidia-smi-topo-m.txt",
    "nvlink": "nvidia-smi-nvlink-s.txt",
    "kernel_log": "dmesg.txt",
    "ibstat": "ibstat.txt",
    "fm_version": "nv-fabricmanager-version.txt",
    "fm_active": "fabricmanager-active.txt",
}


def _file(d: Path, name: str) -> Output:
    p = d / name
    try:
        text = p.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return Output(None, f"{p} not captured")
    rc = d / f"{name}.rc"
    if rc.exists() and rc.read_text().strip() not in ("", "0"):
        err = (d / f"{name}.err").read_text(errors="replace") if (d / f"{name}.err").exists() else ""
        return Output(None, f"{name}: exit {rc.read_text().strip()}: {' '.join(err.split())[:300]}")
    return Output(text)


def from_dir(d: Path) -> Raw:
    """The raw outputs from a capture directory (same file names as scripts/gpu/capture_health.sh)."""
    ib = _file(d, CAPTURE["ibstat"])
    fm_v = _file(d, CAPTURE["fm_version"])
    fm_a = _file(d, CAPTURE["fm_active"])
    fm = FabricManagerState(
        fm_a.text.strip() if fm_a.text is not None else None,
        fm_v.text,
        "nv-fabricmanager --version" if fm_v.text is not None else "",
        fm_v.error,
    )
    kl = _file(d, CAPTURE["kernel_log"])
    if kl.text is not None and "Operation not permitted" in kl.text and "NVRM" not in kl.text:
        kl = Output(None, f"dmesg: {' '.join(kl.text.split())[:200]}")
    return Raw(
        smi_xml=_file(d, CAPTURE["smi_xml"]),
        topo=_file(d, CAPTURE["topo"]),
        nvlink=_file(d, CAPTURE["nvlink"]),
        kernel_log=kl,
        ports=parse_ibstat(ib.text) if ib.text is not None else None,
        ports_error=ib.error,
        fm=fm,
    )
