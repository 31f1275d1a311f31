"""The report schema: compact wire form, decoding with the ingest's decoder, and the checks a type
decoder cannot make."""

from __future__ import annotations

import json

import msgspec
import pytest
from msgspec.structs import replace

from supervisor.domain.health.node_report import (
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
        (dict(reports=()), "at least one report"),
        (dict(reports=(report(node="gpu002"),)), "inside a batch from node"),
        (dict(reports=(report(v=3),)), "report schema version 3"),
        (dict(reports=(report(source="shell"),)), "source 'shell'"),
        (dict(reports=(report(at=float("nan")),)), "finite time"),
        (dict(reports=(report(xids=(XidEvent(gpu=1, xid=79, at=float("inf")),)),)), "finite time"),
        (dict(reports=(report(gpus=(GpuSample(i=1), GpuSample(i=1))),)), "appears twice"),
        (dict(reports=(report(gpus=(GpuSample(i=0, uuid="GPU 1"),)),)), "gpu 0: uuid"),
        (dict(reports=(report(gpus=(GpuSample(i=2, errors={"temp": "Time\x1bout"}),)),)), "gpu 2: errors"),
        (dict(reports=(report(driver="550;reboot"),)), "driver"),
        (dict(reports=(report(errors=("a\nb",)),)), "errors"),
    ],
)
def test_check_batch_names_the_problem(change: dict[str, object], expected: str) -> None:
    problem = check_batch(batch(**change))
    assert problem is not None and expected in problem


@pytest.mark.parametrize(
    ("change", "path"),
    [
        (dict(node="gpu 001; rm -rf"), "$.node"),
        (dict(dropped=-1), "$.dropped"),
        (dict(reports=(report(),) * (MAX_REPORTS_PER_BATCH + 1)), "$.reports"),
        (dict(reports=(report(seq=-1),)), "$.reports[0].seq"),
        (dict(reports=(report(interval_s=1e6),)), "$.reports[0].interval_s"),
        (dict(reports=(report(gpus=(GpuSample(i=MAX_GPUS),)),)), "$.reports[0].gpus[0].i"),
        (dict(reports=(report(gpus=(GpuSample(i=0, ecc_unc_vol=-5),)),)), "$.reports[0].gpus[0].ecc_unc_vol"),
        (dict(reports=(report(gpus=(GpuSample(i=0, util=250),)),)), "$.reports[0].gpus[0].util"),
        (dict(reports=(report(gpus=(GpuSample(i=0, power_w=1e9),)),)), "$.reports[0].gpus[0].power_w"),
        (dict(reports=(report(gpus=(GpuSample(i=0, uuid="x" * 300),)),)), "$.reports[0].gpus[0].uuid"),
        (dict(reports=(report(gpus=(GpuSample(i=0, name="n" * 300),)),)), "$.reports[0].gpus[0].name"),
        (dict(reports=(report(xids=(XidEvent(gpu=99, xid=79, at=1.0),)),)), "$.reports[0].xids[0].gpu"),
        (dict(reports=(report(xids=(XidEvent(gpu=1, xid=0, at=1.0),)),)), "$.reports[0].xids[0].xid"),
        (dict(reports=(report(errors=("e",) * 100),)), "$.reports[0].errors"),
        (dict(reports=(report(gpu_count=65),)), "$.reports[0].gpu_count"),
    ],
)
def test_the_decoder_refuses_a_value_out_of_bounds_with_its_path(change: dict[str, object], path: str) -> None:
    """The schema's bounds are in the types: the ingest's decoder refuses them, naming the field."""
    text = msgspec.json.encode(to_wire(batch(**change)))
    with pytest.raises(msgspec.ValidationError) as refused:
        msgspec.json.Decoder(ReportBatch).decode(text)
    assert str(refused.value).endswith(f"at `{path}`")


def test_decoder_refuses_wrong_types_with_the_path() -> None:
    text = json.dumps({"v": 1, "node": "n", "reports": [{"v": 1, "node": "n", "seq": "x", "at": 1}]})
    with pytest.raises(msgspec.ValidationError, match=r"reports\[0\]\.seq"):
        msgspec.json.decode(text, type=ReportBatch)
