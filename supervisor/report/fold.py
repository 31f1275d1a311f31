"""The logbook folded for on-call: incidents first-class, routine events summed up.

A day of a large run verifies a checkpoint every few minutes; a terminal showing one line per
verification buries the faults between them. ``fold`` turns the events into entries: each incident
(as the chronicle groups them, report.incidents) opens with an ``IncidentStart`` — what
happened, and how long until the next attempt ran — followed by its events; consecutive routine
events of one foldable kind become one ``Fold`` ("36 checkpoint verifications passed, steps
1840–4640"); everything else is a ``Line`` of its own. Pure: the same events give the same entries.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from supervisor.domain.records import Event, EventKind
from supervisor.report.chronicle import causal_order
from supervisor.report.figures import count, duration, step_span
from supervisor.report.incidents import Incident, group, incident_title, recovered_by

# Routine kinds whose runs fold, and how a run of them reads (its length given).
FOLDABLE: dict[EventKind, tuple[str, str]] = {
    EventKind.CHECKPOINT_VERIFIED: ("checkpoint verification passed", "checkpoint verifications passed"),
    EventKind.SPIKE_HEALED: ("loss spike healed by itself", "loss spikes healed by themselves"),
    EventKind.CONTINUED: ("job continued after its planned end", "jobs continued after their planned ends"),
}


@dataclass(frozen=True)
class Line:
    """One event shown as it is; ``incident`` is the number of the incident it belongs to, if any."""

    event: Event
    incident: int | None = None


@dataclass(frozen=True)
class Fold:
    """Consecutive routine events of one kind, shown as one line."""

    events: tuple[Event, ...]

    @property
    def first(self) -> Event:
        return self.events[0]

    @property
    def last(self) -> Event:
        return self.events[-1]

    def summary(self) -> str:
        """``36 checkpoint verifications passed, steps 1840–4640``."""
        one, many = FOLDABLE.get(self.first.kind, (f"{self.first.kind.value} event", f"{self.first.kind.value} events"))
        text = f"{count(len(self.events))} {one if len(self.events) == 1 else many}"
        steps = [e.evidence["step"] for e in self.events if _is_step(e.evidence.get("step"))]
        return f"{text}, {step_span(min(steps), max(steps))}" if steps else text


@dataclass(frozen=True)
class IncidentStart:
    """The head of an incident: its number, when and on which attempt it began, what it was."""

    number: int
    at: float
    attempt: int | None
    title: str  # "restart after node fault on n013"
    outcome: str  # "attempt 1 running 2 min 11 s later", or "no new attempt running yet"


Entry = Line | Fold | IncidentStart


def fold(events: Iterable[Event]) -> list[Entry]:
    """The events (any order) as folded entries, in causal order."""
    ordered = sorted(events, key=causal_order)
    _, blocks = group(ordered)
    incidents = [b for b in blocks if isinstance(b, Incident)]
    heads = {id(inc.events[0]): (n, inc) for n, inc in enumerate(incidents, start=1)}
    member = {id(e): n for n, inc in enumerate(incidents, start=1) for e in inc.events}
    out: list[Entry] = []
    pending: list[Event] = []  # the run of foldable routine events not yet written
    for e in ordered:
        if e.kind in FOLDABLE and id(e) not in member and (not pending or pending[0].kind is e.kind):
            pending.append(e)
            continue
        out += _flush(pending)
        if e.kind in FOLDABLE and id(e) not in member:
            pending.append(e)
            continue
        if id(e) in heads:
            out.append(incident_start(*heads[id(e)]))
        out.append(Line(e, member.get(id(e))))
    return out + _flush(pending)


def incident_start(number: int, inc: Incident) -> IncidentStart:
    started = recovered_by(inc)
    outcome = (
        f"attempt {started.attempt} running {duration(started.at - inc.at)} later"
        if started is not None
        else "no new attempt running yet"
    )
    return IncidentStart(number, inc.at, inc.attempt, incident_title(inc), outcome)


def incidents(events: Iterable[Event]) -> list[IncidentStart]:
    """Every incident of the events, oldest first."""
    _, blocks = group(sorted(events, key=causal_order))
    return [incident_start(n, b) for n, b in enumerate((b for b in blocks if isinstance(b, Incident)), start=1)]


def folded_away(entries: Sequence[Entry]) -> int:
    """How many events the folds stand for beyond their one line each."""
    return sum(len(x.events) - 1 for x in entries if isinstance(x, Fold))


def _flush(pending: list[Event]) -> list[Entry]:
    """The pending run: one fold, or the single event as a line; and the run emptied."""
    if not pending:
        return []
    entry: Entry = Fold(tuple(pending)) if len(pending) > 1 else Line(pending[0])
    pending.clear()
    return [entry]


def _is_step(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)
