"""Convert the public InfiniteHBD fault trace (stepfun-ai/InfiniteHBD-Trace, Apache-2.0) into our
fault-trace format (docs/fault-trace.md).

The source is a JSON list of events ``{node_id, event_time (days), event_type (fault_start |
fault_end), fault_type {Level, Class, Desc}}``. Each ``fault_start`` is paired with the node's next
``fault_end``: one fault, node down from start to end. The file is hostile input like any trace:
bounded size and event count, node ids must be UUIDs, times finite and within a few years, classes
bounded text; a bad event is refused with its index.
"""

from __future__ import annotations

import csv
import io
import math
import re
import sys
from dataclasses import dataclass
from pathlib import Path

import msgspec

MAX_BYTES = 16 * 1024 * 1024  # the whole public trace is 340 kB
MAX_EVENTS = 200_000
MAX_DAYS = 5 * 366.0
DAY_S = 86400.0
_UUID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")
# The trace's fault classes as they show to the supervisor. Every event made the node unavailable
# (the trace's own definition), so even its software classes are faults of the node.
_NIC_CLASSES = {"nic", "parameter plane cable"}


class _Kind(msgspec.Struct):
    Level: str = ""
    Class: str = ""
    Desc: str = ""


class _Event(msgspec.Struct):
    node_id: str
    event_time: float
    event_type: str
    fault_type: _Kind = msgspec.field(default_factory=_Kind)


@dataclass(frozen=True)
class Converted:
    rows: list[tuple[str, float, float, str]]  # node, start_s, end_s, cause
    skipped: int  # a start while the node was already down, or an end with no start


def convert(data: bytes) -> Converted:
    if len(data) > MAX_BYTES:
        raise ValueError(f"InfiniteHBD trace: {len(data)} bytes, more than {MAX_BYTES}")
    try:
        events = msgspec.json.decode(data, type=list[_Event])
    except msgspec.ValidationError as e:
        raise ValueError(f"InfiniteHBD trace: not the documented event list: {e}") from None
    if len(events) > MAX_EVENTS:
        raise ValueError(f"InfiniteHBD trace: {len(events)} events, more than {MAX_EVENTS}")
    return _pair([_checked(e, i) for i, e in enumerate(events)])


def _checked(e: _Event, i: int) -> _Event:
    if not _UUID.fullmatch(e.node_id):
        raise ValueError(f"InfiniteHBD trace, event {i}: node_id {e.node_id[:40]!r} is not a UUID")
    if not (math.isfinite(e.event_time) and 0.0 <= e.event_time <= MAX_DAYS):
        raise ValueError(f"InfiniteHBD trace, event {i}: event_time {e.event_time!r} is not 0..{MAX_DAYS} days")
    if e.event_type not in ("fault_start", "fault_end"):
        raise ValueError(f"InfiniteHBD trace, event {i}: event_type {e.event_type[:40]!r}")
    return e


def _pair(events: list[_Event]) -> Converted:
    open_at: dict[str, tuple[float, str]] = {}
    rows: list[tuple[str, float, float, str]] = []
    skipped = 0
    for e in sorted(events, key=lambda e: e.event_time):
        if e.event_type == "fault_start":
            skipped += e.node_id in open_at
            open_at.setdefault(e.node_id, (e.event_time, cause_of(e.fault_type)))
            continue
        start = open_at.pop(e.node_id, None)
        if start is None:
            skipped += 1
            continue
        rows.append((e.node_id, start[0] * DAY_S, max(e.event_time * DAY_S, start[0] * DAY_S + 1.0), start[1]))
    return Converted(rows, skipped + len(open_at))


def cause_of(kind: _Kind) -> str:
    """Our cause for a trace class: how the fault would show to the supervisor."""
    cls, desc = kind.Class.strip().lower()[:80], kind.Desc.strip().lower()[:200]
    if cls == "gpu":
        return "ecc" if ("ecc" in desc or "dbe" in desc) else "xid"
    return "nic" if cls in _NIC_CLASSES else "host_down"


def to_csv(converted: Converted) -> str:
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(["node", "start", "end", "cause"])
    for node, start, end, cause in converted.rows:
        writer.writerow([node, f"{start:.0f}", f"{end:.0f}", cause])
    return out.getvalue()


def main(argv: list[str]) -> int:
    """``python -m supervisor.sim.faults.infinitehbd fault_trace.json OUT.csv``"""
    if len(argv) != 2:
        print("usage: python -m supervisor.sim.faults.infinitehbd fault_trace.json OUT.csv", file=sys.stderr)
        return 2
    converted = convert(Path(argv[0]).read_bytes())
    Path(argv[1]).write_text(to_csv(converted))
    print(f"{len(converted.rows)} faults, {converted.skipped} unpaired events skipped")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
