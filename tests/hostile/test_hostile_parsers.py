"""Every parser of text from outside, fuzzed (issue 17, "Must show"): the training-log formats and
their stream parser, the log marks (checkpoint loads, pauses, rank prefixes, colour codes), the
JSONL telemetry protocol, nvidia-smi dumps and kernel XID lines, and the ingest's report decoder.

The properties: no exception escapes (0 crashes), each call returns in time linear in its input
(0 hangs: a per-example deadline, and long repeated fragments timed outright), and what comes out
is bounded by what went in. What the ingest accepts is judged by the GPU rules without error, and no
finding it yields carries a control character (the ingest refuses them)."""

from __future__ import annotations

import json
import math
import time
from pathlib import Path

import msgspec
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from supervisor.adapters.web.ingest import ReportIngest, Request
from supervisor.domain.health.gpu_health import HealthRules
from supervisor.domain.health.gpu_table import GpuHealthSettings
from supervisor.domain.health.gpu_text import parse_smi_query, parse_xid_lines
from supervisor.domain.health.node_report import GpuSample, NodeReport, ReportBatch, XidEvent, check_batch
from supervisor.domain.progress import FORMATS, parse_ssv_object, parse_trainer_state, parser_for
from supervisor.domain.progress.loads import MAX_LINE, LoadMark, LoadWatch, load_mark, load_segments
from supervisor.domain.progress.pauses import ends_pause, pause_of
from supervisor.domain.progress.prefixes import split_prefix, strip_ansi
from supervisor.domain.progress.record import count, number
from supervisor.domain.text_safety import has_controls
from supervisor.testing.kit.clock import ManualClock

DATA = Path(__file__).resolve().parents[1] / "data"
REAL = [
    line
    for path in sorted((DATA / "train_logs").glob("*.log")) + sorted((DATA / "gpu_errors").glob("*.txt"))
    for line in path.read_text(errors="replace").splitlines()
    if line.strip()
]
FRAGMENTS = [
    *"|:{}[]()'\",=\r\t\x00\x1b\x9b\u202e/ ",
    " iteration 5/ 10 |",
    "lm loss: ",
    "nan",
    "-inf",
    "1e308",
    "9" * 40,
    "[default7]:",
    "3: ",
    "\x1b[31m",
    "\x1b]0;t\x07",
    '{"ssv": 1, "step": ',
    "Epoch 0: ",
    "step: ",
    "NVRM: Xid (PCI:0000:19:00): ",
    "loading checkpoint",
    "Error: ",
    "saving checkpoint at iteration",
    "GPU 00000000:19:00.0",
    "    ",
]
damaged = st.builds(
    lambda line, at, cut, insert: line[:at] + insert + line[at + cut :],
    st.sampled_from(REAL),
    st.integers(0, 300),
    st.integers(0, 30),
    st.text(max_size=8),
)
lines = st.one_of(
    st.text(max_size=200),
    damaged,
    st.lists(st.one_of(st.sampled_from(FRAGMENTS), st.text(max_size=3)), max_size=30).map("".join),
)
FUZZ = settings(max_examples=150, deadline=2000, suppress_health_check=[HealthCheck.too_slow])


def _bounded(records: list[object], text: list[str]) -> None:
    parts = sum(line.count("\r") + 1 for line in text) + 1
    assert len(records) <= parts
    size = sum(map(len, text))
    assert all(len(repr(r)) <= 20 * size + 2000 for r in records)


@FUZZ
@given(st.lists(lines, max_size=15))
def test_the_stream_parser_of_every_format(text: list[str]) -> None:
    for name in (*FORMATS, None):
        parser = parser_for(name)
        records = [r for line in text for r in parser.feed(line)] + parser.flush()
        _bounded(records, text)


