"""Plain-text and JSON renderings of runs, attempts, nodes and the logbook for the CLI.

Text for the terminal carries no control character: what agents, job logs and Slurm say passes
through ``printable`` (ESC, CSI and OSC sequences would clear the screen, retitle the window or
write the clipboard); rich ``Text`` is built from plain strings, never parsed as markup. JSON
output escapes them itself."""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from typing import Any

from rich.console import Console
from rich.text import Text

from supervisor.domain.goodput.account import CheckpointAdvice, Goodput, Interruption
from supervisor.domain.records import AttemptRecord, Event, NodeVerdict, RunRecord
from supervisor.domain.text_safety import printable
from supervisor.ports import Clock
from supervisor.report.figures import restarts
from supervisor.report.goodput import cause_rows, hours, percent, summary_rows


def ts(t: float | None) -> str:
    if t is None:
        return "-"
    return datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def run_dict(run: RunRecord, attempts: list[AttemptRecord]) -> dict[str, Any]:
    a = run.attempt
    return {
        "name": run.name,
        "state": run.state.value,
        "partition": run.spec.partition,
        "nodes": run.spec.nodes,
        "restarts": {"spent": run.restarts_spent, "limit": run.spec.max_restarts},
        "job_id": a.job_id if a else None,
        "attempt": a.seq if a else None,
        "running_on": list(a.nodes) if a and a.started_at and not a.ended_at else [],
        "excluded": dict(run.excluded),
        "end_reason": run.end_reason,
        "attempts": [
            {
                "seq": x.seq,
                "job_id": x.job_id,
                "restart_count": x.restart_count,
                "nodes": list(x.nodes),
                "submitted_at": x.submitted_at,
                "started_at": x.started_at,
                "ended_at": x.ended_at,
                "end_state": x.end_state,
                "end_reason": x.end_reason,
                "exit_code": x.exit_code,
            }
            for x in attempts
        ],
    }


def status_lines(runs: Iterable[RunRecord]) -> list[str]:
    rows = [("RUN", "STATE", "JOB", "ATTEMPT", "RESTARTS", "EXCLUDED")]
    for r in runs:
        a = r.attempt
        rows.append(
            (
                printable(r.name),
                r.state.value,
                str(a.job_id) if a else "-",
                str(a.seq) if a else "-",
                restarts(r.restarts_spent, r.spec.max_restarts),
                printable(",".join(sorted(r.excluded))) or "-",
            )
        )
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return ["  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() for row in rows]


def logbook_lines(events: Iterable[Event], *, evidence: bool = False) -> list[str]:
    out = []
    for e in events:
        where = f"attempt {e.attempt}" if e.attempt is not None else "-"
        line = f"{ts(e.at)}  {e.run}  {where:<10} {e.kind.value:<14} {e.message}  [{e.actor}]"
        out.append(printable(line))
        if evidence and e.evidence:
            out.append("    evidence: " + printable(json.dumps(e.evidence, sort_keys=True, default=str)))
    return out


def node_lines(verdicts: Iterable[NodeVerdict]) -> list[str]:
    rows: list[tuple[str, ...]] = [("NODE", "VERDICT", "ACTION", "RUN", "SINCE", "REASON")]
    for v in verdicts:
        row = (v.node, v.verdict.value, v.action or "excluded", v.run or "-", ts(v.at), v.reason)
        rows.append(tuple(printable(c) for c in row))
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]) - 1)]
    return ["  ".join([*(c.ljust(w) for c, w in zip(row[:-1], widths, strict=True)), row[-1]]) for row in rows]


# ---------------------------------------------------------------- the terminal logbook (rich)

_KIND_STYLE = {
    "fault": "bold red",
    "gave_up": "bold red",
    "mass_fault": "bold red",
    "node_drained": "red",
    "node_excluded": "yellow",
    "warning": "yellow",
    "stopped": "magenta",
    "requeued": "magenta",
    "restarted": "cyan",
    "started": "green",
    "completed": "bold green",
    "note": "bold blue",
    "rollback": "bold magenta",
    "spike": "yellow",
    "cancelled": "magenta",
}


