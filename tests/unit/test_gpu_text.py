"""Parsers of real `nvidia-smi -q` dumps and kernel XID lines (../shared/data/gpu_errors/)."""

from __future__ import annotations

from pathlib import Path

import pytest

from supervisor.domain.health.gpu_text import parse_smi_query, parse_xid_lines, pci_key, with_xids
from supervisor.domain.health.node_report import GpuSample

DATA = Path(__file__).resolve().parents[1] / "data" / "gpu_errors"  # copies of ../shared/data/gpu_errors


def read(name: str) -> str:
    path = DATA / name
    if not path.exists():
        pytest.fail(f"shared data file {path} is missing (the tests read the real dumps)")
    return path.read_text()


def test_a10_dump_with_a_pending_row_remap() -> None:
    dump = parse_smi_query(read("gpud_nvidia-smi-query.535.129.03.out.0.valid.a10"))
    assert dump.problems == () and dump.driver == "535.129.03" and dump.attached == 1
    (g,) = dump.gpus
    assert (g.name, g.bus, g.uuid) == ("NVIDIA A10", "00000000:07:00.0", "GPU-73d12ef7-f589-f867-4259-c7090ab44736")
    assert (g.remap_unc, g.remap_pending, g.remap_failed) == (4, True, False)
    assert (g.ecc_unc_vol, g.retired_dbe, g.temp_c, g.power_w, g.sm_mhz) == (0, None, 33, 43.89, 225)
    assert g.clocks == 0x1  # idle only


def test_h100_dump_eight_gpus_with_power_brake() -> None:
    dump = parse_smi_query(read("gpud_nvidia-smi-query.535.161.08.out.0.valid"))
    assert dump.problems == () and len(dump.gpus) == 8 and [g.i for g in dump.gpus] == list(range(8))
    assert all(g.name == "NVIDIA H100 80GB HBM3" and g.ecc_unc_vol == 0 and g.remap_pending is False for g in dump.gpus)
    assert dump.gpus[0].clocks == 0x08 | 0x80  # HW slowdown + HW power brake slowdown: Active
    assert dump.gpus[0].recovery == 0  # "Reset Required: No", "Drain and Reset Recommended: No"
    assert len({g.uuid for g in dump.gpus}) == 8


def test_volta_dump_reads_not_available_as_unsupported() -> None:
    dump = parse_smi_query(read("gpud_nvidia-smi-query.560.35.03.out.0.valid"))
    (g,) = dump.gpus
    assert g.name == "NVIDIA TITAN V"
    assert (g.ecc_cor_vol, g.ecc_unc_vol, g.remap_pending, g.retired_sbe) == (None, None, None, None)
    assert g.temp_c == 44


def test_invalid_dump_is_reported_not_raised() -> None:
    dump = parse_smi_query(read("gpud_nvidia-smi-query.535.183.01.out.0.invalid"))
    assert len(dump.gpus) == 1
    text = " | ".join(dump.problems)
    assert "says 8, the dump has 1" in text and "Invalid HW Slowdown" in text and "cut short" in text


def test_a100_dump_uses_the_throttle_reasons_name() -> None:
    dump = parse_smi_query(read("m4_tr141_a100_nvidia-smi-q.gpu0.txt"))
    assert dump.driver == "525.60.13" and dump.gpus[0].clocks == 0
    assert dump.gpus[0].remap_failed is False


def test_not_a_dump() -> None:
    dump = parse_smi_query("hello\nworld : 3\n")
    assert dump.gpus == () and any("Driver Version" in p for p in dump.problems)


def test_xid_lines_from_public_issues() -> None:
    events = parse_xid_lines(read("xid_lines_from_public_issues.txt").splitlines())
    codes = [e.xid for e in events]
    assert {13, 31, 32, 43, 45, 48, 62, 63, 64, 79, 109, 145, 149} <= set(codes)
    # one Xid 79 per fallen GPU: the a1 line pair counts once, the b3 multi-line message counts
    fallen = sorted(e.bus for e in events if e.xid == 79)
    assert fallen == ["0000:44:00", "0000:a1:00", "0000:b3:00"]
    dbe = next(e for e in events if e.xid == 48)
    assert dbe.bus == "0000:07:00" and dbe.text.startswith("An uncorrectable double bit error")
    assert next(e for e in events if e.xid == 63).bus == "0000:10:1c"


def test_xid_119_gsp_timeouts_in_dmesg() -> None:
    events = parse_xid_lines(read("gpud_dmesg-with-xid-119.log").splitlines())
    assert [e.xid for e in events] == [119] * 5
    assert events[0].text.startswith("Timeout after 6s of waiting for RPC response from GPU4 GSP")


@pytest.mark.parametrize("name", ["gpud_kmsg.1.log", "gpud_kmsg.2.peermem.log"])
def test_kmsg_without_xids(name: str) -> None:
    assert parse_xid_lines(read(name).splitlines()) == []


def test_xid_events_placed_on_gpus_by_pci_address() -> None:
    gpus = [GpuSample(i=4, bus="00000000:9B:00.0"), GpuSample(i=0, bus="00000000:19:00.0")]
    events = parse_xid_lines(read("gpud_dmesg-with-xid-119.log").splitlines(), gpus)
    assert {e.gpu for e in events} == {4}
    assert pci_key("PCI:0000:9b:00") == pci_key("00000000:9B:00.0") == (0, 0x9B, 0)
    unplaced = parse_xid_lines(["NVRM: Xid (PCI:0000:19:00): 79, GPU has fallen off the bus"])
    assert unplaced[0].gpu == -1 and with_xids(gpus, unplaced)[0].gpu == 0
