"""Kernel-log XIDs: the real dmesg (none), derived lines, an ignored code, an unreadable log."""

from __future__ import annotations

from pathlib import Path

from lcm_runner.health.collect import Output, kernel_log
from lcm_runner.health.expect import GpuExpect
from lcm_runner.health.xid import check_xids, parse_xids

FIX = Path(__file__).parent / "fixtures" / "health"
EXP = GpuExpect(model="h200", count=1)


def test_real_dmesg_has_no_xid_and_passes() -> None:
    text = (FIX / "h200-1gpu" / "dmesg.txt").read_text()
    assert parse_xids(text) == []
    assert check_xids("n", EXP, text).status == "pass"


def test_xid79_parsed_and_fails() -> None:
    text = (FIX / "derived" / "dmesg.xid79.txt").read_text()
    (x,) = parse_xids(text)
    assert (x.code, x.pci, x.message) == (
        79,
        "PCI:0000:00:06",
        "pid='<unknown>', name=<unknown>, GPU has fallen off the bus.",
    )
    c = check_xids("n", EXP, text)
    assert c.status == "fail" and "Xid 79 on PCI:0000:00:06" in c.value and "codes 79" in c.reason


def test_ignored_code_passes_and_is_counted() -> None:
    text = (FIX / "derived" / "dmesg.xid13-ignored.txt").read_text()
    assert check_xids("n", EXP, text).status == "fail"
    c = check_xids("n", GpuExpect(model="h200", count=1, xid_ignore=(13,)), text)
    assert (c.status, c.value, c.expected) == ("pass", "1 ignored XID line(s)", "no XID except 13")


def test_unreadable_kernel_log_is_a_skip_with_the_reason() -> None:
    restricted = (FIX / "derived" / "dmesg.restricted.txt").read_text().strip()

    def runner(argv, timeout):  # type: ignore[no-untyped-def]
        if argv[0] == "dmesg":
            return Output(None, f"dmesg exited 1: {restricted}")
        return Output("", "")  # journalctl without permission: no entries

    out = kernel_log(runner)
    assert out.text is None and "Operation not permitted" in out.error and "journalctl" in out.error
    c = check_xids("n", EXP, out.text, out.error)
    assert c.status == "skip" and "kernel log unreadable" in c.reason and "not permitted" in c.reason


def test_journalctl_fallback_is_read() -> None:
    xid = (FIX / "derived" / "dmesg.xid79.txt").read_text()

    def runner(argv, timeout):  # type: ignore[no-untyped-def]
        return Output(None, "dmesg exited 1: not permitted") if argv[0] == "dmesg" else Output(xid)

    assert kernel_log(runner).text == xid