@FUZZ
@given(st.lists(lines, max_size=15))
def test_log_marks_and_prefixes(text: list[str]) -> None:
    watch = LoadWatch()
    for mark, segment in load_segments(text):
        if mark is not None:
            watch.mark(mark, segment[0])
        watch.lines(segment[1:])
    for ended in (False, True):
        failure = watch.failure(ended=ended)
        assert failure is None or len(failure) <= 3 * MAX_LINE + 200
    for line in text:
        assert load_mark(line) in (None, *LoadMark)
        assert pause_of(line) in (None, "an evaluation", "a checkpoint save")
        ends_pause(line)
        assert len(strip_ansi(line)) <= len(line)
        rank, body = split_prefix(line)
        assert len(body) <= len(line) and (rank is None or rank >= 0)
        number(line), count(line)


json_values = st.recursive(
    st.none() | st.booleans() | st.floats() | st.integers(-(2**70), 2**70) | st.text(max_size=10),
    lambda inner: st.lists(inner, max_size=5) | st.dictionaries(st.text(max_size=10), inner, max_size=5),
    max_leaves=30,
)
ssv_keys = st.sampled_from(["ssv", "step", "loss", "grad_norm", "lr", "rank", "rank_step_times_s", "event", "x"])


@FUZZ
@given(st.dictionaries(ssv_keys, json_values, max_size=8), st.sampled_from(["", "[default3]:", "7: "]))
def test_the_jsonl_telemetry_protocol(obj: dict[str, object], prefix: str) -> None:
    text = json.dumps(obj)
    record = parse_ssv_object(text)
    assert record is None or len(repr(record)) <= 20 * len(text) + 2000
    _bounded(parser_for("ssv-jsonl").feed_all([prefix + text]), [text])
    parse_trainer_state(json.dumps({"log_history": [obj, obj]}))


@FUZZ
@given(st.lists(lines, max_size=40))
@example(["NVRM: Xid (PCI:0000:19:00): 79, pid=7, GPU has fallen\x1b]0;owned\x07 off the bus\x9b2J"])
def test_nvidia_smi_dumps_and_kernel_xid_lines(text: list[str]) -> None:
    dump = parse_smi_query("\n".join(text))
    assert len(dump.gpus) <= len(text) and len(dump.problems) <= 3 * len(text) + 2
    events = parse_xid_lines(text, dump.gpus)
    assert len(events) <= len(text)
    for e in events:  # what a node's hook reads from its kernel log, the daemon accepts
        report = NodeReport(v=1, node="n1", seq=1, at=0.0, xids=(e,))
        assert check_batch(ReportBatch(v=1, node="n1", reports=(report,))) is None, e


PATHOLOGICAL = ["|", ":", " iteration 1/ 2 |", "{'a': ", "[default1]:", "\x1b[", "NVRM: Xid (PCI:0000:", "    a: b\n"]


