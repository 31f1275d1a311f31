"""GPU-health rules: the table, hysteresis, settings — on plain data and on the real dumps."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from msgspec.structs import replace

from supervisor.domain.health.findings import NodeFinding, Severity
from supervisor.domain.health.gpu_conditions import gpu_conditions, quiet
from supervisor.domain.health.gpu_health import RULES_VERSION, HealthRules
from supervisor.domain.health.gpu_table import XID_CATALOGUE, GpuHealthSettings
from supervisor.domain.health.gpu_text import parse_smi_query, parse_xid_lines
from supervisor.domain.health.node_report import SCHEMA_VERSION, GpuSample, HostSample, NodeReport, XidEvent

DATA = Path(__file__).resolve().parents[1] / "data" / "gpu_errors"  # copies of ../shared/data/gpu_errors


def healthy(i: int) -> GpuSample:
    return GpuSample(
        i=i,
        bus=f"00000000:{0x19 + i:02X}:00.0",
        ecc_cor_vol=0,
        ecc_unc_vol=0,
        remap_cor=0,
        remap_unc=0,
        remap_pending=False,
        remap_failed=False,
        retired_sbe=0,
        retired_dbe=0,
        clocks=0,
        temp_c=50,
        nvlink_crc=0,
        nvlink_replay=0,
        nvlink_recovery=0,
        recovery=0,
    )


class Node:
    """Feeds one node's reports to the rules, one per call, with increasing seq and time."""

    def __init__(self, rules: HealthRules | None = None, name: str = "gpu001") -> None:
        self.rules = rules or HealthRules()
        self.name = name
        self.seq = 0

    def report(self, gpus: dict[int, dict[str, object]] | None = None, **kw: object) -> list[NodeFinding]:
        self.seq += 1
        samples = tuple(replace(healthy(i), **(gpus or {}).get(i, {})) for i in range(8))  # type: ignore[arg-type]
        kw.setdefault("gpu_count", 8)
        r = NodeReport(v=SCHEMA_VERSION, node=self.name, seq=self.seq, at=float(self.seq), gpus=samples, **kw)  # type: ignore[arg-type]
        return self.rules.evaluate(r, now=100.0 + self.seq, run="run1")


def rules_of(findings: list[NodeFinding]) -> list[str]:
    return sorted(f.rule for f in findings)


def test_healthy_node_has_no_findings() -> None:
    node = Node()
    assert all(node.report() == [] for _ in range(20))


@pytest.mark.parametrize(
    ("xid", "severity"),
    [
        (48, Severity.FATAL),
        (63, Severity.DEGRADED),
        (64, Severity.FATAL),
        (74, Severity.FATAL),
        (79, Severity.FATAL),
        (94, Severity.DEGRADED),
        (95, Severity.FATAL),
        (119, Severity.FATAL),
        (120, Severity.FATAL),
        (13, Severity.WATCH),
        (31, Severity.WATCH),
        (43, Severity.WATCH),
        (4242, Severity.WATCH),
    ],
)
def test_xids_classed_after_the_catalogue(xid: int, severity: Severity) -> None:
    (f,) = Node().report(xids=(XidEvent(gpu=3, xid=xid, at=1.0),))
    assert (f.severity, f.rule, f.node, f.run, f.at) == (
        severity,
        f"xid-{xid}@{RULES_VERSION}",
        "gpu001",
        "run1",
        101.0,
    )
    assert f"XID {xid}" in f.reason and "gpu 3" in f.reason and f.evidence["xid"] == xid


def test_xid_79_fires_once_then_stays_latched_until_clear() -> None:
    node = Node(HealthRules(GpuHealthSettings(clear_samples=3)))
    x79 = (XidEvent(gpu=3, xid=79, at=1.0),)
    assert rules_of(node.report(xids=x79)) == ["xid-79@1"]
    assert node.report(xids=x79) == []  # latched: not again
    assert node.report() == [] and node.report() == []
    assert node.report(xids=x79) == []  # absent only 2 reports: still latched
    for _ in range(3):
        node.report()
    assert rules_of(node.report(xids=x79)) == ["xid-79@1"]  # clear for 3: fires again


