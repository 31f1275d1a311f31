"""Replay a site's own fault trace instead of drawing failures from a model.

A trace is a list of faults — node, fault start, repair end, cause — as JSON or CSV (the format is
in docs/fault-trace.md). Loading validates every row (bounded file size and row count, node names
as Slurm spells them, finite times, a known cause) and says which row is wrong and how to fix it.

The trace's nodes are mapped, in natural order (n2 before n10), onto the simulated pool's nodes:
the first ``nodes_per_job`` carry the job at the start, the rest are the spares. A node-level fault
(GPU, ECC, NIC, host, slow node) strikes its own node wherever the job runs — it interrupts the job
only when that node is in the job's allocation at that moment; a job-level fault (a bug, a fabric
error, a hang, silent corruption) strikes the job wherever it runs.
"""

from __future__ import annotations

import csv
import io
import math
import random
import re
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import msgspec

from supervisor.sim.faults.failures import TABLE5, Category, Failure, FailureModel, Manifestation, RepairKind

MAX_BYTES = 64 * 1024 * 1024  # a year of a large site is a few MB; refuse anything absurd
MAX_FAULTS = 100_000
_NODE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")  # a Slurm node name, no shell or path tricks

_M, _R = Manifestation, RepairKind
#: A cause may also be how the fault showed, for sites that log no Table 5 component.
_BY_MANIFESTATION: dict[str, Category] = {
    m.value: Category(f"trace: {m.value}", group, 0, 0.0, m, repair, xid)
    for m, group, repair, xid in (
        (_M.XID, "GPU", _R.REPLACE, 79),
        (_M.ECC, "GPU", _R.REBOOT, 94),
        (_M.NIC, "Host", _R.REPLACE, None),
        (_M.HOST_DOWN, "Host", _R.REBOOT, None),
        (_M.STRAGGLER, "GPU", _R.REBOOT, None),
        (_M.HANG, "Unknown", _R.NONE, None),
        (_M.NCCL_ERROR, "Network", _R.NONE, None),
        (_M.SOFTWARE, "Dependency", _R.NONE, None),
        (_M.SDC, "GPU", _R.NONE, None),
    )
}
CAUSES: dict[str, Category] = {**{c.component.lower(): c for c in TABLE5}, **_BY_MANIFESTATION}


@dataclass(frozen=True)
class TraceFault:
    node: str
    start_s: float  # seconds after the trace's origin
    end_s: float | None  # the node is back (None: not recorded; a repair time is drawn)
    cause: Category


@dataclass(frozen=True)
class FaultTrace:
    faults: tuple[TraceFault, ...]  # by start
    source: str  # the file it came from
    origin: str  # what second 0 is: the earliest start's timestamp, or "0" for seconds

    @property
    def nodes(self) -> tuple[str, ...]:
        """Every node the trace names, in natural order: the order they map onto the pool."""
        return tuple(sorted({f.node for f in self.faults}, key=_natural))

    @property
    def span_s(self) -> float:
        return max(max(f.start_s, f.end_s or 0.0) for f in self.faults)

    def failures(self, horizon_s: float) -> list[Failure]:
        """The faults that start within ``horizon_s``, as the simulator's failures. The draws a
        trace does not fix (which of the job's nodes a job-level fault names, the phase of the
        health check) are seeded by the fault's place in the trace: every mode sees the same."""
        index = {node: i for i, node in enumerate(self.nodes)}
        out = []
        for i, f in enumerate(self.faults):
            if f.start_s >= horizon_s:
                break
            rng = random.Random(f"trace:{i}")
            repair = None if f.end_s is None else f.end_s - f.start_s
            out.append(Failure(f.start_s, f.cause, rng.random(), rng.random(), rng.random(), index[f.node], repair))
        return out

    def model(self, nodes_per_job: int, pool: int, gpus_per_node: int, horizon_s: float) -> FailureModel:
        """The rate the job would see on this trace (for Young/Daly and the printed MTBF): every
        job-level fault, and the node-level faults on the pool's nodes in the share of the pool the
        job occupies; categories weighted by their counts in the trace."""
        within = [f for f in self.faults if f.start_s < horizon_s]
        index = {node: i for i, node in enumerate(self.nodes)}
        job = sum(1 for f in within if not f.cause.shows.node_level)
        on_pool = sum(1 for f in within if f.cause.shows.node_level and index[f.node] < pool)
        per_job_hour = (job + on_pool * nodes_per_job / pool) / (horizon_s / 3600.0)
        counts: dict[Category, int] = {}
        for f in within or self.faults:
            counts[f.cause] = counts.get(f.cause, 0) + 1
        cats = tuple(Category(c.component, c.group, n, 0.0, c.shows, c.repair, c.xid) for c, n in counts.items())
        return FailureModel(
            cats,
            per_job_hour / (nodes_per_job * gpus_per_node),
            f"fault trace {Path(self.source).name} ({len(within)} faults on {len(self.nodes)} nodes, "
            f"from {self.origin})",
        )

    def by_cause(self, horizon_s: float) -> dict[str, int]:
        out: dict[str, int] = {}
        for f in self.faults:
            if f.start_s < horizon_s:
                out[f.cause.component] = out.get(f.cause.component, 0) + 1
        return dict(sorted(out.items(), key=lambda kv: (-kv[1], kv[0])))


# -- loading ------------------------------------------------------------------------------------


class _Row(msgspec.Struct):
    node: str
    start: float | str
    cause: str
    end: float | str | None = None


class _Doc(msgspec.Struct):
    faults: list[_Row]


