"""nvidia-smi topo -m (the GPU matrix) and nvidia-smi nvlink -s (per-link state) and their checks.

topo -m: every GPU pair must be `NV<n>` (a bonded set of n NVLinks) where the expectation says nvlink.
nvlink -s: no link of any GPU may read `<inactive>` where NVLink is expected.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from .expect import GpuExpect
from .report import Check, check, skip

ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
GPU_NAME = re.compile(r"^GPU\d+$")


class TopoParseError(ValueError):
    """The topo -m output has no GPU matrix."""


@dataclass(frozen=True)
class TopoMatrix:
    gpus: list[str]  # GPU0, GPU1, ...
    links: dict[tuple[str, str], str]  # (GPUi, GPUj) -> X / NV18 / SYS / PIX / ...

    def pairs(self) -> list[tuple[str, str, str]]:
        return [
            (a, b, self.links.get((a, b), "?")) for i, a in enumerate(self.gpus) for b in self.gpus[i + 1 :]
        ]


def parse_topo(text: str) -> TopoMatrix:
    lines = [ANSI.sub("", line).rstrip() for line in text.splitlines()]
    header_i = next((i for i, line in enumerate(lines) if re.match(r"^\s+GPU0\b", line)), None)
    if header_i is None:
        raise TopoParseError("nvidia-smi topo -m: no header line with GPU0")
    header = lines[header_i].split()
    cols = [h for h in header if GPU_NAME.match(h)]
    links: dict[tuple[str, str], str] = {}
    rows: list[str] = []
    for line in lines[header_i + 1 :]:
        if not line.strip() or line.startswith("Legend"):
            break
        cells = line.split()
        if not GPU_NAME.match(cells[0]):
            continue
        rows.append(cells[0])
        for col, cell in zip(cols, cells[1 : 1 + len(cols)], strict=False):
            links[(cells[0], col)] = cell
    return TopoMatrix(gpus=rows, links=links)


@dataclass(frozen=True)
class NvLinkState:
    gpu: int
    link: int
    speed_gbs: float | None  # None = <inactive>

    @property
    def active(self) -> bool:
        return self.speed_gbs is not None


def parse_nvlink(text: str) -> dict[int, list[NvLinkState]]:
    """`nvidia-smi nvlink -s`: GPU n: ... then `Link k: 25 GB/s` or `Link k: <inactive>` lines."""
    out: dict[int, list[NvLinkState]] = {}
    gpu: int | None = None
    for raw in text.splitlines():
        line = raw.strip()
        if m := re.match(r"^GPU (\d+):", line):
            gpu = int(m.group(1))
            out[gpu] = []
        elif gpu is not None and (m := re.match(r"^Link (\d+): (.+)$", line)):
            speed = re.match(r"^([\d.]+)\s*GB/s", m.group(2))
            out[gpu].append(NvLinkState(gpu, int(m.group(1)), float(speed.group(1)) if speed else None))
    return out


def _nvlink_expected(exp: GpuExpect) -> bool:
    return exp.nvlink or exp.nvswitch  # an NVSwitch baseboard connects every pair over NVLink


def check_topo(node: str, exp: GpuExpect, matrix: TopoMatrix) -> Check:
    if not _nvlink_expected(exp):
        return skip(node, "gpu.topo_nvlink", "spec: gpu.nvlink false (no NVLink expected)")
    if len(matrix.gpus) < 2:
        return skip(
            node, "gpu.topo_nvlink", f"{len(matrix.gpus)} GPU in topo -m: no GPU pair to check", "NV#"
        )
    pairs = matrix.pairs()
    bad = [(a, b, cell) for a, b, cell in pairs if not re.match(r"^NV\d+$", cell)]
    if bad:
        value = ", ".join(f"{a}-{b}: {cell}" for a, b, cell in bad)
        return check(
            node,
            "gpu.topo_nvlink",
            False,
            value,
            "NV# for every GPU pair",
            f"{len(bad)} pair(s) not on NVLink",
        )
    kinds = ",".join(sorted({cell for _, _, cell in pairs}))
    return check(node, "gpu.topo_nvlink", True, f"{len(pairs)} pairs {kinds}", "NV# for every GPU pair")


def check_nvlink(node: str, exp: GpuExpect, links: dict[int, list[NvLinkState]]) -> Check:
    if not _nvlink_expected(exp):
        return skip(node, "gpu.nvlink_links", "spec: gpu.nvlink false (no NVLink expected)")
    total = sum(len(v) for v in links.values())
    if total == 0:
        return check(
            node,
            "gpu.nvlink_links",
            False,
            "no links listed",
            "every NVLink active",
            "nvidia-smi nvlink -s lists no link",
        )
    down = [s for v in links.values() for s in v if not s.active]
    if down:
        value = ", ".join(f"gpu{s.gpu} link {s.link}: inactive" for s in down)
        return check(
            node, "gpu.nvlink_links", False, value, "every NVLink active", f"{len(down)}/{total} link(s) down"
        )
    speeds = ",".join(sorted({f"{s.speed_gbs:g} GB/s" for v in links.values() for s in v}))
    return check(node, "gpu.nvlink_links", True, f"{total}/{total} active ({speeds})", "every NVLink active")
