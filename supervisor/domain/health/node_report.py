"""What a node says about itself: the report an agent (or a hook) sends to the daemon.

Pure values. The wire form is JSON whose keys are these field names; a field the driver does not
support is absent (``None`` here), never a made-up zero. One report per sample; a sender batches
them (``ReportBatch``) while the daemon is unreachable. The records are frozen msgspec Structs
rather than dataclasses, and untracked by the garbage collector (they hold no references that could
form a cycle): the ingest decodes some ten thousand a second, and that halves what decoding costs.

The bounds are part of the types (msgspec ``Meta`` constraints), so the ingest's decoder refuses a
value out of range with the path of the field, in C, before any Python sees the batch: counters
are not negative, percentages within 0..100, lists and texts bounded; strings that name something
(a PCI bus id, a UUID, the driver version, a field an NVML error kept from being read) are
identifiers (``[A-Za-z0-9:._/-]``, at most 128 characters), and no string carries a control
character (``domain.text_safety``): what an agent says ends up in Slurm's drain reasons,
terminals, Markdown and webhooks. ``check_batch`` does what a type cannot say (versions, the
batch's node named in each report, sources, a GPU index twice, finite times) and returns the first
problem as a sentence, so the ingest can answer 422 with it.

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
from typing import Annotated

from msgspec import Meta, Struct, field

from supervisor.domain.text_safety import MAX_IDENTIFIER, has_controls, is_identifier

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

# The schema's bounds, checked by the decoder (see the module's docstring).
Count = Annotated[int, Meta(ge=0)]
Percent = Annotated[int, Meta(ge=0, le=100)]
# Lengths here; the characters of every string are checked by ``check_batch``, all of a report's at
# once (a pattern per string costs more than the rest of decoding).
Identifier = Annotated[str, Meta(max_length=MAX_IDENTIFIER)]
Text = Annotated[str, Meta(max_length=MAX_TEXT)]
LongText = Annotated[str, Meta(max_length=1024)]
NodeName = Annotated[str, Meta(min_length=1, max_length=128, pattern=r"^[A-Za-z0-9._-]+\Z")]


class GpuSample(Struct, frozen=True, gc=False):
    i: Annotated[int, Meta(ge=0, lt=MAX_GPUS)]  # NVML index
    uuid: Identifier = ""
    bus: Identifier = ""  # PCI bus id, e.g. "00000000:19:00.0"
    name: Text = ""
    lost: bool = False  # NVML says GPU_IS_LOST (fallen off the bus)
    ecc_cor_vol: Count | None = None  # volatile (since driver load) corrected ECC errors
    ecc_unc_vol: Count | None = None
    ecc_cor_agg: Count | None = None  # aggregate (lifetime) counts
    ecc_unc_agg: Count | None = None
    retired_sbe: Count | None = None  # pages retired for multiple single-bit errors (pre-Ampere)
    retired_dbe: Count | None = None  # pages retired for a double-bit error
    retired_pending: bool | None = None
    remap_cor: Count | None = None  # rows remapped for correctable / uncorrectable errors (Ampere+)
    remap_unc: Count | None = None
    remap_pending: bool | None = None  # a remap waits for a GPU reset
    remap_failed: bool | None = None  # a remap failed: the memory cannot be repaired
    clocks: Count | None = None  # clocks event (throttle) reasons bit mask
    temp_c: Annotated[int, Meta(ge=0, le=200)] | None = None
    power_w: Annotated[float, Meta(ge=0, lt=1e5)] | None = None
    sm_mhz: Count | None = None
    util: Percent | None = None  # percent
    mem_util: Percent | None = None
    nvlink_replay: Count | None = None  # summed over the GPU's links
    nvlink_recovery: Count | None = None
    nvlink_crc: Count | None = None  # flit + data CRC errors
    recovery: Annotated[int, Meta(ge=0, le=255)] | None = None  # NVML_FI_DEV_GET_GPU_RECOVERY_ACTION (0..7)
    errors: Annotated[Mapping[Identifier, Text], Meta(max_length=MAX_ERRORS)] = field(default_factory=dict)


class XidEvent(Struct, frozen=True, gc=False):
    gpu: Annotated[int, Meta(ge=-1, lt=MAX_GPUS)]  # NVML index (-1: a device the agent could not place)
    xid: Annotated[int, Meta(gt=0, lt=100_000)]
    at: float
    uuid: Identifier = ""
    bus: Identifier = ""
    text: LongText = ""  # the kernel line's message, when it came from a log


class HostSample(Struct, frozen=True, gc=False):
    mem_used_pct: float | None = None
    mem_avail_mb: int | None = None
    swap_used_pct: float | None = None
    cpu_pct: float | None = None
    load1: float | None = None


class NodeReport(Struct, frozen=True, gc=False):
    v: int
    node: str
    seq: Count
    at: float
    interval_s: Annotated[float, Meta(ge=0, le=86_400)] = 0.0
    source: str = "agent"
    gpu_count: Annotated[int, Meta(ge=0, le=MAX_GPUS)] | None = None
    gpus: Annotated[tuple[GpuSample, ...], Meta(max_length=MAX_GPUS)] = ()
    xids: Annotated[tuple[XidEvent, ...], Meta(max_length=MAX_XIDS_PER_REPORT)] = ()
    host: HostSample | None = None
    errors: Annotated[tuple[Text, ...], Meta(max_length=MAX_ERRORS)] = ()
    driver: Identifier = ""


class ReportBatch(Struct, frozen=True, gc=False):
    v: int
    node: NodeName
    reports: Annotated[tuple[NodeReport, ...], Meta(max_length=MAX_REPORTS_PER_BATCH)] = ()
    dropped: Count = 0


def _check_report(r: NodeReport, node: str) -> str | None:
    if r.v != SCHEMA_VERSION:
        return f"report schema version {r.v} is not supported (this daemon reads {SCHEMA_VERSION})"
    if r.node != node:
        return f"report for node {r.node!r} inside a batch from node {node!r}"
    if r.source not in SOURCES:
        return f"source {r.source!r} is not one of {', '.join(sorted(SOURCES))}"
    if not math.isfinite(r.at):  # JSON has no inf or NaN; a report built in Python might
        return "at must be a finite time"
    if len({g.i for g in r.gpus}) != len(r.gpus):
        return "a gpu index appears twice in one report"
    if r.xids and not all(math.isfinite(x.at) for x in r.xids):
        return "an xid event's at must be a finite time"
    return _characters_problem(r)


def _characters_problem(r: NodeReport) -> str | None:
    """Identifiers of identifier characters, texts without control characters: all of the report's
    in two passes (identifiers joined by "/", itself one, are one iff each is), the field named
    only when one is wrong."""
    names, texts = [r.driver], list(r.errors)
    for g in r.gpus:
        names += (g.uuid, g.bus)
        texts.append(g.name)
        if g.errors:
            names += g.errors.keys()
            texts += g.errors.values()
    for x in r.xids:
        names += (x.uuid, x.bus)
        texts.append(x.text)
    joined = "/".join(names)
    if is_identifier(joined, limit=len(joined)) and not has_controls("".join(texts)):
        return None
    return _named_characters_problem(r)


def _errors_ok(errors: Mapping[str, str]) -> bool:
    return all(is_identifier(k) and not has_controls(v) for k, v in errors.items())


def _named_characters_problem(r: NodeReport) -> str:
    odd = "is not an identifier ([A-Za-z0-9:._/-])"
    if not is_identifier(r.driver):
        return f"driver {r.driver[:64]!r} {odd}"
    if any(map(has_controls, r.errors)):
        return "errors: no control characters"
    for g in r.gpus:
        for name, value in (("uuid", g.uuid), ("bus", g.bus)):
            if not is_identifier(value):
                return f"gpu {g.i}: {name} {value[:64]!r} {odd}"
        if has_controls(g.name):
            return f"gpu {g.i}: name must have no control characters"
        if g.errors and not _errors_ok(g.errors):
            return f"gpu {g.i}: errors must map a field name to a short text with no control characters"
    for x in r.xids:
        if not (is_identifier(x.uuid) and is_identifier(x.bus)):
            return f"xid event {x.xid} on gpu {x.gpu}: uuid and bus must be identifiers ([A-Za-z0-9:._/-])"
        if has_controls(x.text):
            return f"xid event {x.xid} on gpu {x.gpu}: text must have no control characters"
    raise AssertionError("a report failed the character check but no field of it does")


def check_batch(batch: ReportBatch) -> str | None:
    """The first problem of a decoded batch that its types cannot say, as a sentence; None when it
    is acceptable. (A batch built in Python rather than decoded is not held to the types' bounds.)"""
    if batch.v != SCHEMA_VERSION:
        return f"batch schema version {batch.v} is not supported (this daemon reads {SCHEMA_VERSION})"
    if not batch.reports:
        return "a batch must carry at least one report"
    for r in batch.reports:
        problem = _check_report(r, batch.node)
        if problem:
            return f"report seq {r.seq}: {problem}"
    return None


def to_wire(value: object) -> object:
    """The compact JSON-ready form: dataclasses as objects without their None/empty fields."""
    if isinstance(value, (NodeReport, ReportBatch, GpuSample, XidEvent, HostSample)):
        out: dict[str, object] = {}
        for name in value.__struct_fields__:
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
