"""The Markdown chronicle: a run's logbook written the way the OPT-175B logbook was, by the machine.

One dated heading per incident (a fault and everything that followed it up to the next attempt
running), each with the evidence, the decision and its cost; routine events in a short timeline at
the top; the run's end and people's notes under headings of their own. One zone (UTC), no clock
read: the same records always give the same text.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from supervisor.domain.goodput import Interruption, goodput, measured_save_s
from supervisor.domain.goodput_text import gpus_of, hours, markdown_lines
from supervisor.domain.records import AttemptRecord, Event, EventKind, RunRecord

_ROUTINE = frozenset({EventKind.REGISTERED, EventKind.SUBMITTED, EventKind.ADOPTED, EventKind.STARTED})
_TERMINAL = {EventKind.COMPLETED: "completed", EventKind.GAVE_UP: "gave up", EventKind.CANCELLED: "cancelled"}
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
# Events recorded in the same instant are put in causal order (an attempt is submitted, starts, faults, is
# contained and stopped; the run ends last), so the chronicle does not depend on the order it was given.
_CAUSAL = {
    k: i
    for i, k in enumerate(
        [
            EventKind.REGISTERED,
            EventKind.ADOPTED,
            EventKind.SUBMITTED,
            EventKind.RESTARTED,
            EventKind.RELEASED,
            EventKind.STARTED,
            EventKind.FAULT,
            EventKind.NODE_DRAINED,
            EventKind.NODE_EXCLUDED,
            EventKind.FENCED,
            EventKind.STOPPED,
            EventKind.REQUEUED,
            EventKind.WARNING,
            EventKind.NOTE,
            EventKind.COMPLETED,
            EventKind.GAVE_UP,
            EventKind.CANCELLED,
        ]
    )
}


def stamp(t: float) -> str:
    """Seconds since the epoch as ``YYYY-MM-DD HH:MM:SS UTC``."""
    return datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def heading_stamp(t: float) -> str:
    """The minute-resolution time of a heading: ``YYYY-MM-DD HH:MM UTC``."""
    return datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%d %H:%M UTC")


def seconds(s: float) -> str:
    """A duration in seconds, with hours and minutes spelled out when it is longer than a minute."""
    s = max(0.0, s)
    text = f"{s:.0f} s" if abs(s - round(s)) < 0.05 else f"{s:.1f} s"
    if s < 60:
        return text
    whole = int(round(s))
    h, rest = divmod(whole, 3600)
    m, sec = divmod(rest, 60)
    parts = ([f"{h} h"] if h else []) + ([f"{m} min"] if m or h else []) + [f"{sec} s"]
    return f"{text} ({' '.join(parts)})"


@dataclass
class _Incident:
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


@dataclass(frozen=True)
class _Section:
    at: float
    order: int
    lines: tuple[str, ...]


def render_markdown(
    run: RunRecord, attempts: list[AttemptRecord], events: list[Event], now: float | None = None
) -> str:
    """The run's chronicle as Markdown; deterministic for the same records.

    ``now`` ends the goodput accounting of a run still going; by default the last record's time."""
    by_seq = {a.seq: a for a in attempts}
    g = goodput(run.name, attempts, events, now=last_record(attempts, events) if now is None else now)
    lost = {i.attempt: i for i in g.interruptions}
    ordered = sorted(events, key=_order)
    timeline: list[Event] = []
    blocks: list[_Incident | Event] = []  # incidents, terminal events and notes, in the order they began
    current: _Incident | None = None
    first_start_seen = False

    for e in ordered:
        if e.kind is EventKind.NOTE or e.kind in _TERMINAL:
            if e.kind in _TERMINAL and current is not None:
                current.closed = True
                current = None
            blocks.append(e)
        elif e.kind is EventKind.FAULT:
            joins = (
                current is not None
                and not current.has(EventKind.RESTARTED)
                and not current.has(EventKind.REQUEUED)
                and current.attempt == e.attempt
            )
            if not joins:
                current = _Incident()
                blocks.append(current)
            assert current is not None
            current.events.append(e)
        elif e.kind is EventKind.STARTED:
            if current is not None and e.attempt != current.attempt:
                current.events.append(e)
                current.closed = True
                current = None
            elif not first_start_seen or current is None:
                timeline.append(e)
            else:
                current.events.append(e)
            first_start_seen = True
        elif e.kind in _FOLLOW_UP and current is not None:
            current.events.append(e)
        elif e.kind in _OPENS:
            current = _Incident([e])
            blocks.append(current)
        else:
            timeline.append(e)

    out = _title(run, attempts)
    out += ["## Timeline", ""]
    out += _timeline_lines(timeline) or ["- (no routine events)"]
    out.append("")
    if blocks:
        out += ["## Incidents and notes", ""]
    for block in blocks:
        if isinstance(block, _Incident):
            out += _incident(run, block, by_seq, lost.get(block.attempt))
        elif block.kind is EventKind.NOTE:
            out += _note(run, block)
        else:
            out += _terminal(run, block, attempts)
    if attempts:
        out += markdown_lines(g, g.advice(measured_save_s(events)), gpus_of(run.spec))
    out += _attempt_table(attempts)
    return "\n".join(out).rstrip("\n") + "\n"


