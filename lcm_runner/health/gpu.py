"""nvidia-smi -q -x (XML) -> per-GPU state, and the checks of that state against the expectation.

PCIe link generation and idle GPUs: to save power an idle GPU may train its link down, so nvidia-smi's
"current" generation can read below the slot's (e.g. Gen1 on an idle Gen5 link). The generation check
therefore compares the current generation while the GPU is busy, and the link's max generation while
nvidia-smi reports the GPU idle (clocks event reason `gpu_idle` Active); the value says which it used.
The link *width* does not train down at idle: a narrower current width always fails.
"""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field

from .expect import GpuExpect
from .report import Check, check, skip

NA = "N/A"
# Clock event reasons that mean the clocks are held by a thermal or power violation (-> fail).
VIOLATIONS = ("hw_slowdown", "hw_thermal_slowdown", "hw_power_brake_slowdown", "sw_thermal_slowdown")
REASONS = ("gpu_idle", "sw_power_cap", *VIOLATIONS)


class GpuParseError(ValueError):
    """nvidia-smi's XML could not be read."""


@dataclass(frozen=True)
class Gpu:
    index: int  # minor number (the /dev/nvidiaN number)
    name: str
    uuid: str
    bus_id: str
    persistence: str  # Enabled / Disabled
    ecc_current: str  # Enabled / Disabled / N/A
    volatile_dram_uncorrectable: int | None
    volatile_sram_uncorrectable: int | None
    retired_pages_pending: str  # Yes / No / N/A (row-remapping GPUs report N/A)
    remapped_rows_pending: str  # Yes / No / N/A
    remapped_rows_failure: str  # Yes / No / N/A
    pcie_gen_current: int | None
    pcie_gen_max: int | None
    pcie_width_current: int | None
    pcie_width_max: int | None
    clocks_event_reasons: dict[str, bool] = field(default_factory=dict)  # reason -> Active
    fabric_state: str = NA
    fabric_status: str = NA

    @property
    def label(self) -> str:
        return f"gpu{self.index} ({self.bus_id})"

    @property
    def idle(self) -> bool:
        return self.clocks_event_reasons.get("gpu_idle", False)


@dataclass(frozen=True)
class SmiLog:
    driver: str
    gpus: list[Gpu]


def _text(el: ET.Element | None, path: str, default: str = NA) -> str:
    if el is None:
        return default
    found = el.find(path)
    if found is None or found.text is None:
        return default
    return found.text.strip()


def _int(text: str) -> int | None:
    m = re.match(r"^\s*(\d+)", text)
    return int(m.group(1)) if m else None


def _sum(*texts: str) -> int | None:
    values = [_int(t) for t in texts]
    known = [v for v in values if v is not None]
    return sum(known) if known else None


def parse_xml(text: str) -> SmiLog:
    """Parse `nvidia-smi -q -x`. The DOCTYPE line is ignored (no DTD is fetched)."""
    try:
        root = ET.fromstring(text)
    except ET.ParseError as e:
        raise GpuParseError(f"nvidia-smi -q -x is not XML: {e}") from e
    if root.tag != "nvidia_smi_log":
        raise GpuParseError(f"nvidia-smi -q -x: root element <{root.tag}>, expected <nvidia_smi_log>")
    gpus = []
    for i, g in enumerate(root.findall("gpu")):
        vol = g.find("ecc_errors/volatile")
        reasons = {
            r: _text(g, f"clocks_event_reasons/clocks_event_reason_{r}", "Not Active") == "Active"
            for r in REASONS
        }
        minor = _int(_text(g, "minor_number"))
        gpus.append(
            Gpu(
                index=minor if minor is not None else i,
                name=_text(g, "product_name"),
                uuid=_text(g, "uuid"),
                bus_id=g.get("id") or _text(g, "pci/pci_bus_id"),
                persistence=_text(g, "persistence_mode"),
                ecc_current=_text(g, "ecc_mode/current_ecc"),
                # Older drivers name the DRAM counter double_bit (<volatile><double_bit><total>).
                volatile_dram_uncorrectable=_sum(_text(vol, "dram_uncorrectable"))
                if _text(vol, "dram_uncorrectable") != NA
                else _sum(_text(vol, "double_bit/total")),
                volatile_sram_uncorrectable=_sum(
                    _text(vol, "sram_uncorrectable_parity"),
                    _text(vol, "sram_uncorrectable_secded"),
                    _text(vol, "sram_uncorrectable"),
                ),
                retired_pages_pending=_text(g, "retired_pages/pending_retirement"),
                remapped_rows_pending=_text(g, "remapped_rows/remapped_row_pending"),
                remapped_rows_failure=_text(g, "remapped_rows/remapped_row_failure"),
                pcie_gen_current=_int(_text(g, "pci/pci_gpu_link_info/pcie_gen/current_link_gen")),
                pcie_gen_max=_int(_text(g, "pci/pci_gpu_link_info/pcie_gen/max_link_gen")),
                pcie_width_current=_int(_text(g, "pci/pci_gpu_link_info/link_widths/current_link_width")),
                pcie_width_max=_int(_text(g, "pci/pci_gpu_link_info/link_widths/max_link_width")),
                clocks_event_reasons=reasons,
                fabric_state=_text(g, "fabric/state"),
                fabric_status=_text(g, "fabric/status"),
            )
        )
    return SmiLog(driver=_text(root, "driver_version"), gpus=gpus)