@pytest.mark.parametrize(
    ("gpu", "rule", "severity"),
    [
        ({"lost": True}, "gpu-lost@1", Severity.FATAL),
        ({"errors": {"gpu": "GPU is lost"}}, "gpu-lost@1", Severity.FATAL),
        ({"ecc_unc_vol": 2}, "ecc-uncorrectable@1", Severity.FATAL),
        ({"remap_failed": True, "remap_pending": True}, "row-remap-failed@1", Severity.FATAL),
        ({"remap_pending": True, "remap_unc": 4}, "row-remap-pending@1", Severity.DEGRADED),
        ({"retired_pending": True}, "retired-pages-pending@1", Severity.DEGRADED),
        ({"retired_sbe": 40, "retired_dbe": 20}, "retired-pages@1", Severity.DEGRADED),
        ({"recovery": 1}, "recovery-action@1", Severity.FATAL),
        ({"recovery": 2}, "recovery-action@1", Severity.FATAL),
        ({"recovery": 4}, "recovery-action@1", Severity.DEGRADED),
    ],
)
def test_hard_evidence_fires_on_the_first_report(gpu: dict[str, object], rule: str, severity: Severity) -> None:
    findings = Node().report({5: gpu})
    assert [(f.rule, f.severity) for f in findings] == [(rule, severity)]
    assert findings[0].evidence["gpu"] == 5


def test_hw_slowdown_is_degraded_only_when_sustained() -> None:
    node = Node(HealthRules(GpuHealthSettings(slowdown_samples=4)))
    brake = {2: {"clocks": 0x88}}
    assert node.report(brake) == [] and node.report(brake) == [] and node.report(brake) == []
    node.report()  # one clear report resets the count
    assert [node.report(brake) for _ in range(3)] == [[], [], []]
    (f,) = node.report(brake)
    assert (f.rule, f.severity) == ("hw-slowdown@1", Severity.DEGRADED) and "power brake" in f.reason


def test_watch_conditions_need_persistence() -> None:
    node = Node(HealthRules(GpuHealthSettings(persist_samples=3, temp_watch_c=85)))
    hot = {1: {"temp_c": 91}}
    assert node.report(hot) == [] and node.report(hot) == []
    (f,) = node.report(hot)
    assert (f.rule, f.severity) == ("temperature@1", Severity.WATCH)
    pressure = HostSample(mem_used_pct=97.0)
    assert [node.report(hot, host=pressure) for _ in range(2)] == [[], []]
    assert rules_of(node.report(hot, host=pressure)) == ["host-memory@1"]


def test_bursts_compare_with_the_previous_report() -> None:
    node = Node(HealthRules(GpuHealthSettings(ecc_corrected_burst=100, nvlink_error_burst=50, persist_samples=1)))
    assert node.report({0: {"ecc_cor_vol": 5000}}) == []  # the first report has no baseline
    assert rules_of(node.report({0: {"ecc_cor_vol": 5150}})) == ["ecc-corrected-burst@1"]
    assert node.report({0: {"ecc_cor_vol": 5160, "nvlink_crc": 10}}) == []
    assert rules_of(node.report({0: {"ecc_cor_vol": 5160, "nvlink_crc": 80}})) == ["nvlink-errors@1"]


def test_missing_gpus_and_unreadable_nvml_need_expected_gpus() -> None:
    assert Node().report(gpu_count=7) == []  # no expectation configured
    node = Node(HealthRules(GpuHealthSettings(expected_gpus=8, persist_samples=2)))
    (f,) = node.report(gpu_count=7)
    assert (f.rule, f.severity) == ("gpu-missing@1", Severity.FATAL) and "7 GPUs visible, 8 expected" in f.reason
    down = NodeReport(v=1, node="n2", seq=1, at=1.0, errors=("NVML init failed: Driver Not Loaded",))
    assert node.rules.evaluate(down, 1.0) == []
    (g,) = node.rules.evaluate(replace(down, seq=2), 2.0)
    assert (g.rule, g.severity) == ("nvml-unavailable@1", Severity.DEGRADED) and "Driver Not Loaded" in g.reason


def test_settings_overrides_ignores_and_validation() -> None:
    settings = GpuHealthSettings(xid_overrides={13: Severity.DEGRADED}, xid_ignore=frozenset({43}))
    node = Node(HealthRules(settings))
    assert rules_of(node.report(xids=(XidEvent(gpu=0, xid=43, at=1.0),))) == []
    (f,) = node.report(xids=(XidEvent(gpu=0, xid=13, at=1.0),))
    assert f.severity is Severity.DEGRADED
    with pytest.raises(ValueError, match="persist_samples must be at least 1"):
        GpuHealthSettings(persist_samples=0)
    with pytest.raises(ValueError, match="host_mem_watch_pct"):
        GpuHealthSettings(host_mem_watch_pct=150)
    assert XID_CATALOGUE[79][0] is Severity.FATAL


def test_nodes_are_judged_independently() -> None:
    rules = HealthRules()
    a, b = Node(rules, "a"), Node(rules, "b")
    assert rules_of(a.report({0: {"ecc_unc_vol": 1}})) == ["ecc-uncorrectable@1"]
    assert rules_of(b.report({0: {"ecc_unc_vol": 1}})) == ["ecc-uncorrectable@1"]
    assert rules.active("a") == ["ecc-uncorrectable@1/gpu0"]
    rules.forget("a")
    assert rules.active("a") == []