def _timeline_lines(timeline: list[Event]) -> list[str]:
    """One line per routine event; a run of consecutive verified checkpoints is one line (a long
    run verifies hundreds: the reader wants to know they were, not each one)."""
    out: list[str] = []
    i = 0
    while i < len(timeline):
        e = timeline[i]
        j = i
        while (
            j + 1 < len(timeline)
            and e.kind is EventKind.CHECKPOINT_VERIFIED
            and timeline[j + 1].kind is EventKind.CHECKPOINT_VERIFIED
        ):
            j += 1
        if j - i >= 2:
            steps = [int(x.evidence["step"]) for x in timeline[i : j + 1] if isinstance(x.evidence.get("step"), int)]
            span = f"steps {min(steps)} to {max(steps)}" if steps else "checkpoints"
            out.append(
                f"- {stamp(e.at)} to {stamp(timeline[j].at)} [{e.actor}]: {j - i + 1} checkpoint "
                f"verifications passed ({span})"
            )
        else:
            out += [f"- {stamp(x.at)} [{x.actor}]: {_strip_label(x)}" for x in timeline[i : j + 1]]
        i = j + 1
    return out


def last_record(attempts: list[AttemptRecord], events: list[Event]) -> float:
    """The time of the newest record: the chronicle's "now", so that it reads no clock."""
    times = [e.at for e in events] + [
        t for a in attempts for t in (a.submitted_at, a.started_at, a.ended_at) if t is not None
    ]
    return max(times, default=0.0)


def _order(e: Event) -> tuple[float, int, int, str, str]:
    attempt = -1 if e.attempt is None else e.attempt
    return (e.at, attempt, _CAUSAL.get(e.kind, len(_CAUSAL)), e.key, e.message)


# ---------------------------------------------------------------- parts


def _title(run: RunRecord, attempts: list[AttemptRecord]) -> list[str]:
    spec = run.spec
    excluded = ", ".join(sorted(run.excluded)) or "none"
    lines = [
        f"# Logbook of run {run.name}",
        "",
        f"Written by slurm-supervisor from the run's logbook; all times UTC. "
        f"{spec.nodes} nodes on partition {spec.partition}; state **{run.state.value}**; "
        f"{len(attempts)} attempt{'s' if len(attempts) != 1 else ''}; "
        f"restarts spent {run.restarts_spent} of {spec.max_restarts}; nodes kept out: {excluded}.",
        "",
    ]
    if run.end_reason:
        lines[-1:-1] = [f"Ended: {run.end_reason}."]
    return lines


def _incident(
    run: RunRecord, inc: _Incident, by_seq: Mapping[int, AttemptRecord], lost: Interruption | None
) -> list[str]:
    faults = inc.of(EventKind.FAULT)
    cause = _cause(inc)
    if inc.has(EventKind.RESTARTED) or inc.has(EventKind.REQUEUED):
        what = f"restart after {cause}"
    elif inc.closed:
        what = f"{cause}; not restarted"
    else:
        what = f"{cause}; recovery under way"
    actor = (faults[0] if faults else inc.events[0]).actor
    lines = [f"### {heading_stamp(inc.at)} [{actor}]: Run {run.name}{_attempt_words(inc.attempt)} — {what}", ""]
    for f in faults:
        lines.append(f"- **Evidence**{_subject(f)}: {_evidence(f)}")
    decisions = [
        _decision(e) for e in inc.events if e.kind not in (EventKind.FAULT, EventKind.WARNING, EventKind.STARTED)
    ]
    if len(decisions) == 1:
        lines.append(f"- **Decision**: {decisions[0]}")
    elif decisions:
        lines += ["- **Decision**:", *(f"  - {d}" for d in decisions)]
    lines += [f"- **Warning**: {_strip_label(w)}" for w in inc.of(EventKind.WARNING)]
    lines.append(f"- **Cost**: {_cost(run, inc, by_seq)}")
    if lost is not None:
        lines.append(f"- **Lost work**: {_lost_work(run, lost)}")
    lines.append("")
    return lines


