"""The chronicle's incidents: which events make one, and how one reads.

An incident is a fault and everything that followed it up to the next attempt running; a Slurm
requeue or a restart with no fault on record opens one too. Events that neither open nor follow an
incident stay in the routine timeline; notes and the run's end are blocks of their own.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from supervisor.domain.goodput.account import Interruption
from supervisor.domain.records import AttemptRecord, Event, EventKind, RunRecord
from supervisor.domain.text_safety import markdown
from supervisor.report.figures import restart_limit, restarts
from supervisor.report.goodput import gpus_of, hours
from supervisor.report.text import (
    attempt_words,
    decision,
    evidence,
    fault_cause,
    heading_stamp,
    seconds,
    stamp,
    strip_label,
    subject,
)

TERMINAL = {EventKind.COMPLETED: "completed", EventKind.GAVE_UP: "gave up", EventKind.CANCELLED: "cancelled"}
_FOLLOW_UP = frozenset(
    {
        EventKind.NODE_DRAINED,
        EventKind.NODE_EXCLUDED,
        EventKind.FENCED,
        EventKind.STOPPED,
        EventKind.WARNING,
        EventKind.RELEASED,
        EventKind.REQUEUED,
        EventKind.RESTARTED,
    }
)
_OPENS = frozenset({EventKind.FAULT, EventKind.STOPPED, EventKind.REQUEUED, EventKind.RESTARTED})
_NOT_DECISIONS = (EventKind.FAULT, EventKind.WARNING, EventKind.STARTED)


@dataclass
class Incident:
    """The events of one incident, in order; closed once the run ended or another attempt ran."""

    events: list[Event] = field(default_factory=list)
    closed: bool = False

    @property
    def at(self) -> float:
        return self.events[0].at

    def has(self, kind: EventKind) -> bool:
        return any(e.kind is kind for e in self.events)

    def of(self, kind: EventKind) -> list[Event]:
        return [e for e in self.events if e.kind is kind]

    @property
    def attempt(self) -> int | None:
        first = self.of(EventKind.FAULT) or self.events
        return first[0].attempt

    @property
    def restarted(self) -> bool:
        return self.has(EventKind.RESTARTED) or self.has(EventKind.REQUEUED)

    def takes(self, fault: Event) -> bool:
        """Whether a further fault belongs here: same attempt, no restart yet."""
        return not self.restarted and self.attempt == fault.attempt


def group(events: Iterable[Event]) -> tuple[list[Event], list[Incident | Event]]:
    """Events in causal order split into the routine timeline and the blocks that get a heading
    (incidents, terminal events and notes, in the order they began)."""
    grouping = _Grouping()
    for e in events:
        grouping.add(e)
    return grouping.timeline, grouping.blocks


class _Grouping:
    def __init__(self) -> None:
        self.timeline: list[Event] = []
        self.blocks: list[Incident | Event] = []
        self._current: Incident | None = None
        self._first_start_seen = False

    def add(self, e: Event) -> None:
        if e.kind is EventKind.NOTE or e.kind in TERMINAL:
            self._block(e)
        elif e.kind is EventKind.FAULT:
            self._fault(e)
        elif e.kind is EventKind.STARTED:
            self._started(e)
        elif e.kind in _FOLLOW_UP and self._current is not None:
            self._current.events.append(e)
        elif e.kind in _OPENS:
            self._open(e)
        else:
            self.timeline.append(e)

    def _block(self, e: Event) -> None:
        if e.kind in TERMINAL:
            self._close()
        self.blocks.append(e)

    def _fault(self, e: Event) -> None:
        if self._current is not None and self._current.takes(e):
            self._current.events.append(e)
        else:
            self._open(e)

    def _started(self, e: Event) -> None:
        current = self._current
        if current is not None and e.attempt != current.attempt:
            current.events.append(e)
            self._close()
        elif not self._first_start_seen or current is None:
            self.timeline.append(e)
        else:
            current.events.append(e)
        self._first_start_seen = True

    def _open(self, e: Event) -> None:
        self._current = Incident([e])
        self.blocks.append(self._current)

    def _close(self) -> None:
        if self._current is not None:
            self._current.closed = True
            self._current = None


# ---------------------------------------------------------------- how an incident reads


def incident_lines(
    run: RunRecord, inc: Incident, by_seq: Mapping[int, AttemptRecord], lost: Interruption | None
) -> list[str]:
    """An incident's heading, evidence, decision, warnings, cost and lost work."""
    lines = [_heading(run, inc), ""]
    lines += [f"- **Evidence**{subject(f)}: {evidence(f)}" for f in inc.of(EventKind.FAULT)]
    lines += _decision_lines(inc)
    lines += [f"- **Warning**: {strip_label(w)}" for w in inc.of(EventKind.WARNING)]
    lines.append(f"- **Cost**: {_cost(run, inc, by_seq)}")
    if lost is not None:
        lines.append(f"- **Lost work**: {_lost_work(run, lost)}")
    lines.append("")
    return lines


