"""nvidia-smi topo -m and nvlink -s: the real 1-GPU capture, a published 8-GPU NV18 matrix, derived faults."""

from __future__ import annotations

from pathlib import Path

from lcm_runner.health.expect import GpuExpect
from lcm_runner.health.topo import check_nvlink, check_topo, parse_nvlink, parse_topo

FIX = Path(__file__).parent / "fixtures" / "health"
HGX = GpuExpect(model="h200", count=8, nvswitch=True)


def test_real_1gpu_header_with_ansi_escapes_parses() -> None:
    m = parse_topo((FIX / "h200-1gpu" / "nvidia-smi-topo-m.txt").read_text())
    assert m.gpus == ["GPU0"] and m.links == {("GPU0", "GPU0"): "X"}


def test_one_gpu_skips_the_pair_check_with_the_reason() -> None:
    m = parse_topo((FIX / "h200-1gpu" / "nvidia-smi-topo-m.txt").read_text())
    c = check_topo("n", GpuExpect(model="h200", count=1, nvlink=True), m)
    assert c.status == "skip" and "no GPU pair" in c.reason


def test_hgx_every_pair_nv18_passes() -> None:
    m = parse_topo((FIX / "hgx-8gpu" / "nvidia-smi-topo-m.txt").read_text())
    assert m.gpus == [f"GPU{i}" for i in range(8)]
    assert ("GPU0", "NIC0") not in m.links  # NIC columns are not GPU pairs
    c = check_topo("n", HGX, m)
    assert (c.status, c.value) == ("pass", "28 pairs NV18")


def test_hgx_pair_on_sys_fails_naming_the_pair() -> None:
    m = parse_topo((FIX / "hgx-8gpu" / "nvidia-smi-topo-m.gpu3-gpu5-sys.txt").read_text())
    c = check_topo("n", HGX, m)
    assert c.status == "fail" and c.value == "GPU3-GPU5: SYS" and "1 pair(s)" in c.reason


def test_no_nvlink_expected_skips() -> None:
    m = parse_topo((FIX / "hgx-8gpu" / "nvidia-smi-topo-m.gpu3-gpu5-sys.txt").read_text())
    assert check_topo("n", GpuExpect(model="h100", count=8), m).status == "skip"


def test_nvlink_s_all_active_passes() -> None:
    links = parse_nvlink((FIX / "a100-nvlink" / "nvidia-smi-nvlink-s.txt").read_text())
    assert sorted(links) == [0, 1] and len(links[1]) == 12
    c = check_nvlink("n", GpuExpect(model="h100", count=2, nvlink=True), links)
    assert (c.status, c.value) == ("pass", "24/24 active (25 GB/s)")


def test_nvlink_s_inactive_link_fails() -> None:
    links = parse_nvlink((FIX / "a100-nvlink" / "nvidia-smi-nvlink-s.gpu1-link7-inactive.txt").read_text())
    c = check_nvlink("n", GpuExpect(model="h100", count=2, nvlink=True), links)
    assert c.status == "fail" and c.value == "gpu1 link 7: inactive" and "1/24" in c.reason


def test_nvlink_s_empty_output_fails_where_nvlink_expected() -> None:
    assert check_nvlink("n", HGX, parse_nvlink("")).status == "fail"