def _note(run: RunRecord, e: Event) -> list[str]:
    head = f"### {heading_stamp(e.at)} [{e.actor}]: Run {run.name}{_attempt_words(e.attempt)} — note"
    body = [f"> {line}" if line else ">" for line in e.message.splitlines()] or [">"]
    return [head, "", *body, "", f"— {e.actor}, {stamp(e.at)}", ""]


def _terminal(run: RunRecord, e: Event, attempts: list[AttemptRecord]) -> list[str]:
    head = f"### {heading_stamp(e.at)} [{e.actor}]: Run {run.name}{_attempt_words(e.attempt)} — {_TERMINAL[e.kind]}"
    lines = [head, "", f"- **Outcome**: {_strip_label(e)}"]
    if e.evidence:
        lines.append(f"- **Evidence**: {_pairs(e.evidence)}")
    started = [a.started_at for a in attempts if a.started_at is not None]
    span = f"; {seconds(e.at - min(started))} since the first attempt started" if started else ""
    lines.append(
        f"- **Totals**: {len(attempts)} attempt{'s' if len(attempts) != 1 else ''}; restarts spent "
        f"{run.restarts_spent} of {run.spec.max_restarts}{span}."
    )
    return [*lines, ""]


def _attempt_table(attempts: list[AttemptRecord]) -> list[str]:
    if not attempts:
        return []
    lines = [
        "## Attempts",
        "",
        "| attempt | job | restart | nodes | started | ended | ran | end state |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for a in sorted(attempts, key=lambda x: x.seq):
        ran = seconds(a.ended_at - a.started_at) if a.started_at is not None and a.ended_at is not None else "-"
        end = a.end_state or ("running" if a.started_at is not None and a.ended_at is None else "-")
        if a.end_state and a.end_reason and a.end_reason != a.end_state:
            end = f"{a.end_state} ({a.end_reason})"
        if a.exit_code is not None:
            end += f", exit {a.exit_code}"
        lines.append(
            f"| {a.seq} | {a.job_id} | {a.restart_count} | {len(a.nodes)} | "
            f"{stamp(a.started_at) if a.started_at is not None else '-'} | "
            f"{stamp(a.ended_at) if a.ended_at is not None else '-'} | {ran} | {end} |"
        )
    return [*lines, ""]


# ---------------------------------------------------------------- wording


def _attempt_words(attempt: int | None) -> str:
    return f" attempt {attempt}" if attempt is not None else ""


def _cause(inc: _Incident) -> str:
    faults = inc.of(EventKind.FAULT)
    nodes = sorted({str(f.evidence["node"]) for f in faults if f.evidence.get("node")})
    parts: list[str] = []
    if nodes:
        parts.append(f"node fault on {', '.join(nodes)}")
    for f in faults:
        ev = f.evidence
        if ev.get("node"):
            continue
        if "last_step" in ev or "silent_s" in ev or f.key.endswith(":hang"):
            step = ev.get("last_step")
            parts.append(f"hang at step {step}" if step is not None else "hang (no training progress)")
        elif ev.get("state"):
            code = ev.get("exit_code")
            parts.append(f"job ended {ev['state']}" + (f" with exit code {code}" if code else ""))
        else:
            parts.append(_strip_label(f))
    if not parts:
        first = inc.events[0]
        parts.append("Slurm requeue" if first.kind is EventKind.REQUEUED else _strip_label(first))
    return "; ".join(dict.fromkeys(parts))


def _subject(f: Event) -> str:
    if f.evidence.get("node"):
        return f" ({f.evidence['node']})"
    if "last_step" in f.evidence or "silent_s" in f.evidence:
        return " (hang)"
    return ""


def _evidence(f: Event) -> str:
    ev = dict(f.evidence)
    if ev.get("node"):
        observed = ev.pop("observed", None) or _strip_label(f)
        probe = ev.pop("probe", None)
        ev.pop("node")
        parts = [f"observed: {observed}"]
        if probe and probe != observed:
            parts.append(f"probe: {probe}")
        elif probe:
            parts[0] += " (the probe's finding)"
        if any(k in ev for k in ("slurm_state", "slurm_flags", "slurm_reason")):
            flags = ev.pop("slurm_flags", None) or []
            reason = ev.pop("slurm_reason", None)
            parts.append(
                f"Slurm showed the node {ev.pop('slurm_state', None) or 'unknown'}, flags "
                f"{','.join(map(str, flags)) or 'none'}, reason {_quote(reason) if reason else 'none'}"
            )
        if ev:
            parts.append(_pairs(ev))
        return "; ".join(parts) + "."
    if "last_step" in ev or "silent_s" in ev:
        parts = [str(ev.pop("reason", None) or "no training progress")]
        numbers = []
        if "last_step" in ev:
            numbers.append(f"last step {ev.pop('last_step')}")
        if "silent_s" in ev:
            numbers.append(f"silent for {seconds(float(ev.pop('silent_s')))}")
        if ev.get("threshold_s") is not None:
            numbers.append(f"threshold {seconds(float(ev.pop('threshold_s')))}")
        if ev.get("step_interval_s") is not None:
            numbers.append(f"usual step interval {seconds(float(ev.pop('step_interval_s')))}")
        parts.append(", ".join(numbers))
        if ev.get("nodes"):
            parts.append(f"on {_nodes(ev.pop('nodes'))}")
        if ev.get("log"):
            parts.append(
                f"log `{ev.pop('log')}`"
                + (f" ({ev.pop('records_read')} records read)" if ev.get("records_read") is not None else "")
            )
        last = ev.pop("last_lines", None) or []
        ev.pop("records_read", None)
        text = "; ".join(p for p in parts if p)
        if last:
            text += "; last line: `" + str(last[-1]).replace("`", "'") + "`"
        if ev:
            text += "; " + _pairs(ev)
        return text + "."
    return (_strip_label(f) + (f"; {_pairs(ev)}" if ev else "")) + "."


def _decision(e: Event) -> str:
    ev = e.evidence
    if e.kind is EventKind.RESTARTED and "exclude" in ev:
        text = f"restarted as attempt {e.attempt} (job {e.job_id})"
        excl = ev.get("exclude") or []
        text += f", excluding {_nodes(excl)}" if excl else ", excluding nothing"
        if ev.get("reason"):
            text += f" ({ev['reason']})"
        return text
    msg = _strip_label(e)
    reason = ev.get("reason")
    if e.kind is EventKind.NODE_DRAINED and isinstance(reason, str) and msg.endswith(f": {reason}"):
        return f"{msg[: -len(reason) - 2]}, reason {_quote(reason)}"
    return msg


def _cost(run: RunRecord, inc: _Incident, by_seq: Mapping[int, AttemptRecord]) -> str:
    parts: list[str] = []
    started = [e for e in inc.of(EventKind.STARTED) if e.attempt != inc.attempt]
    if started:
        s = started[-1]
        parts.append(
            f"{seconds(s.at - inc.at)} from the fault ({stamp(inc.at)}) to attempt {s.attempt} running ({stamp(s.at)})"
        )
    else:
        parts.append(f"no new attempt running yet (fault at {stamp(inc.at)})")
    a = by_seq.get(inc.attempt) if inc.attempt is not None else None
    if a is not None and a.started_at is not None:
        end = a.ended_at if a.ended_at is not None else inc.at
        how = f", ended {a.end_state}" if a.end_state else ""
        parts.append(
            f"attempt {a.seq} (job {a.job_id}) had run {seconds(end - a.started_at)}, "
            f"from {stamp(a.started_at)} to {stamp(end)}{how}"
        )
    spent = [e.evidence.get("restarts_spent") for e in inc.of(EventKind.RESTARTED)]
    spent_n = next((int(x) for x in reversed(spent) if isinstance(x, int)), None)
    if spent_n is not None:
        parts.append(f"restarts spent {spent_n} of {run.spec.max_restarts}")
    elif inc.has(EventKind.REQUEUED):
        parts.append(f"one restart spent of {run.spec.max_restarts}")
    return "; ".join(parts) + "."


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
    cost = f"; {down * gpus / 3600:,.1f} GPU-hours" if gpus and down else ""
    return f"{work}{cost}; cause: {cause}, {where} — {i.cause.basis}."


def _strip_label(e: Event) -> str:
    """The message without the ``attempt N (job J, restart R): `` prefix the heading already says."""
    msg = e.message
    if msg.startswith("attempt ") and "): " in msg:
        head, _, rest = msg.partition("): ")
        if "(job " in head:
            return rest
    return msg


def _nodes(nodes: Iterable[Any]) -> str:
    return ", ".join(sorted(str(n) for n in nodes))


def _quote(s: Any) -> str:
    return '"' + str(s).replace('"', "'") + '"'


def _pairs(ev: Mapping[str, Any]) -> str:
    out = []
    for k in sorted(ev):
        v = ev[k]
        if isinstance(v, list | tuple):
            v = ", ".join(map(str, v)) or "none"
        elif isinstance(v, Mapping):
            v = ", ".join(f"{a}: {b}" for a, b in sorted(v.items(), key=lambda p: str(p[0]))) or "none"
        out.append(f"{k} {v}")
    return ", ".join(out)
