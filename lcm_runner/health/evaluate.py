"""The raw outputs of a node + its expectation -> the node's Report (every check, in a fixed order)."""

from __future__ import annotations

from .collect import Raw
from .expect import Expectation
from .fabric import check_fabric
from .fabricmanager import check_fabric_manager
from .gpu import GPU_CHECKS, GpuParseError, check_gpus, parse_xml
from .report import Check, Report, check, skip
from .topo import TopoParseError, check_nvlink, check_topo, parse_nvlink, parse_topo
from .xid import check_xids

NO_GPUS = "spec: no GPUs"
GPU_EXTRA = ("gpu.topo_nvlink", "gpu.nvlink_links", "gpu.xid", "fm.active", "fm.version")


def _gpu_section(exp: Expectation, raw: Raw) -> tuple[list[Check], str]:
    node, g = exp.node, exp.gpu
    if g.count == 0:
        return [skip(node, n, NO_GPUS) for n in (*GPU_CHECKS, *GPU_EXTRA)], ""
    out: list[Check] = []
    driver = ""
    if raw.smi_xml.text is None:
        out.append(
            check(
                node, "gpu.count", False, "nvidia-smi unavailable", g.count, raw.smi_xml.error or "no output"
            )
        )
        out += [skip(node, n, "nvidia-smi unavailable (see gpu.count)") for n in GPU_CHECKS[1:]]
    else:
        try:
            log = parse_xml(raw.smi_xml.text)
        except GpuParseError as e:
            out.append(check(node, "gpu.count", False, "unparsable", g.count, str(e)))
            out += [skip(node, n, "nvidia-smi output unparsable (see gpu.count)") for n in GPU_CHECKS[1:]]
        else:
            driver = log.driver
            out += check_gpus(node, g, log)
    if raw.topo.text is None:
        if g.nvlink or g.nvswitch:
            out.append(
                check(node, "gpu.topo_nvlink", False, "unavailable", "NV# for every GPU pair", raw.topo.error)
            )
        else:
            out.append(skip(node, "gpu.topo_nvlink", "spec: gpu.nvlink false (no NVLink expected)"))
    else:
        try:
            out.append(check_topo(node, g, parse_topo(raw.topo.text)))
        except TopoParseError as e:
            out.append(check(node, "gpu.topo_nvlink", False, "unparsable", "NV# for every GPU pair", str(e)))
    if raw.nvlink.text is None:
        if g.nvlink or g.nvswitch:
            out.append(
                check(node, "gpu.nvlink_links", False, "unavailable", "every NVLink active", raw.nvlink.error)
            )
        else:
            out.append(skip(node, "gpu.nvlink_links", "spec: gpu.nvlink false (no NVLink expected)"))
    else:
        out.append(check_nvlink(node, g, parse_nvlink(raw.nvlink.text)))
    out.append(check_xids(node, g, raw.kernel_log.text, raw.kernel_log.error))
    out += check_fabric_manager(node, g, raw.fm, driver)
    return out, driver


def evaluate(exp: Expectation, raw: Raw) -> Report:
    checks, _ = _gpu_section(exp, raw)
    checks += check_fabric(exp.node, exp.fabric, raw.ports, raw.ports_error)
    return Report(exp.node, checks)