def load(path: str | Path) -> FaultTrace:
    """A trace from a ``.json`` or ``.csv`` file (by its first character when the suffix says
    neither); raises ValueError naming the file, the row and the fix."""
    p = Path(path)
    try:
        with open(p, "rb") as fh:
            data = fh.read(MAX_BYTES + 1)
    except OSError as exc:
        raise ValueError(f"cannot read the fault trace {p}: {exc.strerror or exc}") from None
    if len(data) > MAX_BYTES:
        raise ValueError(f"fault trace {p}: larger than {MAX_BYTES // 2**20} MiB; split it by year")
    as_json = p.suffix.lower() == ".json" or (p.suffix.lower() != ".csv" and data.lstrip()[:1] in (b"{", b"["))
    rows = _json_rows(data, p) if as_json else _csv_rows(data, p)
    return _trace(rows, str(p))


def _json_rows(data: bytes, path: Path) -> list[_Row]:
    try:
        doc = msgspec.json.decode(data, type=_Doc | list[_Row])
    except msgspec.DecodeError as exc:
        raise ValueError(
            f'fault trace {path}: {exc}; expected {{"faults": [{{"node", "start", "end", "cause"}}, ...]}}'
        ) from None
    return doc.faults if isinstance(doc, _Doc) else doc


def _csv_rows(data: bytes, path: Path) -> list[_Row]:
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError:
        raise ValueError(f"fault trace {path}: not UTF-8 text; save the CSV as UTF-8") from None
    reader = csv.DictReader(io.StringIO(text))
    try:
        return _read_csv(reader, path)
    except csv.Error as exc:  # a field over the csv module's limit, a NUL byte, a broken quote
        raise ValueError(f"fault trace {path}: {exc} after line {reader.line_num}; fix or drop that line") from None


def _read_csv(reader: csv.DictReader[str], path: Path) -> list[_Row]:
    missing = {"node", "start", "cause"} - set(reader.fieldnames or ())
    if missing:
        raise ValueError(
            f"fault trace {path}: the CSV header lacks {', '.join(sorted(missing))}; "
            "the columns are node,start,end,cause"
        )
    rows: list[_Row] = []
    for row in reader:
        if len(rows) > MAX_FAULTS:
            break
        end = (row.get("end") or "").strip()
        rows.append(_Row(row["node"] or "", row["start"] or "", row["cause"] or "", end or None))
    return rows


def _trace(rows: Sequence[_Row], source: str) -> FaultTrace:
    if not rows:
        raise ValueError(f"fault trace {source}: no faults in it")
    if len(rows) > MAX_FAULTS:
        raise ValueError(f"fault trace {source}: more than {MAX_FAULTS:,} faults; replay a shorter period")
    times = [_times(r, source, n) for n, r in enumerate(rows, 1)]
    kinds = {k for k, _, _ in times}
    if len(kinds) > 1:
        raise ValueError(f"fault trace {source}: mixes seconds and timestamps; use one or the other")
    origin = min(s for _, s, _ in times) if kinds == {"iso"} else 0.0
    faults = [
        TraceFault(_node(r.node, source, n), s - origin, None if e is None else e - origin, _cause(r.cause, source, n))
        for n, (r, (_, s, e)) in enumerate(zip(rows, times, strict=True), 1)
    ]
    faults.sort(key=lambda f: (f.start_s, _natural(f.node)))
    label = datetime.fromtimestamp(origin, UTC).isoformat() if kinds == {"iso"} else "0"
    return FaultTrace(tuple(faults), source, label)


def _times(row: _Row, source: str, n: int) -> tuple[str, float, float | None]:
    kind, start = _time(row.start, source, n, "start")
    if row.end is None:
        return kind, start, None
    end_kind, end = _time(row.end, source, n, "end")
    if end_kind != kind:
        raise ValueError(f"fault trace {source}, row {n}: start and end must both be seconds or both timestamps")
    if end < start:
        raise ValueError(f"fault trace {source}, row {n}: the repair ends before the fault starts")
    return kind, start, end


def _time(value: float | str, source: str, n: int, name: str) -> tuple[str, float]:
    where = f"fault trace {source}, row {n}, {name}"
    if isinstance(value, str):
        text = value.strip()
        try:
            value = float(text)
        except ValueError:
            return "iso", _timestamp(text, where)
    if not (math.isfinite(value) and value >= 0):
        raise ValueError(f"{where}: seconds must be a finite number ≥ 0 (got {value!r})")
    return "s", float(value)


def _timestamp(text: str, where: str) -> float:
    try:
        stamp = datetime.fromisoformat(text)
    except ValueError:
        raise ValueError(f"{where}: {text[:40]!r} is neither seconds nor an ISO 8601 time") from None
    if stamp.tzinfo is None:
        raise ValueError(f"{where}: {text[:40]!r} has no time zone; add one (e.g. 'Z' or '+00:00')")
    return stamp.timestamp()


def _node(name: str, source: str, n: int) -> str:
    name = name.strip()
    if not _NODE.fullmatch(name):
        raise ValueError(
            f"fault trace {source}, row {n}: node {name[:40]!r} is not a node name "
            "(letters, digits, '.', '_', '-'; at most 128)"
        )
    return name


def _cause(text: str, source: str, n: int) -> Category:
    cause = CAUSES.get(text.strip().lower())
    if cause is None:
        raise ValueError(
            f"fault trace {source}, row {n}: unknown cause {text.strip()[:40]!r}; use a Table 5 component "
            f"(e.g. 'Faulty GPU') or one of {', '.join(_BY_MANIFESTATION)}"
        )
    return cause


def _natural(name: str) -> tuple[tuple[int, int | str], ...]:
    return tuple((0, int(part)) if part.isdigit() else (1, part) for part in re.split(r"(\d+)", name) if part)