@dataclass(frozen=True)
class EventFilter:
    """Which events to show: a time range (UTC seconds), kinds and nodes (any of each, when given)."""

    since: float | None = None
    until: float | None = None
    kinds: frozenset[str] = frozenset()
    nodes: frozenset[str] = frozenset()

    def matches(self, e: Event) -> bool:
        if self.since is not None and e.at < self.since:
            return False
        if self.until is not None and e.at > self.until:
            return False
        if self.kinds and e.kind.value not in self.kinds:
            return False
        return not self.nodes or bool(self.nodes & nodes_of(e))

    @property
    def active(self) -> bool:
        return self != EventFilter()


def nodes_of(e: Event) -> set[str]:
    """Nodes an event is about: its evidence's node lists, and node names its message spells out."""
    ev = e.evidence
    found = {ev["node"]} if isinstance(ev.get("node"), str) else set()
    for key in ("nodes", "exclude", "bad_nodes"):
        value = ev.get(key)
        if isinstance(value, list | tuple | dict):
            found |= {str(n) for n in value}
    found |= set(_NODE_WORD.findall(e.message))
    return found


_NODE_WORD = re.compile(r"[A-Za-z][\w-]*\d")  # candidate node names in a message (n003, gpu-117)

_AGO = re.compile(r"^(\d+(?:\.\d+)?)\s*(s|m|min|h|d)$")
_UNIT = {"s": 1.0, "m": 60.0, "min": 60.0, "h": 3600.0, "d": 86400.0}


def parse_when(text: str, now: float) -> float:
    """``2026-11-29T03:00`` (UTC unless an offset is given), ``2026-11-29 03:00:00Z``, or ``90m`` /
    ``2h`` / ``1d`` ago. Raises ValueError naming the accepted forms."""
    m = _AGO.match(text.strip().lower())
    if m:
        return now - float(m.group(1)) * _UNIT[m.group(2)]
    try:
        dt = datetime.fromisoformat(text.strip().replace("Z", "+00:00").replace(" UTC", "+00:00"))
    except ValueError:
        raise ValueError(
            f"cannot read the time {text!r}: give an ISO time in UTC such as 2026-11-29T03:00 "
            "(or with an offset, 2026-11-28T22:00-05:00), or a span back from now such as 90m, 2h, "
            "1d"
        ) from None
    return (dt if dt.tzinfo else dt.replace(tzinfo=UTC)).timestamp()


def event_text(e: Event, *, evidence: bool = False) -> Text:
    """One logbook line for the terminal, styled by kind (plain when the output is not a terminal)."""
    where = f"attempt {e.attempt}" if e.attempt is not None else "-"
    t = Text()
    t.append(ts(e.at), style="dim")
    t.append(f"  {printable(e.run)}  {where:<10} ")
    t.append(f"{e.kind.value:<14}", style=_KIND_STYLE.get(e.kind.value, ""))
    t.append(f" {printable(e.message)}  ")
    t.append(f"[{printable(e.actor)}]", style="dim")
    if evidence and e.evidence:
        t.append("\n    evidence: " + printable(json.dumps(e.evidence, sort_keys=True, default=str)), style="dim")
    return t


def print_events(console: Console, events: Iterable[Event], filt: EventFilter, *, evidence: bool = False) -> int:
    shown = 0
    for e in events:
        if filt.matches(e):
            console.print(event_text(e, evidence=evidence))
            shown += 1
    return shown


def follow(
    read: Callable[[], list[Event]],
    emit: Callable[[list[Event]], object],
    clock: Clock,
    interval_s: float,
    *,
    skip: int = 0,
) -> int:
    """Poll ``read`` (the logbook, oldest first; append-only) every ``interval_s`` and hand new events
    to ``emit`` until the clock is stopped. Returns how many events were seen in all."""
    seen = skip
    while True:
        events = read()
        if len(events) > seen:
            emit(events[seen:])
            seen = len(events)
        if clock.wait(interval_s):
            return seen


