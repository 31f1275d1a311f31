"""What a node says about itself: the report an agent (or a hook) sends to the daemon.

Pure values. The wire form is JSON whose keys are these field names; a field the driver does not
support is absent (``None`` here), never a made-up zero. One report per sample; a sender batches
them (``ReportBatch``) while the daemon is unreachable. ``check_batch`` does the checks a type
decoder cannot (versions, bounds, consistency) and returns the first problem as a sentence, so the
ingest can answer 4xx with it. Strings that name something (a PCI bus id, a UUID, the driver
version, a field an NVML error kept from being read) must be identifiers (``[A-Za-z0-9:._/-]``, at
most 128 characters); no string may carry a control character (``domain.text_safety``): what an
agent says ends up in Slurm's drain reasons, terminals, Markdown and webhooks.

Schema version 1:

* ``ReportBatch``: ``v``, ``node``, ``reports``, ``dropped`` (reports the sender had to drop
  from its bounded buffer since its last accepted batch).
* ``NodeReport``: ``v``, ``node``, ``seq`` (increasing per agent), ``at`` (the node's clock),
  ``interval_s`` (the agent's sample interval: the heartbeat the daemon can expect),
  ``source`` (agent, prolog, epilog, healthcheck), ``gpu_count`` (what NVML counted), ``gpus``,
  ``xids`` (XID events since the last report), ``host``, ``errors`` (what went wrong reading).
* ``GpuSample``: one GPU's counters and state; ``errors`` maps a field to the NVML error that
  kept it from being read (``"Timeout"``, ``"GPU is lost"``), Not Supported fields are just absent.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import partial
from operator import attrgetter, is_not

from supervisor.domain.text_safety import has_controls, is_identifier

SCHEMA_VERSION = 1
MAX_GPUS = 64
MAX_REPORTS_PER_BATCH = 256
MAX_XIDS_PER_REPORT = 256
MAX_TEXT = 256
MAX_ERRORS = 64
SOURCES = frozenset({"agent", "prolog", "epilog", "healthcheck"})

# nvmlClocksEventReason* bits (nvml.h), the ones the rules look at.
CLOCKS_HW_SLOWDOWN = 0x08
CLOCKS_SW_THERMAL = 0x20
CLOCKS_HW_THERMAL = 0x40
CLOCKS_HW_POWER_BRAKE = 0x80


@dataclass(frozen=True, slots=True)
class GpuSample:
    i: int  # NVML index
    uuid: str = ""
    bus: str = ""  # PCI bus id, e.g. "00000000:19:00.0"
    name: str = ""
    lost: bool = False  # NVML says GPU_IS_LOST (fallen off the bus)
    ecc_cor_vol: int | None = None  # volatile (since driver load) corrected ECC errors
    ecc_unc_vol: int | None = None
    ecc_cor_agg: int | None = None  # aggregate (lifetime) counts
    ecc_unc_agg: int | None = None
    retired_sbe: int | None = None  # pages retired for multiple single-bit errors (pre-Ampere)
    retired_dbe: int | None = None  # pages retired for a double-bit error
    retired_pending: bool | None = None
    remap_cor: int | None = None  # rows remapped for correctable / uncorrectable errors (Ampere+)
    remap_unc: int | None = None
    remap_pending: bool | None = None  # a remap waits for a GPU reset
    remap_failed: bool | None = None  # a remap failed: the memory cannot be repaired
    clocks: int | None = None  # clocks event (throttle) reasons bit mask
    temp_c: int | None = None
    power_w: float | None = None
    sm_mhz: int | None = None
    util: int | None = None  # percent
    mem_util: int | None = None
    nvlink_replay: int | None = None  # summed over the GPU's links
    nvlink_recovery: int | None = None
    nvlink_crc: int | None = None  # flit + data CRC errors
    recovery: int | None = None  # NVML_FI_DEV_GET_GPU_RECOVERY_ACTION (0 none .. 7 system reboot)
    errors: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class XidEvent:
    gpu: int  # NVML index (-1 when the event named a device the agent could not place)
    xid: int
    at: float
    uuid: str = ""
    bus: str = ""
    text: str = ""  # the kernel line's message, when it came from a log


@dataclass(frozen=True, slots=True)
class HostSample:
    mem_used_pct: float | None = None
    mem_avail_mb: int | None = None
    swap_used_pct: float | None = None
    cpu_pct: float | None = None
    load1: float | None = None


@dataclass(frozen=True, slots=True)
class NodeReport:
    v: int
    node: str
    seq: int
    at: float
    interval_s: float = 0.0
    source: str = "agent"
    gpu_count: int | None = None
    gpus: tuple[GpuSample, ...] = ()
    xids: tuple[XidEvent, ...] = ()
    host: HostSample | None = None
    errors: tuple[str, ...] = ()
    driver: str = ""


@dataclass(frozen=True, slots=True)
class ReportBatch:
    v: int
    node: str
    reports: tuple[NodeReport, ...] = ()
    dropped: int = 0


def _node_name_ok(name: str) -> bool:
    return 0 < len(name) <= 128 and all(c.isalnum() or c in "-_." for c in name) and name.isascii()


_COUNTERS = (
    "ecc_cor_vol",
    "ecc_unc_vol",
    "ecc_cor_agg",
    "ecc_unc_agg",
    "retired_sbe",
    "retired_dbe",
    "remap_cor",
    "remap_unc",
    "clocks",
    "sm_mhz",
    "nvlink_replay",
    "nvlink_recovery",
    "nvlink_crc",
)


_COUNTER_VALUES = attrgetter(*_COUNTERS)
_PRESENT = partial(is_not, None)
_BOUNDS = (("util", 100), ("mem_util", 100), ("temp_c", 200), ("recovery", 255))
_BOUNDED_VALUES = attrgetter(*(name for name, _ in _BOUNDS))
_LOWEST_TOP = min(top for _, top in _BOUNDS)


def _check_gpu(g: GpuSample, seen: set[int]) -> str | None:
    if not 0 <= g.i < MAX_GPUS:
        return f"gpu index {g.i} is outside 0..{MAX_GPUS - 1}"
    if g.i in seen:
        return f"gpu index {g.i} appears twice in one report"
    seen.add(g.i)
    return _gpu_text_problem(g) or _gpu_number_problem(g)


def _gpu_text_problem(g: GpuSample) -> str | None:
    for name, value in (("uuid", g.uuid), ("bus", g.bus)):
        if not is_identifier(value):
            return f"gpu {g.i}: {name} {value[:64]!r} is not an identifier ([A-Za-z0-9:._/-], at most 128)"
    if len(g.name) > MAX_TEXT or has_controls(g.name):
        return f"gpu {g.i}: name must be at most {MAX_TEXT} characters, with no control characters"
    if g.errors and (len(g.errors) > MAX_ERRORS or not all(_error_ok(k, v) for k, v in g.errors.items())):
        return f"gpu {g.i}: errors must be at most {MAX_ERRORS} entries: field name -> short text, no controls"
    return None


def _gpu_number_problem(g: GpuSample) -> str | None:
    counters = _COUNTER_VALUES(g)
    if min(filter(_PRESENT, counters), default=0) < 0:  # the common case costs one C-level pass
        name, value = next((n, v) for n, v in zip(_COUNTERS, counters, strict=True) if v is not None and v < 0)
        return f"gpu {g.i}: {name} must not be negative (got {value})"
    bounded = [v for v in _BOUNDED_VALUES(g) if v is not None]
    if bounded and not 0 <= min(bounded) <= max(bounded) <= _LOWEST_TOP:  # else look closer
        for (name, top), value in zip(_BOUNDS, _BOUNDED_VALUES(g), strict=True):
            if value is not None and not 0 <= value <= top:
                return f"gpu {g.i}: {name} must be within 0..{top} (got {value})"
    if g.power_w is not None and not (math.isfinite(g.power_w) and 0 <= g.power_w < 1e5):
        return f"gpu {g.i}: power_w must be a finite number of watts (got {g.power_w})"
    return None


def _error_ok(field_name: str, text: str) -> bool:
    return is_identifier(field_name) and _text_ok(text)


def _text_ok(text: str, limit: int = MAX_TEXT) -> bool:
    return len(text) <= limit and not has_controls(text)


def _check_xid(x: XidEvent) -> str | None:
    where = f"xid event {x.xid} on gpu {x.gpu}"
    if not (-1 <= x.gpu < MAX_GPUS and 0 < x.xid < 100000 and math.isfinite(x.at)):
        return f"{where}: gpu within -1..{MAX_GPUS - 1}, xid within 1..99999, at a finite time"
    if not (is_identifier(x.uuid) and is_identifier(x.bus)):
        return f"{where}: uuid and bus must be identifiers ([A-Za-z0-9:._/-], at most 128)"
    if not _text_ok(x.text, 1024):
        return f"{where}: text must be at most 1024 characters, with no control characters"
    return None


def _check_report(r: NodeReport, node: str) -> str | None:
    if r.v != SCHEMA_VERSION:
        return f"report schema version {r.v} is not supported (this daemon reads {SCHEMA_VERSION})"
    if r.node != node:
        return f"report for node {r.node!r} inside a batch from node {node!r}"
    if r.source not in SOURCES:
        return f"source {r.source!r} is not one of {', '.join(sorted(SOURCES))}"
    if r.seq < 0 or not math.isfinite(r.at) or not (math.isfinite(r.interval_s) and 0 <= r.interval_s <= 86400):
        return "seq must be >= 0, at a finite time and interval_s within 0..86400"
    if len(r.gpus) > MAX_GPUS or (r.gpu_count is not None and not 0 <= r.gpu_count <= MAX_GPUS):
        return f"a report carries at most {MAX_GPUS} GPUs"
    if len(r.xids) > MAX_XIDS_PER_REPORT:
        return f"a report carries at most {MAX_XIDS_PER_REPORT} XID events"
    if len(r.errors) > MAX_ERRORS or not all(map(_text_ok, r.errors)):
        return f"errors: at most {MAX_ERRORS} entries of at most {MAX_TEXT} characters, no control characters"
    if not is_identifier(r.driver):
        return f"driver {r.driver[:64]!r} is not a version ([A-Za-z0-9:._/-], at most 128)"
    seen: set[int] = set()
    for g in r.gpus:
        problem = _check_gpu(g, seen)
        if problem:
            return problem
    for x in r.xids:
        problem = _check_xid(x)
        if problem:
            return problem
    return None


def check_batch(batch: ReportBatch) -> str | None:
    """The first problem of a decoded batch as a sentence, or None when it is acceptable."""
    if batch.v != SCHEMA_VERSION:
        return f"batch schema version {batch.v} is not supported (this daemon reads {SCHEMA_VERSION})"
    if not _node_name_ok(batch.node):
        return "node must be 1..128 characters of letters, digits, '-', '_' or '.'"
    if not batch.reports:
        return "a batch must carry at least one report"
    if len(batch.reports) > MAX_REPORTS_PER_BATCH:
        return f"a batch carries at most {MAX_REPORTS_PER_BATCH} reports (got {len(batch.reports)})"
    if batch.dropped < 0:
        return "dropped must not be negative"
    for r in batch.reports:
        problem = _check_report(r, batch.node)
        if problem:
            return f"report seq {r.seq}: {problem}"
    return None


def to_wire(value: object) -> object:
    """The compact JSON-ready form: dataclasses as objects without their None/empty fields."""
    if isinstance(value, (NodeReport, ReportBatch, GpuSample, XidEvent, HostSample)):
        out: dict[str, object] = {}
        for name in value.__slots__:
            v = getattr(value, name)
            if v is None or (isinstance(v, (tuple, dict)) and not v and name != "reports"):
                continue
            if name == "lost" and v is False:
                continue
            out[name] = to_wire(v)
        return out
    if isinstance(value, tuple):
        return [to_wire(v) for v in value]
    if isinstance(value, Mapping):
        return dict(value)
    return value
