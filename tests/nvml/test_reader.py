"""The NVML reader through the real pynvml against the scripted stand-in library."""

from __future__ import annotations

import threading
import time

import pytest

from supervisor.adapters.nvml import NvmlReader, NvmlUnavailable
from supervisor.testing.kit.nvml_standin import DRIVER_NOT_LOADED, GPU_IS_LOST, NOT_SUPPORTED, TIMEOUT, NvmlStandin

pytestmark = pytest.mark.nvml


@pytest.fixture
def reader(standin: NvmlStandin) -> NvmlReader:
    r = NvmlReader()
    r.open()
    yield r
    r.close()


def test_reads_every_field_of_eight_gpus(standin: NvmlStandin, reader: NvmlReader) -> None:
    standin.gpu(
        3,
        ecc_vol_cor=12,
        ecc_vol_unc=1,
        ecc_agg_cor=40,
        ecc_agg_unc=2,
        retired_sbe=3,
        retired_dbe=2,
        retired_pending=1,
        remap_cor=5,
        remap_unc=4,
        remap_pending=1,
        remap_failed=1,
        clocks=0x88,
        temp=83,
        power_mw=612500,
        sm_mhz=1410,
        util_gpu=97,
        util_mem=41,
        nvlink_replay=7,
        nvlink_recovery=1,
        nvlink_crc_flit=20,
        nvlink_crc_data=3,
        recovery=2,
    )
    assert reader.driver == "550.54.15" and reader.gpu_count == 8 and reader.errors == []
    gpus = reader.sample()
    assert [g.i for g in gpus] == list(range(8)) and gpus[0].uuid == standin.gpus[0].uuid
    g = gpus[3]
    assert (g.name, g.bus) == ("NVIDIA H100 80GB HBM3", "00000000:79:00.0")
    assert (g.ecc_cor_vol, g.ecc_unc_vol, g.ecc_cor_agg, g.ecc_unc_agg) == (12, 1, 40, 2)
    assert (g.retired_sbe, g.retired_dbe, g.retired_pending) == (3, 2, True)
    assert (g.remap_cor, g.remap_unc, g.remap_pending, g.remap_failed) == (5, 4, True, True)
    assert (g.clocks, g.temp_c, g.power_w, g.sm_mhz, g.util, g.mem_util) == (0x88, 83, 612.5, 1410, 97, 41)
    assert (g.nvlink_replay, g.nvlink_recovery, g.nvlink_crc, g.recovery) == (7, 1, 23, 2)
    assert g.errors == {} and not g.lost


def test_not_supported_fields_are_absent_not_zero(standin: NvmlStandin, reader: NvmlReader) -> None:
    standin.gpu(1, nvlinks=0, recovery=-1, retired_sbe=-1, retired_dbe=-1, retired_pending=-1)
    standin.fail(1, "nvmlDeviceGetRemappedRows", NOT_SUPPORTED)
    standin.fail(1, "nvmlDeviceGetCurrentClocksEventReasons", NOT_SUPPORTED)
    g = reader.sample()[1]
    assert (g.remap_pending, g.retired_dbe, g.retired_pending, g.nvlink_crc, g.recovery, g.clocks) == (None,) * 6
    assert g.errors == {} and g.temp_c == 35


def test_errors_become_part_of_the_sample(standin: NvmlStandin, reader: NvmlReader) -> None:
    standin.fail(2, "nvmlDeviceGetTemperature", TIMEOUT)
    standin.fail(2, "nvmlDeviceGetTotalEccErrors", 999)
    g = reader.sample()[2]
    assert g.errors == {
        "temp_c": "Timeout",
        "ecc_cor_vol": "Unknown Error",
        "ecc_unc_vol": "Unknown Error",
        "ecc_cor_agg": "Unknown Error",
        "ecc_unc_agg": "Unknown Error",
    }
    assert g.temp_c is None and g.power_w == 70.0


def test_a_lost_gpu_is_reported_lost(standin: NvmlStandin, reader: NvmlReader) -> None:
    standin.gpu(6, lost=1)
    gpus = reader.sample()
    assert gpus[6].lost and gpus[6].uuid == standin.gpus[6].uuid and gpus[6].errors == {"gpu": "GPU is lost"}
    assert not gpus[5].lost
    standin.gpu(6, lost=0)
    standin.fail(6, "nvmlDeviceGetFieldValues", GPU_IS_LOST)  # lost half-way through a read
    assert reader.sample()[6].lost


def test_xid_events_arrive_while_waiting(standin: NvmlStandin, reader: NvmlReader) -> None:
    assert reader.wait_xids(0.05) == []
    timer = threading.Timer(0.2, lambda: (standin.xid(3, 79), standin.xid(5, 48)))
    timer.start()
    start = time.monotonic()
    events = reader.wait_xids(3.0)
    elapsed = time.monotonic() - start
    if len(events) == 1:
        events += reader.wait_xids(0.5)
    assert [(e.gpu, e.xid, e.uuid) for e in events] == [(3, 79, standin.gpus[3].uuid), (5, 48, standin.gpus[5].uuid)]
    assert 0.15 < elapsed < 1.5
    assert reader.wait_xids(0.05) == []  # each event once


def test_events_from_before_open_are_not_replayed(standin: NvmlStandin) -> None:
    standin.xid(0, 13)
    r = NvmlReader()
    r.open()
    try:
        assert r.wait_xids(0.1) == []
    finally:
        r.close()


def test_driver_not_loaded_is_unavailable(standin: NvmlStandin) -> None:
    standin.fail(None, "nvmlInitWithFlags", DRIVER_NOT_LOADED)
    with pytest.raises(NvmlUnavailable, match="Driver Not Loaded"):
        NvmlReader().open()


def test_event_set_unsupported_is_noted_not_fatal(standin: NvmlStandin) -> None:
    standin.fail(4, "nvmlDeviceRegisterEvents", NOT_SUPPORTED)
    r = NvmlReader()
    r.open()
    try:
        assert r.errors == ["gpu 4: no XID events: Not Supported"] and len(r.sample()) == 8
    finally:
        r.close()
