"""GPU health: dcgm-exporter's fields (cluster.monitoring.dcgm.fields) per node and GPU.

Every series here comes from dcgm-exporter on GPU compute nodes; the lab has no GPUs, so its test loads
fixture series in dcgm-exporter's format (tests/fixtures/dcgm/) through a node's textfile collector.
Units are dcgm-exporter's: FB in MiB, power in W, violations in ns of throttling (DCGM 4), the PROF
byte fields are rates already (bytes/s gauges), the ratio fields 0..1.
"""

from __future__ import annotations

from .common import ALERTS, DCGM, RATE, Dashboard, N, Panel, Row, Target, q

_BY = "max by (node, gpu)"
_SUM = "sum by (node, gpu)"
_LEG = "{{node}} gpu{{gpu}}"


def _gauge(field: str, legend: str = _LEG) -> Target:
    return q(f"{_BY} (DCGM_FI_DEV_{field}{N})", legend)


def _rate(field: str, legend: str = _LEG) -> Target:
    return q(f"{_SUM} (rate(DCGM_FI_DEV_{field}{N}{RATE}))", legend)


def _prof(field: str, legend: str = _LEG) -> Target:
    return q(f"{_BY} (DCGM_FI_PROF_{field}{N})", legend)


ERRORS = Row(
    "Errors (any non-zero value needs a look)",
    (
        Panel(
            "XID: last error code",
            (_gauge("XID_ERRORS"),),
            DCGM,
            description="DCGM_FI_DEV_XID_ERRORS: the value of the last XID the driver reported (0: none).",
            width=8,
        ),
        Panel(
            "ECC errors (volatile, since driver load)",
            (
                _gauge("ECC_DBE_VOL_TOTAL", "{{node}} gpu{{gpu}} double-bit"),
                _gauge("ECC_SBE_VOL_TOTAL", "{{node}} gpu{{gpu}} single-bit"),
            ),
            DCGM,
            description="Double-bit errors are uncorrectable: drain the node. Single-bit ones are corrected.",
            width=8,
        ),
        Panel(
            "Row remapping: pending / failed",
            (
                _gauge("ROW_REMAP_PENDING", "{{node}} gpu{{gpu}} pending"),
                _gauge("ROW_REMAP_FAILURE", "{{node}} gpu{{gpu}} failed"),
            ),
            DCGM,
            description="Pending: a GPU reset applies the remap. Failed: the GPU needs replacing.",
            width=8,
        ),
        Panel(
            "NVLink CRC flit errors and replays / s",
            (
                _rate("NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL", "{{node}} gpu{{gpu}} CRC flit"),
                _rate("NVLINK_REPLAY_ERROR_COUNT_TOTAL", "{{node}} gpu{{gpu}} replay"),
            ),
            DCGM,
            width=8,
        ),
        Panel("PCIe replays / s", (_rate("PCIE_REPLAY_COUNTER"),), DCGM, width=8),
        Panel(
            "Throttled by power / thermal limits (fraction of time)",
            (
                q(f"{_SUM} (rate(DCGM_FI_DEV_POWER_VIOLATION{N}{RATE})) / 1e9", "{{node}} gpu{{gpu}} power"),
                q(
                    f"{_SUM} (rate(DCGM_FI_DEV_THERMAL_VIOLATION{N}{RATE})) / 1e9",
                    "{{node}} gpu{{gpu}} thermal",
                ),
            ),
            DCGM,
            unit="percentunit",
            description="Violation counters are ns of throttling (DCGM 4): rate / 1e9 = share of wall time.",
            width=8,
        ),
    ),
)

STATE = Row(
    "Temperature, power, utilization, memory",
    (
        Panel(
            "Temperature",
            (
                _gauge("GPU_TEMP", "{{node}} gpu{{gpu}} GPU"),
                _gauge("MEMORY_TEMP", "{{node}} gpu{{gpu}} memory"),
            ),
            DCGM,
            unit="celsius",
            threshold=float(ALERTS["gpu_temp_c"]),
            description="Red line: the GPU temperature alert (monitoring.alerts.gpu_temp_c, default).",
        ),
        Panel("Power draw", (_gauge("POWER_USAGE"),), DCGM, unit="watt"),
        Panel("GPU utilization", (_gauge("GPU_UTIL"),), DCGM, unit="percent", width=12),
        Panel("Framebuffer used", (_gauge("FB_USED"),), DCGM, unit="mbytes", width=6),
        Panel(
            "Framebuffer used share",
            (
                q(
                    f"{_BY} (DCGM_FI_DEV_FB_USED{N} / (DCGM_FI_DEV_FB_USED{N} + DCGM_FI_DEV_FB_FREE{N}))",
                    _LEG,
                ),
            ),
            DCGM,
            unit="percentunit",
            description="Used / (used + free).",
            width=6,
        ),
    ),
)

PROFILING = Row(
    "Profiling (DCP fields)",
    (
        Panel(
            "Engine activity",
            (
                _prof("GR_ENGINE_ACTIVE", "{{node}} gpu{{gpu}} graphics engine"),
                _prof("SM_ACTIVE", "{{node}} gpu{{gpu}} SM"),
                _prof("PIPE_TENSOR_ACTIVE", "{{node}} gpu{{gpu}} tensor pipe"),
                _prof("DRAM_ACTIVE", "{{node}} gpu{{gpu}} DRAM"),
            ),
            DCGM,
            unit="percentunit",
            width=24,
        ),
        Panel(
            "NVLink throughput",
            (
                _prof("NVLINK_TX_BYTES", "{{node}} gpu{{gpu}} tx"),
                _prof("NVLINK_RX_BYTES", "{{node}} gpu{{gpu}} rx"),
            ),
            DCGM,
            unit="Bps",
        ),
        Panel(
            "PCIe throughput",
            (
                _prof("PCIE_TX_BYTES", "{{node}} gpu{{gpu}} tx"),
                _prof("PCIE_RX_BYTES", "{{node}} gpu{{gpu}} rx"),
            ),
            DCGM,
            unit="Bps",
        ),
    ),
)

DASHBOARD = Dashboard(
    uid="lcm-gpu-health",
    title="lcm-infra / GPU health (DCGM)",
    description="dcgm-exporter fields per node and GPU: errors, throttling, temperature, power, profiling.",
    rows=(ERRORS, STATE, PROFILING),
)