GPU_CHECKS = (
    "gpu.count",
    "gpu.model",
    "gpu.driver",
    "gpu.persistence",
    "gpu.ecc",
    "gpu.volatile_dbe",
    "gpu.retired_pages_pending",
    "gpu.row_remap_pending",
    "gpu.row_remap_failure",
    "gpu.pcie_gen",
    "gpu.pcie_width",
    "gpu.clocks",
    "gpu.fabric_state",
)


def skip_all(node: str, reason: str) -> list[Check]:
    return [skip(node, name, reason) for name in GPU_CHECKS]


def _each(
    node: str, name: str, gpus: list[Gpu], bad: dict[str, str], expected: str, ok_value: str, reason: str
) -> Check:
    """One check over every GPU: bad = {gpu label: what it reports} for the GPUs that fail."""
    if bad:
        value = "; ".join(f"{k}: {v}" for k, v in bad.items())
        return check(node, name, False, value, expected, f"{len(bad)}/{len(gpus)} GPU(s) {reason}")
    return check(node, name, True, f"{len(gpus)}/{len(gpus)} {ok_value}", expected)


def check_gpus(node: str, exp: GpuExpect, log: SmiLog) -> list[Check]:
    gpus = log.gpus
    out = [
        check(
            node,
            "gpu.count",
            len(gpus) == exp.count,
            len(gpus),
            exp.count,
            f"nvidia-smi lists {len(gpus)} GPU(s), the spec says {exp.count}",
        )
    ]
    bad = {g.label: g.name for g in gpus if exp.product not in g.name.upper()}
    out.append(
        _each(
            node, "gpu.model", gpus, bad, f"product name with {exp.product}", exp.product, "of another model"
        )
    )
    if exp.driver:
        out.append(
            check(
                node,
                "gpu.driver",
                log.driver == exp.driver,
                log.driver,
                exp.driver,
                "the loaded driver is not the locked version",
            )
        )
    else:
        out.append(skip(node, "gpu.driver", "the expectation names no driver version (none locked)"))
    if exp.persistence:
        bad = {g.label: g.persistence for g in gpus if g.persistence != "Enabled"}
        out.append(
            _each(node, "gpu.persistence", gpus, bad, "Enabled", "Enabled", "without persistence mode")
        )
    else:
        out.append(skip(node, "gpu.persistence", "spec: persistence not required"))
    if exp.ecc:
        bad = {g.label: g.ecc_current for g in gpus if g.ecc_current != "Enabled"}
        out.append(_each(node, "gpu.ecc", gpus, bad, "Enabled", "Enabled", "with ECC not enabled"))
    else:
        out.append(skip(node, "gpu.ecc", "spec: ECC not required"))
    bad = {
        g.label: f"DRAM {g.volatile_dram_uncorrectable}, SRAM {g.volatile_sram_uncorrectable}"
        for g in gpus
        if (g.volatile_dram_uncorrectable or 0) + (g.volatile_sram_uncorrectable or 0) > 0
    }
    out.append(
        _each(node, "gpu.volatile_dbe", gpus, bad, "0 uncorrectable", "0", "with uncorrectable ECC errors")
    )
    if all(g.retired_pages_pending == NA for g in gpus):
        out.append(
            skip(
                node,
                "gpu.retired_pages_pending",
                "not applicable: nvidia-smi reports N/A (this GPU retires no pages, it remaps rows)",
                "No",
                NA,
            )
        )
    else:
        bad = {g.label: g.retired_pages_pending for g in gpus if g.retired_pages_pending == "Yes"}
        out.append(
            _each(node, "gpu.retired_pages_pending", gpus, bad, "No", "No", "with page retirement pending")
        )
    bad = {g.label: g.remapped_rows_pending for g in gpus if g.remapped_rows_pending == "Yes"}
    out.append(
        _each(
            node, "gpu.row_remap_pending", gpus, bad, "No", "No", "with a row remap pending (reset the GPU)"
        )
    )
    bad = {g.label: g.remapped_rows_failure for g in gpus if g.remapped_rows_failure == "Yes"}
    out.append(_each(node, "gpu.row_remap_failure", gpus, bad, "No", "No", "with a failed row remap (RMA)"))
    out += [_pcie_gen(node, exp, gpus), _pcie_width(node, exp, gpus), _clocks(node, gpus)]
    out.append(_fabric_state(node, exp, gpus))
    return out