# ---------------------------------------------------------------------------- the real dumps
def dump_report(name: str, seq: int = 1) -> NodeReport:
    path = DATA / name
    if not path.exists():
        pytest.fail(f"shared data file {path} is missing")
    d = parse_smi_query(path.read_text())
    return NodeReport(v=1, node="real", seq=seq, at=float(seq), gpu_count=d.attached, gpus=d.gpus)


def test_real_a10_with_pending_remap_is_degraded() -> None:
    (f,) = HealthRules().evaluate(dump_report("gpud_nvidia-smi-query.535.129.03.out.0.valid.a10"), 1.0)
    assert (f.rule, f.severity) == ("row-remap-pending@1", Severity.DEGRADED)
    assert "4 uncorrectable rows" in f.reason and "00000000:07:00.0" in f.reason


def test_real_h100_power_brake_needs_persistence() -> None:
    rules = HealthRules(GpuHealthSettings(slowdown_samples=3))
    name = "gpud_nvidia-smi-query.535.161.08.out.0.valid"
    assert rules.evaluate(dump_report(name, 1), 1.0) == [] and rules.evaluate(dump_report(name, 2), 2.0) == []
    third = rules.evaluate(dump_report(name, 3), 3.0)
    assert len(third) == 8 and {f.rule for f in third} == {"hw-slowdown@1"}


def test_real_truncated_dump_is_missing_gpus() -> None:
    rules = HealthRules(GpuHealthSettings(expected_gpus=8))
    report = dump_report("gpud_nvidia-smi-query.535.183.01.out.0.invalid")
    report = replace(report, gpu_count=len(report.gpus))
    assert rules_of(rules.evaluate(report, 1.0)) == ["gpu-missing@1"]


def test_real_xid_lines_judged() -> None:
    path = DATA / "xid_lines_from_public_issues.txt"
    events = tuple(parse_xid_lines(path.read_text().splitlines()))
    findings = HealthRules().evaluate(NodeReport(v=1, node="real", seq=1, at=1.0, xids=events), 1.0)
    fatal = {f.rule for f in findings if f.severity is Severity.FATAL}
    assert {"xid-48@1", "xid-64@1", "xid-79@1", "xid-62@1", "xid-149@1"} <= fatal
    assert {f.rule for f in findings if f.severity is Severity.DEGRADED} == {"xid-63@1"}
    assert sum(1 for f in findings if f.rule == "xid-79@1") == 3  # three GPUs fell off the bus
    gsp = parse_xid_lines((DATA / "gpud_dmesg-with-xid-119.log").read_text().splitlines())
    (g,) = HealthRules().evaluate(NodeReport(v=1, node="x", seq=1, at=1.0, xids=tuple(gsp)), 1.0)
    assert (g.rule, g.severity) == ("xid-119@1", Severity.FATAL)


# ---------------------------------------------------------------- the healthy sample's shortcut
_maybe_count = st.one_of(st.none(), st.integers(0, 40))
_samples = st.builds(
    GpuSample,
    i=st.just(0),
    lost=st.booleans(),
    ecc_cor_vol=_maybe_count,
    ecc_unc_vol=_maybe_count,
    retired_sbe=_maybe_count,
    retired_dbe=_maybe_count,
    retired_pending=st.one_of(st.none(), st.booleans()),
    remap_unc=_maybe_count,
    remap_pending=st.one_of(st.none(), st.booleans()),
    remap_failed=st.one_of(st.none(), st.booleans()),
    clocks=st.one_of(st.none(), st.integers(0, 0xFF)),
    temp_c=st.one_of(st.none(), st.integers(0, 120)),
    nvlink_replay=_maybe_count,
    nvlink_recovery=_maybe_count,
    nvlink_crc=_maybe_count,
    recovery=st.one_of(st.none(), st.integers(0, 8)),
    errors=st.dictionaries(
        st.sampled_from(["temp_c", "power_w"]), st.sampled_from(["Timeout", "Not Supported"]), max_size=1
    ),
)


@settings(max_examples=600, deadline=None)
@given(
    _samples,
    st.one_of(st.none(), _samples),
    st.sampled_from(
        [
            GpuHealthSettings(),
            GpuHealthSettings(retired_pages_max=1, ecc_corrected_burst=1, nvlink_error_burst=1, temp_watch_c=60),
        ]
    ),
)
def test_a_sample_called_quiet_shows_no_condition(g: GpuSample, prev: GpuSample | None, s: GpuHealthSettings) -> None:
    """The ingest skips the rules for a sample ``quiet`` calls healthy: it must never hide one."""
    if quiet(g, prev, s):
        assert list(gpu_conditions(g, prev, s)) == []


def test_the_healthy_sample_is_called_quiet() -> None:
    """The shortcut takes the common case (else it saves nothing)."""
    assert quiet(healthy(0), healthy(0), GpuHealthSettings())