def json_line(e: Event) -> str:
    return json.dumps(
        {
            "at": e.at,
            "run": e.run,
            "attempt": e.attempt,
            "job_id": e.job_id,
            "kind": e.kind.value,
            "message": e.message,
            "actor": e.actor,
            "evidence": e.evidence,
        },
        default=str,
    )


# ---------------------------------------------------------------- goodput


def goodput_lines(g: Goodput, advice: CheckpointAdvice, parts: list[Goodput], gpus: int | None) -> list[str]:
    rows = summary_rows(g, advice, gpus)
    width = max(len(k) for k, _ in rows)
    out = [f"goodput of run {g.run} from {ts(g.start)} to {ts(g.end)}", ""]
    out += [f"{k.ljust(width)}  {v}" for k, v in rows]
    causes = cause_rows(g)
    if causes:
        out += ["", *_columns([("CAUSE", "INTERRUPTIONS", "LOST", "LLAMA3 TABLE 5"), *causes])]
    if parts:
        out += [
            "",
            *_columns(
                [
                    ("FROM", "TO", "ETTR", "INTERRUPTIONS", "LOST"),
                    *(
                        (ts(p.start), ts(p.end), percent(p.ettr), str(len(p.interruptions)), hours(p.lost.total_s))
                        for p in parts
                    ),
                ]
            ),
        ]
    return out + ([""] + [f"note: {n}." for n in g.notes] if g.notes else [])


def _columns(rows: list[tuple[str, ...]]) -> list[str]:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows]


def goodput_dict(g: Goodput, advice: CheckpointAdvice, parts: list[Goodput]) -> dict[str, Any]:
    return {
        "run": g.run,
        **_period_dict(g),
        "lost_by_cause_s": {k: asdict(v) for k, v in g.by_cause.items()},
        "interruptions_per_day": g.interruptions_per_day,
        "mtbi_s": g.mtbi_s,
        "checkpoint_advice": _advice_dict(advice),
        "interruption_list": [_interruption_dict(i) for i in g.interruptions],
        "windows": [_period_dict(p) for p in parts],
        "notes": list(g.notes),
        "hot_spares": None if g.spares is None else {**asdict(g.spares), "saved_s": g.spares.saved_s},
    }


def _period_dict(x: Goodput) -> dict[str, Any]:
    """The figures of a whole run or of one window of it."""
    return {
        "start": x.start,
        "end": x.end,
        "wall_s": x.wall_s,
        "productive_s": x.productive_s,
        "running_s": x.running_s,
        "idle_s": x.idle_s,
        "ettr": x.ettr,
        "ettr_upper_bound": x.upper_bound,
        "lost_s": asdict(x.lost),
        "interruptions": len(x.interruptions),
    }


def _advice_dict(advice: CheckpointAdvice) -> dict[str, Any]:
    return {
        "interval_s": advice.interval_s,
        "save_s": advice.save_s,
        "mtbi_s": advice.mtbi_s,
        "expected_waste": advice.expected_waste,
        "reason": advice.reason,
    }


def _interruption_dict(i: Interruption) -> dict[str, Any]:
    return {
        "at": i.at,
        "attempt": i.attempt,
        "cause": asdict(i.cause),
        "detection_s": i.detection_s,
        "restart_s": i.restart_s,
        "queue_s": i.queue_s,
        "in_allocation": i.in_allocation,
        "recovery_s": i.recovery_s,
        "lost_work_s": i.lost_work_s,
        "lost_steps": i.lost_steps,
        "resume_step": i.resume_step,
    }


@contextmanager
def progress_bar(enabled: bool) -> Iterator[Callable[[str, float], None] | None]:
    """A transient progress bar on the terminal, one task per label (None when not ``enabled``)."""
    if not enabled:
        yield None
        return
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    with Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        TextColumn("{task.percentage:>5.1f}%"),
        TimeElapsedColumn(),
        transient=True,
    ) as bar:
        tasks: dict[str, object] = {}

        def update(label: str, fraction: float) -> None:
            if label not in tasks:
                tasks[label] = bar.add_task(label, total=1.0)
            bar.update(tasks[label], completed=fraction)  # type: ignore[arg-type]

        yield update
