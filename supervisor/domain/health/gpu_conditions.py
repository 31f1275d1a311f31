"""What one node report shows: the conditions of the GPU health table (domain.health.gpu_table) it meets.

Per GPU (lost, memory, driver recovery action, error bursts since the previous report, slowdown,
heat, NVML errors), per XID, and for the node as a whole (GPUs missing or unreadable, host memory).
Each condition carries its evidence; hysteresis is applied later, by domain.health.gpu_health.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from operator import attrgetter

from supervisor.domain.health.findings import Severity
from supervisor.domain.health.gpu_table import DEGRADED, FATAL, RECOVERY_ACTIONS, WATCH, Condition, GpuHealthSettings
from supervisor.domain.health.node_report import (
    CLOCKS_HW_POWER_BRAKE,
    CLOCKS_HW_SLOWDOWN,
    CLOCKS_HW_THERMAL,
    GpuSample,
    NodeReport,
    XidEvent,
)

# What makes a sample worth a closer look when it is set at all (``quiet``).
_ALARMS = attrgetter("lost", "errors", "ecc_unc_vol", "remap_failed", "remap_pending", "retired_pending")
_HW_SLOWDOWN = CLOCKS_HW_SLOWDOWN | CLOCKS_HW_THERMAL | CLOCKS_HW_POWER_BRAKE
_SLOWDOWN_KINDS = ((CLOCKS_HW_THERMAL, "thermal"), (CLOCKS_HW_POWER_BRAKE, "power brake"))


def report_conditions(report: NodeReport, prev: NodeReport | None, s: GpuHealthSettings) -> list[Condition]:
    """Every condition one report shows."""
    found: list[Condition] = []
    prev_gpus = {g.i: g for g in prev.gpus} if prev is not None else {}
    for g in report.gpus:
        before = prev_gpus.get(g.i)
        if not quiet(g, before, s):
            found.extend(gpu_conditions(g, before, s))
    if report.xids:
        by_index = {g.i: g for g in report.gpus}
        found += [c for x in report.xids if (c := _xid_condition(x, by_index.get(x.gpu), s)) is not None]
    found.extend(_node_conditions(report, s))
    return found


def gpu_conditions(g: GpuSample, prev: GpuSample | None, s: GpuHealthSettings) -> Iterator[Condition]:
    """The conditions one GPU sample shows (``prev``: the same GPU in the node's previous report)."""
    gpu = _Gpu(g)
    if g.lost or "GPU is lost" in g.errors.values():
        yield gpu.condition("gpu-lost", FATAL, f"GPU lost: NVML cannot reach it ({gpu.where})")
        return
    yield from _memory_conditions(gpu, s)
    if g.recovery is not None and g.recovery in RECOVERY_ACTIONS:
        severity, text = RECOVERY_ACTIONS[g.recovery]
        reason = f"driver recovery action {g.recovery}: {text} ({gpu.where})"
        yield gpu.condition("recovery-action", severity, reason, recovery=g.recovery)
    if prev is not None:
        yield from _rate_conditions(gpu, prev, s)
    yield from _sensor_conditions(gpu, s)


def quiet(g: GpuSample, prev: GpuSample | None, s: GpuHealthSettings) -> bool:
    """True when ``gpu_conditions`` would find nothing: the healthy sample, nearly every one, told in
    a few C-level checks instead of a walk through every rule (it may say False of a sample that
    shows nothing; never True of one that shows something — tests/unit/test_gpu_rules.py holds it)."""
    if any(_ALARMS(g)) or g.recovery in RECOVERY_ACTIONS or (g.clocks or 0) & _HW_SLOWDOWN:
        return False
    if (g.retired_sbe or 0) + (g.retired_dbe or 0) >= s.retired_pages_max:
        return False
    if g.temp_c is not None and g.temp_c >= s.temp_watch_c:
        return False
    return prev is None or not _bursts(g, prev, s)


def _bursts(g: GpuSample, prev: GpuSample, s: GpuHealthSettings) -> bool:
    """Whether the error counters rose by a burst's worth since ``prev`` (what ``_rate_conditions``
    looks at)."""
    cor, cor_before = g.ecc_cor_vol, prev.ecc_cor_vol
    if cor is not None and cor_before is not None and cor - cor_before >= s.ecc_corrected_burst:
        return True
    if g.nvlink_crc is None:
        return False
    now = g.nvlink_crc + (g.nvlink_replay or 0) + (g.nvlink_recovery or 0)  # _link_errors, inline: per GPU
    return now - _link_errors(prev) >= s.nvlink_error_burst


@dataclass(frozen=True)
class _Gpu:
    """One GPU sample as its conditions name it: where it is, and the evidence they all carry."""

    g: GpuSample

    @property
    def where(self) -> str:
        return _gpu_label(self.g)

    def condition(self, rule: str, severity: Severity, reason: str, persist: int = 1, **evidence: object) -> Condition:
        ev: dict[str, object] = {"gpu": self.g.i, "uuid": self.g.uuid} if self.g.uuid else {"gpu": self.g.i}
        return Condition(rule, severity, reason, persist, self.g.i, {**ev, **evidence})


def _gpu_label(g: GpuSample) -> str:
    return f"gpu {g.i}" + (f", {g.bus}" if g.bus else "")


def _memory_conditions(gpu: _Gpu, s: GpuHealthSettings) -> Iterator[Condition]:
    g = gpu.g
    if g.ecc_unc_vol:
        reason = f"{g.ecc_unc_vol} uncorrectable ECC errors since the driver loaded ({gpu.where})"
        yield gpu.condition("ecc-uncorrectable", FATAL, reason, ecc_unc_vol=g.ecc_unc_vol)
    if g.remap_failed:
        reason = f"row remapping failed: memory cannot be repaired ({gpu.where})"
        yield gpu.condition("row-remap-failed", FATAL, reason, remap_unc=g.remap_unc)
    elif g.remap_pending:
        reason = f"row remap pending: the GPU needs a reset ({gpu.where}, {g.remap_unc or 0} uncorrectable rows)"
        yield gpu.condition("row-remap-pending", DEGRADED, reason, remap_unc=g.remap_unc)
    if g.retired_pending:
        reason = f"page retirement pending: the GPU needs a reset ({gpu.where})"
        yield gpu.condition("retired-pages-pending", DEGRADED, reason)
    retired = (g.retired_sbe or 0) + (g.retired_dbe or 0)
    if retired >= s.retired_pages_max:
        reason = f"{retired} retired pages (limit {s.retired_pages_max}) ({gpu.where})"
        yield gpu.condition("retired-pages", DEGRADED, reason, retired=retired)


def _rate_conditions(gpu: _Gpu, prev: GpuSample, s: GpuHealthSettings) -> Iterator[Condition]:
    g = gpu.g
    if g.ecc_cor_vol is not None and prev.ecc_cor_vol is not None:
        burst = g.ecc_cor_vol - prev.ecc_cor_vol
        if burst >= s.ecc_corrected_burst:
            reason = f"{burst} corrected ECC errors since the last report ({gpu.where})"
            yield gpu.condition("ecc-corrected-burst", WATCH, reason, burst=burst)
    now, before = _link_errors(g), _link_errors(prev)
    if g.nvlink_crc is not None and now - before >= s.nvlink_error_burst:
        reason = f"{now - before} NVLink errors since the last report ({gpu.where})"
        yield gpu.condition("nvlink-errors", WATCH, reason, s.persist_samples, burst=now - before)


def _link_errors(g: GpuSample) -> int:
    """The GPU's NVLink error counters summed (an unsupported one counts nothing)."""
    return (g.nvlink_crc or 0) + (g.nvlink_replay or 0) + (g.nvlink_recovery or 0)


def _sensor_conditions(gpu: _Gpu, s: GpuHealthSettings) -> Iterator[Condition]:
    g = gpu.g
    if g.clocks is not None and g.clocks & _HW_SLOWDOWN:
        kinds = [n for bit, n in _SLOWDOWN_KINDS if g.clocks & bit] or ["hardware"]
        reason = f"HW slowdown ({', '.join(kinds)}) sustained for {s.slowdown_samples} reports ({gpu.where})"
        yield gpu.condition("hw-slowdown", DEGRADED, reason, s.slowdown_samples, clocks=g.clocks)
    if g.temp_c is not None and g.temp_c >= s.temp_watch_c:
        reason = f"GPU at {g.temp_c} C (watch at {s.temp_watch_c} C) ({gpu.where})"
        yield gpu.condition("temperature", WATCH, reason, s.persist_samples, temp_c=g.temp_c)
    timeouts = sorted(k for k, v in g.errors.items() if v != "Not Supported") if g.errors else []
    if timeouts:
        reason = f"NVML errors reading {', '.join(timeouts)} ({gpu.where})"
        yield gpu.condition("nvml-error", WATCH, reason, s.persist_samples, errors=dict(g.errors))


def _xid_condition(x: XidEvent, placed: GpuSample | None, s: GpuHealthSettings) -> Condition | None:
    """An XID as the table classes it (None: ignored); ``placed``: the GPU it names, if reported."""
    cls = s.xid_class(x.xid)
    if cls is None:
        return None
    severity, text = cls
    where = _gpu_label(placed) if placed is not None else (f"gpu {x.gpu}" if x.gpu >= 0 else f"PCI {x.bus or '?'}")
    evidence = {
        "xid": x.xid,
        "gpu": x.gpu,
        **({"bus": x.bus} if x.gpu < 0 and x.bus else {}),
        **({"text": x.text} if x.text else {}),
    }
    return Condition(
        f"xid-{x.xid}", severity, f"XID {x.xid}: {text} ({where})", 1, x.gpu if x.gpu >= 0 else None, evidence
    )


def _node_conditions(report: NodeReport, s: GpuHealthSettings) -> Iterator[Condition]:
    counted = report.gpu_count if report.gpu_count is not None else (len(report.gpus) if report.gpus else None)
    if s.expected_gpus and counted is not None and counted < s.expected_gpus:
        reason = f"{counted} GPUs visible, {s.expected_gpus} expected"
        yield Condition("gpu-missing", FATAL, reason, 1, None, {"gpu_count": counted, "expected": s.expected_gpus})
    if report.errors and not report.gpus and s.expected_gpus:
        reason = f"GPUs cannot be read: {report.errors[0]}"
        yield Condition("nvml-unavailable", DEGRADED, reason, s.persist_samples, None, {"errors": list(report.errors)})
    host = report.host
    if host is not None and host.mem_used_pct is not None and host.mem_used_pct >= s.host_mem_watch_pct:
        reason = f"host memory {host.mem_used_pct:.0f}% used (watch at {s.host_mem_watch_pct:g}%)"
        yield Condition("host-memory", WATCH, reason, s.persist_samples, None, {"mem_used_pct": host.mem_used_pct})
