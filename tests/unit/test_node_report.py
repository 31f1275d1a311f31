"""The report schema: compact wire form, decoding with the ingest's decoder, and the checks a type
decoder cannot make."""

from __future__ import annotations

import json
from dataclasses import replace

import msgspec
import pytest

from supervisor.domain.node_report import (
    MAX_GPUS,
    MAX_REPORTS_PER_BATCH,
    SCHEMA_VERSION,
    GpuSample,
    HostSample,
    NodeReport,
    ReportBatch,
    XidEvent,
    check_batch,
    to_wire,
)


def report(seq: int = 1, node: str = "gpu001", **kw: object) -> NodeReport:
    gpus = tuple(
        GpuSample(i=i, uuid=f"GPU-{i}", bus=f"00000000:{i:02X}:00.0", ecc_unc_vol=0, temp_c=50, power_w=400.5, util=90)
        for i in range(8)
    )
    base = NodeReport(
        v=SCHEMA_VERSION,
        node=node,
        seq=seq,
        at=1000.0 + seq,
        interval_s=5.0,
        gpu_count=8,
        gpus=gpus,
        host=HostSample(mem_used_pct=40.0),
    )
    return replace(base, **kw)  # type: ignore[arg-type]


def batch(*reports: NodeReport, node: str = "gpu001", **kw: object) -> ReportBatch:
    return replace(ReportBatch(v=SCHEMA_VERSION, node=node, reports=reports or (report(),)), **kw)  # type: ignore[arg-type]


def test_wire_form_round_trips_through_the_ingest_decoder() -> None:
    original = batch(report(xids=(XidEvent(gpu=3, xid=79, at=1001.0),)), dropped=2)
    text = json.dumps(to_wire(original), separators=(",", ":"))
    decoded = msgspec.json.decode(text, type=ReportBatch)
    assert decoded == original
    assert check_batch(decoded) is None


def test_wire_form_leaves_out_what_was_not_read() -> None:
    wire = to_wire(GpuSample(i=0, temp_c=40))
    assert wire == {"i": 0, "uuid": "", "bus": "", "name": "", "temp_c": 40}
    assert len(json.dumps(to_wire(batch()), separators=(",", ":"))) < 2500  # 8 GPUs stay compact


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        (dict(v=2), "batch schema version 2"),
        (dict(node="gpu 001; rm -rf"), "node must be"),
        (dict(reports=()), "at least one report"),
        (dict(dropped=-1), "dropped must not be negative"),
        (dict(reports=(report(),) * (MAX_REPORTS_PER_BATCH + 1)), "at most 256 reports"),
        (dict(reports=(report(node="gpu002"),)), "inside a batch from node"),
        (dict(reports=(report(v=3),)), "report schema version 3"),
        (dict(reports=(report(source="shell"),)), "source 'shell'"),
        (dict(reports=(report(at=float("nan")),)), "finite time"),
        (dict(reports=(report(gpus=(GpuSample(i=MAX_GPUS),)),)), "outside 0..63"),
        (dict(reports=(report(gpus=(GpuSample(i=1), GpuSample(i=1))),)), "appears twice"),
        (dict(reports=(report(gpus=(GpuSample(i=0, ecc_unc_vol=-5),)),)), "must not be negative"),
        (dict(reports=(report(gpus=(GpuSample(i=0, util=250),)),)), "util must be within"),
        (dict(reports=(report(gpus=(GpuSample(i=0, power_w=float("inf")),)),)), "power_w"),
        (dict(reports=(report(gpus=(GpuSample(i=0, uuid="x" * 300),)),)), "at most 128"),  # an identifier
        (dict(reports=(report(xids=(XidEvent(gpu=99, xid=79, at=1.0),)),)), "xid event 79"),
        (dict(reports=(report(errors=("e",) * 100),)), "errors"),
    ],
)
def test_check_batch_names_the_problem(change: dict[str, object], expected: str) -> None:
    problem = check_batch(batch(**change))
    assert problem is not None and expected in problem


def test_decoder_refuses_wrong_types_with_the_path() -> None:
    text = json.dumps({"v": 1, "node": "n", "reports": [{"v": 1, "node": "n", "seq": "x", "at": 1}]})
    with pytest.raises(msgspec.ValidationError, match=r"reports\[0\]\.seq"):
        msgspec.json.decode(text, type=ReportBatch)