def _pcie_gen(node: str, exp: GpuExpect, gpus: list[Gpu]) -> Check:
    bad: dict[str, str] = {}
    for g in gpus:
        want = exp.pcie_gen or g.pcie_gen_max
        seen = g.pcie_gen_max if g.idle else g.pcie_gen_current
        if want is None or seen is None or seen < want or (g.pcie_gen_max or 0) < want:
            bad[g.label] = f"current Gen{g.pcie_gen_current}, max Gen{g.pcie_gen_max}" + (
                " (idle)" if g.idle else ""
            )
    expected = f"Gen{exp.pcie_gen}" if exp.pcie_gen else "the GPU's max generation"
    expected += " (max generation when idle)"
    ok_value = ",".join(sorted({f"Gen{g.pcie_gen_current}" for g in gpus})) or "-"
    return _each(node, "gpu.pcie_gen", gpus, bad, expected, ok_value, "below the expected PCIe generation")


def _pcie_width(node: str, exp: GpuExpect, gpus: list[Gpu]) -> Check:
    bad = {}
    for g in gpus:
        want = exp.pcie_width or g.pcie_width_max
        if want is None or g.pcie_width_current is None or g.pcie_width_current < want:
            bad[g.label] = f"x{g.pcie_width_current} (max x{g.pcie_width_max})"
    expected = f"x{exp.pcie_width}" if exp.pcie_width else "the GPU's max width"
    ok_value = ",".join(sorted({f"x{g.pcie_width_current}" for g in gpus})) or "-"
    return _each(node, "gpu.pcie_width", gpus, bad, expected, ok_value, "on a narrower PCIe link")


def _clocks(node: str, gpus: list[Gpu]) -> Check:
    bad = {}
    for g in gpus:
        active = [r for r in VIOLATIONS if g.clocks_event_reasons.get(r)]
        if active:
            bad[g.label] = ", ".join(active)
    return _each(
        node,
        "gpu.clocks",
        gpus,
        bad,
        "no HW slowdown / HW thermal / HW power brake / SW thermal",
        "not throttled",
        "with clocks held by a thermal or power violation",
    )


def _fabric_state(node: str, exp: GpuExpect, gpus: list[Gpu]) -> Check:
    if not exp.nvswitch:
        return skip(node, "gpu.fabric_state", "spec: no NVSwitch")
    if all(g.fabric_state == NA for g in gpus):
        return skip(node, "gpu.fabric_state", "nvidia-smi reports no fabric state (N/A)", "Completed/Success")
    bad = {
        g.label: f"{g.fabric_state}/{g.fabric_status}"
        for g in gpus
        if g.fabric_state != "Completed" or g.fabric_status not in ("Success", NA)
    }
    return _each(
        node,
        "gpu.fabric_state",
        gpus,
        bad,
        "Completed/Success",
        "Completed",
        "not registered with the fabric",
    )