def _heading(run: RunRecord, inc: Incident) -> str:
    faults = inc.of(EventKind.FAULT)
    actor = (faults[0] if faults else inc.events[0]).actor
    return f"### {heading_stamp(inc.at)} [{actor}]: Run {run.name}{attempt_words(inc.attempt)} — {incident_title(inc)}"


def incident_title(inc: Incident) -> str:
    """What happened and where it stands, in a few words: ``restart after node fault on n013``."""
    cause = _cause(inc)
    if inc.restarted:
        return f"restart after {cause}"
    if inc.closed:
        return f"{cause}; not restarted"
    return f"{cause}; recovery under way"


def recovered_by(inc: Incident) -> Event | None:
    """The start of the attempt that replaced the one the incident hit (None while none runs)."""
    started = [e for e in inc.of(EventKind.STARTED) if e.attempt != inc.attempt]
    return started[-1] if started else None


def _decision_lines(inc: Incident) -> list[str]:
    decisions = [decision(e) for e in inc.events if e.kind not in _NOT_DECISIONS]
    if len(decisions) == 1:
        return [f"- **Decision**: {decisions[0]}"]
    if decisions:
        return ["- **Decision**:", *(f"  - {d}" for d in decisions)]
    return []


def _cause(inc: Incident) -> str:
    faults = inc.of(EventKind.FAULT)
    nodes = sorted({str(f.evidence["node"]) for f in faults if f.evidence.get("node")})
    parts = [f"node fault on {', '.join(nodes)}"] if nodes else []
    parts += [c for c in map(fault_cause, faults) if c is not None]
    if not parts:
        first = inc.events[0]
        parts.append("Slurm requeue" if first.kind is EventKind.REQUEUED else strip_label(first))
    return "; ".join(dict.fromkeys(parts))


def _cost(run: RunRecord, inc: Incident, by_seq: Mapping[int, AttemptRecord]) -> str:
    parts = [_recovery(inc)]
    a = by_seq.get(inc.attempt) if inc.attempt is not None else None
    if a is not None and a.started_at is not None:
        parts.append(_attempt_ran(inc, a, a.started_at))
    spent = [e.evidence.get("restarts_spent") for e in inc.of(EventKind.RESTARTED)]
    spent_n = next((int(x) for x in reversed(spent) if isinstance(x, int)), None)
    if spent_n is not None:
        parts.append(f"restarts spent {restarts(spent_n, run.spec.max_restarts)}")
    elif inc.has(EventKind.REQUEUED):
        parts.append(f"one restart spent of {restart_limit(run.spec.max_restarts)}")
    return "; ".join(parts) + "."


def _recovery(inc: Incident) -> str:
    s = recovered_by(inc)
    if s is None:
        return f"no new attempt running yet (fault at {stamp(inc.at)})"
    return f"{seconds(s.at - inc.at)} from the fault ({stamp(inc.at)}) to attempt {s.attempt} running ({stamp(s.at)})"


def _attempt_ran(inc: Incident, a: AttemptRecord, started_at: float) -> str:
    end = a.ended_at if a.ended_at is not None else inc.at
    how = f", ended {a.end_state}" if a.end_state else ""
    return (
        f"attempt {a.seq} (job {a.job_id}) had run {seconds(end - started_at)}, "
        f"from {stamp(started_at)} to {stamp(end)}{how}"
    )


def _lost_work(run: RunRecord, i: Interruption) -> str:
    cause = i.cause.category + (f" ({i.cause.component})" if i.cause.component else "")
    where = "Llama 3 Table 5" if i.cause.table5 else "not a Llama 3 Table 5 category"
    if i.lost_work_s is None:
        work = "work since the checkpoint not on record (no resume step or lost steps in the evidence)"
    else:
        steps = f"{i.lost_steps} steps, " if i.lost_steps is not None else ""
        resumed = f" (resumed from step {i.resume_step})" if i.resume_step is not None else ""
        work = f"{steps}{hours(i.lost_work_s)} of work since the checkpoint{resumed}"
    gpus = gpus_of(run.spec)
    down = (i.detection_s or 0.0) + (i.lost_work_s or 0.0) + (i.recovery_s or 0.0)
    gpu_hours = down * gpus / 3600 if gpus else 0.0
    at_least = "at least " if i.lost_work_s is None else ""  # the work redone is not in it
    cost = f"; {at_least}{gpu_hours:,.1f} GPU-hours" if gpu_hours >= 0.05 else ""
    return f"{work}{cost}; cause: {markdown(cause)}, {where} — {markdown(i.cause.basis)}."
