"""HCA checks on published ibstat outputs (ConnectX-7 at 400, one Polling), derived faults, and sysfs."""

from __future__ import annotations

from pathlib import Path

from lcm_runner.health.expect import FabricExpect, GpuExpect
from lcm_runner.health.fabric import check_fabric, parse_ibstat, read_sysfs
from lcm_runner.health.fabricmanager import FabricManagerState, check_fabric_manager, parse_version

FIX = Path(__file__).parent / "fixtures" / "health" / "ibstat"
IB8 = ("mlx5_0", "mlx5_3", "mlx5_4", "mlx5_5", "mlx5_6", "mlx5_9", "mlx5_10", "mlx5_11")
EXP = FabricExpect(type="infiniband", hcas=IB8, rate_gbps=400, port=1)


def by_name(checks):  # type: ignore[no-untyped-def]
    return {c.name: c for c in checks}


def test_parse_published_cx7() -> None:
    ports = parse_ibstat((FIX / "ibstat.cx7-400-mooncake-2039.txt").read_text())
    assert len(ports) == 12
    p = ports[("mlx5_0", 1)]
    assert (p.state, p.phys_state, p.rate_gbps, p.link_layer) == ("Active", "LinkUp", 400.0, "InfiniBand")
    d = ports[("mlx5_1", 1)]
    assert (d.state, d.phys_state, d.link_layer) == ("Down", "Disabled", "Ethernet")


def test_eight_cx7_at_400_pass() -> None:
    got = check_fabric("n", EXP, parse_ibstat((FIX / "ibstat.cx7-400-mooncake-2039.txt").read_text()))
    assert [c.status for c in got] == ["pass"] * 9
    assert got[1].value == "Active/LinkUp, InfiniBand, 400 Gb/s"


def test_rate_200_fails_naming_the_hca() -> None:
    got = by_name(
        check_fabric(
            "n", EXP, parse_ibstat((FIX / "ibstat.cx7-400-mooncake-2039.mlx5_4-rate-200.txt").read_text())
        )
    )
    assert {n for n, c in got.items() if c.status == "fail"} == {"fabric.mlx5_4"}
    assert got["fabric.mlx5_4"].reason == "mlx5_4 port 1: rate 200 Gb/s"


def test_disabled_ethernet_port_in_spec_fails_with_every_problem() -> None:
    exp = FabricExpect(type="infiniband", hcas=("mlx5_0", "mlx5_1"), rate_gbps=400)
    got = by_name(
        check_fabric("n", exp, parse_ibstat((FIX / "ibstat.cx7-400-mooncake-2039.txt").read_text()))
    )
    assert got["fabric.mlx5_1"].reason == (
        "mlx5_1 port 1: state Down; physical state Disabled; link layer Ethernet; rate 40 Gb/s"
    )


def test_polling_port_fails_and_missing_hca_named() -> None:
    exp = FabricExpect(type="infiniband", hcas=("mlx5_0", "mlx5_10"), rate_gbps=400)
    got = by_name(check_fabric("n", exp, parse_ibstat((FIX / "ibstat.cx7-polling-gpud-482.txt").read_text())))
    assert got["fabric.hcas_present"].status == "fail" and "mlx5_0" in got["fabric.hcas_present"].reason
    assert got["fabric.mlx5_10"].reason == "mlx5_10 port 1: state Down; physical state Polling; rate 10 Gb/s"


def test_roce_expects_ethernet_link_layer() -> None:
    exp = FabricExpect(type="roce", hcas=("mlx5_7",), rate_gbps=100)
    got = by_name(
        check_fabric("n", exp, parse_ibstat((FIX / "ibstat.cx7-400-mooncake-2039.txt").read_text()))
    )
    assert got["fabric.mlx5_7"].status == "pass"


def test_ethernet_spec_skips_and_unreadable_fails() -> None:
    assert check_fabric("n", FabricExpect(), None)[0].status == "skip"
    c = check_fabric("n", EXP, None, "ibstat not found on PATH")[0]
    assert c.status == "fail" and "ibstat not found" in c.reason


def test_sysfs(tmp_path: Path) -> None:
    for hca, state, phys, rate in (
        ("mlx5_0", "4: ACTIVE", "5: LinkUp", "400 Gb/sec (4X NDR)"),
        ("mlx5_1", "1: DOWN", "2: Polling", "10 Gb/sec (4X SDR)"),
    ):
        d = tmp_path / hca / "ports" / "1"
        d.mkdir(parents=True)
        (d / "state").write_text(state + "\n")
        (d / "phys_state").write_text(phys + "\n")
        (d / "rate").write_text(rate + "\n")
        (d / "link_layer").write_text("InfiniBand\n")
    exp = FabricExpect(type="infiniband", hcas=("mlx5_0", "mlx5_1", "mlx5_2"), rate_gbps=400)
    got = by_name(check_fabric("n", exp, read_sysfs(tmp_path, exp.hcas, 1)))
    assert got["fabric.mlx5_0"].status == "pass"
    assert got["fabric.mlx5_1"].reason == "mlx5_1 port 1: state Down; physical state Polling; rate 10 Gb/s"
    assert "mlx5_2" in got["fabric.hcas_present"].reason


NVS = GpuExpect(model="h200", count=8, driver="580.159.04", nvswitch=True, fabric_manager=True)


def test_fabric_manager_versions() -> None:
    assert parse_version("Fabric Manager version is : 580.159.04") == "580.159.04"
    assert parse_version("1:580.159.04-1") == "580.159.04"
    ok = by_name(
        check_fabric_manager(
            "n", NVS, FabricManagerState("active", "580.159.04-1", "package x"), "580.159.04"
        )
    )
    assert ok["fm.active"].status == ok["fm.version"].status == "pass"
    bad = by_name(
        check_fabric_manager("n", NVS, FabricManagerState("failed", "570.86.15-1", "package x"), "580.159.04")
    )
    assert bad["fm.active"].status == "fail" and bad["fm.version"].status == "fail"
    assert "differ" in bad["fm.version"].reason


def test_fabric_manager_without_systemd_skips_service_and_missing_version_fails() -> None:
    got = by_name(
        check_fabric_manager("n", NVS, FabricManagerState(None, None, error="nv-fabricmanager not found"), "")
    )
    assert got["fm.active"].status == "skip" and got["fm.active"].reason.startswith("no systemd")
    assert got["fm.version"].status == "fail"
    none = by_name(
        check_fabric_manager("n", GpuExpect(model="h200", count=1), FabricManagerState(None, None), "")
    )
    assert none["fm.active"].status == "skip"
