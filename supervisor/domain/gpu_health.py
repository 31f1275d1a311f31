"""GPU health rules: from what a node reports (``NodeReport``) to findings (``NodeFinding``).

An open, versioned table. Each rule has an id (``xid-79``), a severity, a reason and a
persistence: how many consecutive reports must show the condition before it fires. A rule id
carries the table version (``xid-79@1``), so a logbook entry says which table judged it.

* **fatal** — drain now, restart the run without the node: a GPU lost or fallen off the bus,
  uncorrectable ECC, a failed row remap, GSP failures, a driver recovery action that needs a
  reset or a reboot, fewer GPUs than the node should have.
* **degraded** — keep the node out at the next restart or checkpoint boundary: a row remap or
  page retirement waiting for a reset, too many retired pages, contained ECC errors, HW slowdown
  (thermal or power brake) sustained for ``slowdown_samples`` reports.
* **watch** — record it: application-class XIDs (13, 31, 43, 45 ...), corrected-ECC or NVLink
  error bursts, heat, host memory pressure, a driver the agent cannot read.

Hysteresis: a fired condition stays latched (it does not fire again) until it has been absent
for ``clear_samples`` consecutive reports; a watch-level condition fires only once it has been
present for ``persist_samples`` consecutive reports. Events (XIDs) are present in the report
that carries them. Hard evidence (fatal, and degraded counters) fires on the first report.

Pure: ``HealthRules`` keeps per-node state in memory and is fed reports and the time they were
received; nothing here reads a clock or logs.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from supervisor.domain.health import NodeFinding, Severity
from supervisor.domain.node_report import (
    CLOCKS_HW_POWER_BRAKE,
    CLOCKS_HW_SLOWDOWN,
    CLOCKS_HW_THERMAL,
    GpuSample,
    NodeReport,
)

RULES_VERSION = 1
FATAL, DEGRADED, WATCH = Severity.FATAL, Severity.DEGRADED, Severity.WATCH

# XIDs after NVIDIA's XID catalogue (its "resolution bucket": RESTART_APP → watch; RESET_GPU,
# RESTART_BM, hardware/RMA → fatal; reset at the next opportunity → degraded). Unlisted XIDs
# are watch.
XID_CATALOGUE: Mapping[int, tuple[Severity, str]] = MappingProxyType(
    {
        8: (WATCH, "GPU stopped processing (application)"),
        13: (WATCH, "graphics engine exception (usually the application)"),
        31: (WATCH, "GPU memory page fault (usually the application)"),
        32: (WATCH, "invalid or corrupted push buffer stream"),
        43: (WATCH, "GPU stopped processing (application)"),
        45: (WATCH, "preemptive cleanup after an earlier error"),
        46: (FATAL, "GPU stopped processing"),
        48: (FATAL, "double-bit ECC error (DBE)"),
        61: (DEGRADED, "internal micro-controller breakpoint/warning"),
        62: (FATAL, "internal micro-controller halt"),
        63: (DEGRADED, "row remap / page retirement recorded: reset the GPU to activate"),
        64: (FATAL, "row remap / page retirement recording failure"),
        68: (WATCH, "video processor exception"),
        69: (WATCH, "graphics engine class error"),
        74: (FATAL, "NVLink error"),
        79: (FATAL, "GPU has fallen off the bus"),
        92: (DEGRADED, "high single-bit ECC error rate"),
        94: (DEGRADED, "contained ECC error: the GPU needs a reset at the next opportunity"),
        95: (FATAL, "uncontained ECC error"),
        109: (WATCH, "context switch timeout"),
        119: (FATAL, "GSP RPC timeout"),
        120: (FATAL, "GSP error"),
        121: (DEGRADED, "C2C link corrected error"),
        140: (FATAL, "unrecovered ECC error"),
        143: (FATAL, "GPU initialisation failure"),
        145: (WATCH, "NVLink non-fatal error"),
        149: (FATAL, "NVLink fatal error"),
    }
)

# NVML_FI_DEV_GET_GPU_RECOVERY_ACTION values (nvml.h).
RECOVERY_ACTIONS: Mapping[int, tuple[Severity, str]] = MappingProxyType(
    {
        1: (FATAL, "GPU reset required"),
        2: (FATAL, "node reboot required"),
        3: (DEGRADED, "drain peer-to-peer traffic"),
        4: (DEGRADED, "drain and reset recommended"),
        5: (DEGRADED, "recover the IMEX domain"),
        6: (FATAL, "bus reset required"),
        7: (FATAL, "system reboot required"),
    }
)


@dataclass(frozen=True)
class GpuHealthSettings:
    """Every threshold of the table. TOML section ``[gpu_health]`` (keys = field names)."""

    persist_samples: int = 3  # a watch-level condition must be seen in this many reports in a row
    clear_samples: int = 5  # a fired condition must be absent this many reports to re-arm
    slowdown_samples: int = 6  # HW slowdown / thermal / power brake in a row → degraded
    retired_pages_max: int = 60  # retired pages (SBE + DBE) at or above → degraded
    ecc_corrected_burst: int = 1000  # corrected ECC errors between two reports → watch
    nvlink_error_burst: int = 100  # NVLink CRC/replay/recovery errors between two reports → watch
    temp_watch_c: int = 90
    host_mem_watch_pct: float = 95.0
    expected_gpus: int = 0  # GPUs a node must show; 0 = do not check
    xid_overrides: Mapping[int, Severity] = field(default_factory=dict)  # xid → severity
    xid_ignore: frozenset[int] = frozenset()

    def __post_init__(self) -> None:
        problems = [
            f"{name} must be at least 1 (got {getattr(self, name)!r})"
            for name in (
                "persist_samples",
                "clear_samples",
                "slowdown_samples",
                "retired_pages_max",
                "ecc_corrected_burst",
                "nvlink_error_burst",
            )
            if not (isinstance(getattr(self, name), int) and getattr(self, name) >= 1)
        ]
        if not 0 < self.host_mem_watch_pct <= 100:
            problems.append(f"host_mem_watch_pct must be within (0, 100] (got {self.host_mem_watch_pct})")
        if self.expected_gpus < 0:
            problems.append(f"expected_gpus must be 0 (no check) or more (got {self.expected_gpus})")
        bad = [x for x in list(self.xid_overrides) + list(self.xid_ignore) if not 0 < x < 100000]
        if bad:
            problems.append(f"XID numbers must be within 1..99999 (got {bad})")
        if problems:
            raise ValueError("; ".join(problems))

    def xid_class(self, xid: int) -> tuple[Severity, str] | None:
        if xid in self.xid_ignore:
            return None
        severity, text = XID_CATALOGUE.get(xid, (WATCH, "not in the catalogue"))
        return self.xid_overrides.get(xid, severity), text


@dataclass(frozen=True)
class Condition:
    """One rule seen in one report (for one GPU, or the node when ``gpu`` is None)."""

    rule: str  # without the version, e.g. "xid-79"
    severity: Severity
    reason: str
    persist: int
    gpu: int | None = None
    evidence: Mapping[str, object] = field(default_factory=dict)


def _gpu_label(g: GpuSample) -> str:
    return f"gpu {g.i}" + (f", {g.bus}" if g.bus else "")


def gpu_conditions(g: GpuSample, prev: GpuSample | None, s: GpuHealthSettings) -> Iterator[Condition]:
    """The conditions one GPU sample shows (``prev``: the same GPU in the node's previous report)."""
    where = _gpu_label(g)
    ev: dict[str, object] = {"gpu": g.i, "uuid": g.uuid} if g.uuid else {"gpu": g.i}
    if g.lost or "GPU is lost" in g.errors.values():
        yield Condition("gpu-lost", FATAL, f"GPU lost: NVML cannot reach it ({where})", 1, g.i, ev)
        return
    if g.ecc_unc_vol:
        yield Condition(
            "ecc-uncorrectable",
            FATAL,
            f"{g.ecc_unc_vol} uncorrectable ECC errors since the driver loaded ({where})",
            1,
            g.i,
            {**ev, "ecc_unc_vol": g.ecc_unc_vol},
        )
    if g.remap_failed:
        yield Condition(
            "row-remap-failed",
            FATAL,
            f"row remapping failed: memory cannot be repaired ({where})",
            1,
            g.i,
            {**ev, "remap_unc": g.remap_unc},
        )
    elif g.remap_pending:
        yield Condition(
            "row-remap-pending",
            DEGRADED,
            f"row remap pending: the GPU needs a reset ({where}, {g.remap_unc or 0} uncorrectable rows)",
            1,
            g.i,
            {**ev, "remap_unc": g.remap_unc},
        )
    if g.retired_pending:
        yield Condition(
            "retired-pages-pending", DEGRADED, f"page retirement pending: the GPU needs a reset ({where})", 1, g.i, ev
        )
    retired = (g.retired_sbe or 0) + (g.retired_dbe or 0)
    if retired >= s.retired_pages_max:
        yield Condition(
            "retired-pages",
            DEGRADED,
            f"{retired} retired pages (limit {s.retired_pages_max}) ({where})",
            1,
            g.i,
            {**ev, "retired": retired},
        )
    if g.recovery is not None and g.recovery in RECOVERY_ACTIONS:
        severity, text = RECOVERY_ACTIONS[g.recovery]
        yield Condition(
            "recovery-action",
            severity,
            f"driver recovery action {g.recovery}: {text} ({where})",
            1,
            g.i,
            {**ev, "recovery": g.recovery},
        )
    yield from _rate_conditions(g, prev, s, where, ev)
    if g.clocks is not None and g.clocks & (CLOCKS_HW_SLOWDOWN | CLOCKS_HW_THERMAL | CLOCKS_HW_POWER_BRAKE):
        kinds = [
            n for bit, n in ((CLOCKS_HW_THERMAL, "thermal"), (CLOCKS_HW_POWER_BRAKE, "power brake")) if g.clocks & bit
        ] or ["hardware"]
        yield Condition(
            "hw-slowdown",
            DEGRADED,
            f"HW slowdown ({', '.join(kinds)}) sustained for {s.slowdown_samples} reports ({where})",
            s.slowdown_samples,
            g.i,
            {**ev, "clocks": g.clocks},
        )
    if g.temp_c is not None and g.temp_c >= s.temp_watch_c:
        yield Condition(
            "temperature",
            WATCH,
            f"GPU at {g.temp_c} C (watch at {s.temp_watch_c} C) ({where})",
            s.persist_samples,
            g.i,
            {**ev, "temp_c": g.temp_c},
        )
    timeouts = sorted(k for k, v in g.errors.items() if v != "Not Supported")
    if timeouts:
        yield Condition(
            "nvml-error",
            WATCH,
            f"NVML errors reading {', '.join(timeouts)} ({where})",
            s.persist_samples,
            g.i,
            {**ev, "errors": dict(g.errors)},
        )


def _rate_conditions(
    g: GpuSample, prev: GpuSample | None, s: GpuHealthSettings, where: str, ev: dict[str, object]
) -> Iterator[Condition]:
    if prev is None:
        return
    if g.ecc_cor_vol is not None and prev.ecc_cor_vol is not None:
        burst = g.ecc_cor_vol - prev.ecc_cor_vol
        if burst >= s.ecc_corrected_burst:
            yield Condition(
                "ecc-corrected-burst",
                WATCH,
                f"{burst} corrected ECC errors since the last report ({where})",
                1,
                g.i,
                {**ev, "burst": burst},
            )
    now = sum(v for v in (g.nvlink_crc, g.nvlink_replay, g.nvlink_recovery) if v is not None)
    before = sum(v for v in (prev.nvlink_crc, prev.nvlink_replay, prev.nvlink_recovery) if v is not None)
    if g.nvlink_crc is not None and now - before >= s.nvlink_error_burst:
        yield Condition(
            "nvlink-errors",
            WATCH,
            f"{now - before} NVLink errors since the last report ({where})",
            s.persist_samples,
            g.i,
            {**ev, "burst": now - before},
        )


def report_conditions(report: NodeReport, prev: NodeReport | None, s: GpuHealthSettings) -> list[Condition]:
    """Every condition one report shows."""
    found: list[Condition] = []
    prev_gpus = {g.i: g for g in prev.gpus} if prev is not None else {}
    for g in report.gpus:
        found.extend(gpu_conditions(g, prev_gpus.get(g.i), s))
    by_index = {g.i: g for g in report.gpus}
    for x in report.xids:
        cls = s.xid_class(x.xid)
        if cls is None:
            continue
        severity, text = cls
        placed = by_index.get(x.gpu)
        where = _gpu_label(placed) if placed is not None else (f"gpu {x.gpu}" if x.gpu >= 0 else f"PCI {x.bus or '?'}")
        found.append(
            Condition(
                f"xid-{x.xid}",
                severity,
                f"XID {x.xid}: {text} ({where})",
                1,
                x.gpu if x.gpu >= 0 else None,
                {
                    "xid": x.xid,
                    "gpu": x.gpu,
                    **({"bus": x.bus} if x.gpu < 0 and x.bus else {}),
                    **({"text": x.text} if x.text else {}),
                },
            )
        )
    found.extend(_node_conditions(report, s))
    return found


def _node_conditions(report: NodeReport, s: GpuHealthSettings) -> Iterator[Condition]:
    counted = report.gpu_count if report.gpu_count is not None else (len(report.gpus) if report.gpus else None)
    if s.expected_gpus and counted is not None and counted < s.expected_gpus:
        yield Condition(
            "gpu-missing",
            FATAL,
            f"{counted} GPUs visible, {s.expected_gpus} expected",
            1,
            None,
            {"gpu_count": counted, "expected": s.expected_gpus},
        )
    if report.errors and not report.gpus and s.expected_gpus:
        yield Condition(
            "nvml-unavailable",
            DEGRADED,
            f"GPUs cannot be read: {report.errors[0]}",
            s.persist_samples,
            None,
            {"errors": list(report.errors)},
        )
    host = report.host
    if host is not None and host.mem_used_pct is not None and host.mem_used_pct >= s.host_mem_watch_pct:
        yield Condition(
            "host-memory",
            WATCH,
            f"host memory {host.mem_used_pct:.0f}% used (watch at {s.host_mem_watch_pct:g}%)",
            s.persist_samples,
            None,
            {"mem_used_pct": host.mem_used_pct},
        )


@dataclass
class _Track:
    present: int = 0
    absent: int = 0
    fired: bool = False


@dataclass
class _NodeState:
    last: NodeReport | None = None
    tracks: dict[tuple[str, int | None, str], _Track] = field(default_factory=dict)


class HealthRules:
    """The table applied with hysteresis, per node. Feed it each accepted report in order."""

    def __init__(self, settings: GpuHealthSettings | None = None) -> None:
        self.settings = settings or GpuHealthSettings()
        self._nodes: dict[str, _NodeState] = {}

    def evaluate(self, report: NodeReport, now: float, run: str | None = None) -> list[NodeFinding]:
        state = self._nodes.setdefault(report.node, _NodeState())
        conditions = report_conditions(report, state.last, self.settings)
        state.last = report
        return [self._finding(report, c, now, run) for c in self._step(state, conditions)]

    def forget(self, node: str) -> None:
        self._nodes.pop(node, None)

    def active(self, node: str) -> list[str]:
        """Rule ids (with the GPU) currently latched for ``node``."""
        state = self._nodes.get(node)
        return sorted(
            f"{r}@{RULES_VERSION}" + (f"/gpu{g}" if g is not None else f"/{bus}" if bus else "")
            for (r, g, bus), t in (state.tracks.items() if state else ())
            if t.fired
        )

    def _step(self, state: _NodeState, conditions: Iterable[Condition]) -> list[Condition]:
        fire: list[Condition] = []
        seen: set[tuple[str, int | None, str]] = set()
        for c in conditions:
            key = (c.rule, c.gpu, str(c.evidence.get("bus", "")) if c.gpu is None else "")
            if key in seen:
                continue  # several XIDs of one kind in one report count once
            seen.add(key)
            track = state.tracks.setdefault(key, _Track())
            track.present += 1
            track.absent = 0
            if not track.fired and track.present >= c.persist:
                track.fired = True
                fire.append(c)
        for key in [k for k in state.tracks if k not in seen]:
            track = state.tracks[key]
            track.present = 0
            track.absent += 1
            if not track.fired or track.absent >= self.settings.clear_samples:
                del state.tracks[key]
        return fire

    @staticmethod
    def _finding(report: NodeReport, c: Condition, now: float, run: str | None) -> NodeFinding:
        evidence = {**c.evidence, "report_seq": report.seq, "report_at": report.at}
        return NodeFinding(
            node=report.node,
            severity=c.severity,
            reason=c.reason,
            rule=f"{c.rule}@{RULES_VERSION}",
            at=now,
            source=report.source,
            run=run,
            evidence=evidence,
        )