@pytest.mark.timing
@settings(max_examples=len(PATHOLOGICAL) * 2, deadline=None)
@given(st.sampled_from(PATHOLOGICAL), st.sampled_from(["", "x", " 1"]))
def test_long_repeated_fragments_cost_linear_time(fragment: str, tail: str) -> None:
    line = fragment * (40_000 // len(fragment)) + tail
    start = time.perf_counter()
    for name in (*FORMATS, None):
        parser_for(name).feed_all([line, line])
    load_mark(line), pause_of(line), split_prefix(line), strip_ansi(line)
    parse_smi_query(line), parse_xid_lines([line])
    assert time.perf_counter() - start < 3.0


# ---------------------------------------------------------------- the ingest's report decoder

_DECODER = msgspec.json.Decoder(ReportBatch)
ints = st.one_of(st.integers(-5, 300), st.integers(-(2**70), 2**70))
floats = st.floats(allow_nan=True, allow_infinity=True)
text = st.one_of(st.text(max_size=12), st.sampled_from(["00000000:19:00.0", "GPU lost", "\x1b]0;x\x07"]))
gpu = st.fixed_dictionaries(
    {"i": ints},
    optional={
        "bus": text,
        "uuid": text,
        "name": text,
        "lost": st.booleans(),
        "ecc_unc_vol": ints,
        "ecc_cor_vol": ints,
        "remap_pending": st.booleans(),
        "clocks": ints,
        "temp_c": ints,
        "power_w": floats,
        "nvlink_crc": ints,
        "recovery": ints,
        "errors": st.dictionaries(text, text, max_size=3),
    },
)
xid = st.fixed_dictionaries({"gpu": ints, "xid": ints, "at": floats}, optional={"bus": text, "text": text})
report_obj = st.fixed_dictionaries(
    {"v": st.just(1), "node": st.just("n1"), "seq": ints, "at": floats},
    optional={
        "interval_s": floats,
        "source": st.sampled_from(["agent", "prolog", "bogus"]),
        "gpu_count": ints,
        "gpus": st.lists(gpu, max_size=4),
        "xids": st.lists(xid, max_size=4),
        "host": st.fixed_dictionaries({}, optional={"mem_used_pct": floats}),
        "errors": st.lists(text, max_size=3),
        "driver": text,
    },
)
batch_obj = st.fixed_dictionaries(
    {"v": st.just(1), "node": st.one_of(st.just("n1"), text), "reports": st.lists(report_obj, max_size=4)},
    optional={"dropped": ints},
)


@FUZZ
@given(st.one_of(batch_obj, json_values))
def test_the_report_decoder_and_the_rules_behind_it(obj: object) -> None:
    try:
        batch = _DECODER.decode(json.dumps(obj).encode())
    except (msgspec.ValidationError, msgspec.DecodeError):
        return
    if check_batch(batch) is not None:
        return
    rules = HealthRules(GpuHealthSettings(expected_gpus=8))
    for report in batch.reports:
        for finding in rules.evaluate(report, 0.0, "r"):
            assert not has_controls(finding.reason) and len(finding.reason) <= 2000
    assert rules.tracked <= 1


_INGEST = ReportIngest({"r": "token-0123456789"}, HealthRules(), ManualClock())
_INGEST.publish_job_nodes({"r": frozenset({"n1"})})


@FUZZ
@given(st.one_of(st.binary(max_size=300), batch_obj.map(lambda o: json.dumps(o).encode())))
def test_the_report_route_answers_every_body(body: bytes) -> None:
    headers = {"authorization": "Bearer token-0123456789"}
    answer = _INGEST.handle(Request("POST", "/v1/reports/r", "", headers, body, "10.0.0.1"))
    assert answer.status in (200, 400, 403, 422), answer
    assert len(answer.body) <= 1000
    _INGEST.drain_findings()


def test_a_finding_reason_is_finite_text() -> None:
    gpus = tuple(GpuSample(i=i, bus=f"00000000:{i:02X}:00.0", temp_c=199, ecc_unc_vol=2**62) for i in range(64))
    xids = tuple(XidEvent(gpu=-1, xid=79, at=math.inf if i else 0.0, bus="0" * 128) for i in range(2))
    report = NodeReport(v=1, node="n1", seq=1, at=0.0, gpus=gpus, xids=xids)
    assert check_batch(ReportBatch(v=1, node="n1", reports=(report,))) is not None  # at = inf refused
    report = NodeReport(v=1, node="n1", seq=1, at=0.0, gpus=gpus, xids=xids[:1])
    assert check_batch(ReportBatch(v=1, node="n1", reports=(report,))) is None
    found = HealthRules().evaluate(report, 0.0)
    assert found and all(len(f.reason) <= 300 for f in found)


def test_a_batch_of_every_maximum_is_judged_quickly() -> None:
    """The largest batch the schema allows (4 reports here of 64 GPUs x 64 NVML errors, 256 XIDs)."""
    gpus = tuple(GpuSample(i=i, errors={f"field{k}": "Timeout" for k in range(64)}) for i in range(64))
    xids = tuple(XidEvent(gpu=i % 64, xid=79 + i % 3, at=0.0, text="x" * 1024) for i in range(256))
    reports = tuple(NodeReport(v=1, node="n1", seq=s, at=float(s), gpus=gpus, xids=xids) for s in range(4))
    start = time.perf_counter()
    assert check_batch(ReportBatch(v=1, node="n1", reports=reports)) is None
    rules = HealthRules(GpuHealthSettings(expected_gpus=8))
    for r in reports:
        rules.evaluate(r, 0.0)
    assert time.perf_counter() - start < 10.0
