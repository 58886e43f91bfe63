"""lcm_runner.health.gpu on the real H200 capture and its derived failing variants.

Which fixture is real and which derived by which edit: fixtures/health/README.md.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from lcm_runner.health.expect import GpuExpect
from lcm_runner.health.gpu import GpuParseError, check_gpus, parse_xml

FIX = Path(__file__).parent / "fixtures" / "health"
REAL = FIX / "h200-1gpu" / "nvidia-smi-q.xml"
EXP = GpuExpect(model="h200", count=1, driver="580.159.04")


def checks(path: Path, exp: GpuExpect = EXP) -> dict[str, object]:
    return {c.name: c for c in check_gpus("n1", exp, parse_xml(path.read_text()))}


def test_parse_real_h200() -> None:
    log = parse_xml(REAL.read_text())
    assert log.driver == "580.159.04"
    (g,) = log.gpus
    assert (g.index, g.name, g.bus_id) == (0, "NVIDIA H200", "00000000:00:06.0")
    assert g.uuid == "GPU-bae1eb86-3098-d76c-c5c4-a91a2d461618"
    assert (g.persistence, g.ecc_current) == ("Enabled", "Enabled")
    assert (g.volatile_dram_uncorrectable, g.volatile_sram_uncorrectable) == (0, 0)
    assert g.retired_pages_pending == "N/A"
    assert (g.remapped_rows_pending, g.remapped_rows_failure) == ("No", "No")
    assert (g.pcie_gen_current, g.pcie_gen_max, g.pcie_width_current, g.pcie_width_max) == (5, 5, 16, 16)
    assert g.idle and not any(g.clocks_event_reasons[r] for r in g.clocks_event_reasons if r != "gpu_idle")
    assert g.fabric_state == "N/A"


def test_real_h200_passes() -> None:
    got = checks(REAL)
    assert {n: c.status for n, c in got.items() if c.status != "pass"} == {  # type: ignore[attr-defined]
        "gpu.retired_pages_pending": "skip",
        "gpu.fabric_state": "skip",
    }
    assert "not applicable" in got["gpu.retired_pages_pending"].reason  # type: ignore[attr-defined]
    assert got["gpu.retired_pages_pending"].value == "N/A"  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    ("fixture", "name", "in_value"),
    [
        ("nvidia-smi-q.remap-pending.xml", "gpu.row_remap_pending", "gpu0 (00000000:00:06.0): Yes"),
        ("nvidia-smi-q.remap-failure.xml", "gpu.row_remap_failure", "gpu0 (00000000:00:06.0): Yes"),
        ("nvidia-smi-q.dbe.xml", "gpu.volatile_dbe", "DRAM 2, SRAM 0"),
        ("nvidia-smi-q.retire-pending.xml", "gpu.retired_pages_pending", ": Yes"),
        ("nvidia-smi-q.persistence-off.xml", "gpu.persistence", ": Disabled"),
        ("nvidia-smi-q.ecc-off.xml", "gpu.ecc", ": Disabled"),
        ("nvidia-smi-q.hw-thermal.xml", "gpu.clocks", "hw_thermal_slowdown"),
        ("nvidia-smi-q.width-x8.xml", "gpu.pcie_width", "x8 (max x16)"),
        ("nvidia-smi-q.gen3-busy.xml", "gpu.pcie_gen", "current Gen3, max Gen5"),
        ("nvidia-smi-q.h100-name.xml", "gpu.model", "NVIDIA H100 80GB HBM3"),
    ],
)
def test_each_derived_variant_fails_that_check_only(fixture: str, name: str, in_value: str) -> None:
    got = checks(FIX / "derived" / fixture)
    failed = {n for n, c in got.items() if c.status == "fail"}  # type: ignore[attr-defined]
    assert failed == {name}
    c = got[name]
    assert in_value in c.value and c.reason  # type: ignore[attr-defined]


def test_idle_gpu_with_downtrained_link_passes_on_max_generation() -> None:
    c = checks(FIX / "derived" / "nvidia-smi-q.gen1-idle.xml")["gpu.pcie_gen"]
    assert c.status == "pass", c  # type: ignore[attr-defined]


def test_expected_generation_above_the_gpus_max_fails() -> None:
    exp = GpuExpect(model="h200", count=1, driver="580.159.04", pcie_gen=6, pcie_width=16)
    got = checks(REAL, exp)
    assert got["gpu.pcie_gen"].status == "fail" and got["gpu.pcie_gen"].expected.startswith("Gen6")  # type: ignore[attr-defined]
    assert got["gpu.pcie_width"].status == "pass"  # type: ignore[attr-defined]


def test_count_model_driver_mismatch() -> None:
    exp = GpuExpect(model="b200", count=8, driver="570.86.15")
    got = checks(REAL, exp)
    assert got["gpu.count"].status == "fail" and "lists 1 GPU(s), the spec says 8" in got["gpu.count"].reason  # type: ignore[attr-defined]
    assert got["gpu.model"].status == "fail"  # type: ignore[attr-defined]
    c = got["gpu.driver"]
    assert (c.status, c.value, c.expected) == ("fail", "580.159.04", "570.86.15")  # type: ignore[attr-defined]


def test_no_driver_in_expectation_is_a_skip_not_a_pass() -> None:
    got = checks(REAL, GpuExpect(model="h200", count=1, driver=""))
    assert got["gpu.driver"].status == "skip"  # type: ignore[attr-defined]


def test_fabric_state_on_nvswitch_expectation_with_na_is_skipped_with_reason() -> None:
    got = checks(REAL, GpuExpect(model="h200", count=1, driver="580.159.04", nvswitch=True))
    assert got["gpu.fabric_state"].status == "skip" and "N/A" in got["gpu.fabric_state"].reason  # type: ignore[attr-defined]


def test_not_xml() -> None:
    with pytest.raises(GpuParseError, match="not XML"):
        parse_xml("NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver.")
