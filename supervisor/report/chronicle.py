"""The Markdown chronicle: a run's logbook written the way the OPT-175B logbook was, by the machine.

One dated heading per incident (a fault and everything that followed it up to the next attempt
running), each with the evidence, the decision and its cost; routine events in a short timeline at
the top; the run's end and people's notes under headings of their own. One zone (UTC), no clock
read: the same records always give the same text.

Which events make an incident, and how one reads, is report.incidents; how a single
event's evidence reads is report.text.
"""

from __future__ import annotations

from collections.abc import Sequence

from supervisor.domain.goodput.account import Interruption, goodput, measured_save_s
from supervisor.domain.progress.series import ProgressPoint
from supervisor.domain.records import AttemptRecord, Event, EventKind, RunRecord
from supervisor.domain.text_safety import markdown
from supervisor.report.figures import count, restarts, step_span
from supervisor.report.goodput import gpus_of, markdown_lines
from supervisor.report.incidents import TERMINAL, Incident, group, incident_lines
from supervisor.report.text import (
    attempt_words,
    heading_stamp,
    pairs,
    safe_attempt,
    safe_event,
    seconds,
    stamp,
    strip_label,
)

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


def render_markdown(
    run: RunRecord,
    attempts: list[AttemptRecord],
    events: list[Event],
    now: float | None = None,
    series: Sequence[ProgressPoint] | None = None,
) -> str:
    """The run's chronicle as Markdown; deterministic for the same records.

    ``now`` ends the goodput accounting of a run still going; by default the last record's time.
    ``series``: the progress series the daemon kept, for the goodput account from the steps."""
    end = last_record(attempts, events) if now is None else now
    g = goodput(run.name, attempts, events, now=end, series=series)
    attempts = [safe_attempt(a) for a in attempts]  # what records quote is plain text from here on
    timeline, blocks = group([safe_event(e) for e in sorted(events, key=causal_order)])
    out = _title(run, attempts)
    out += ["## Timeline", ""]
    out += _timeline_lines(timeline) or ["- (no routine events)"]
    out.append("")
    out += _blocks(run, attempts, blocks, g.interruptions)
    if attempts:
        advice = g.advice(measured_save_s(events), saves_on_failure=run.spec.save_on_failure_s > 0)
        out += markdown_lines(g, advice, gpus_of(run.spec))
    out += _attempt_table(attempts)
    return "\n".join(out).rstrip("\n") + "\n"


def _blocks(
    run: RunRecord, attempts: list[AttemptRecord], blocks: list[Incident | Event], lost: tuple[Interruption, ...]
) -> list[str]:
    """The "Incidents and notes" section: each incident, note and terminal event in the order it began."""
    by_seq = {a.seq: a for a in attempts}
    lost_by_attempt = {i.attempt: i for i in lost}
    out = ["## Incidents and notes", ""] if blocks else []
    for block in blocks:
        if isinstance(block, Incident):
            out += incident_lines(run, block, by_seq, lost_by_attempt.get(block.attempt))
        elif block.kind is EventKind.NOTE:
            out += _note(run, block)
        else:
            out += _terminal(run, block, attempts)
    return out


def _timeline_lines(timeline: list[Event]) -> list[str]:
    """One line per routine event; a run of consecutive verified checkpoints is one line (a long
    run verifies hundreds: the reader wants to know they were, not each one)."""
    out: list[str] = []
    i = 0
    while i < len(timeline):
        j = _verified_run_end(timeline, i)
        if j - i >= 2:
            out.append(_verified_line(timeline[i : j + 1]))
        else:
            out += [f"- {stamp(x.at)} [{x.actor}]: {strip_label(x)}" for x in timeline[i : j + 1]]
        i = j + 1
    return out


def _verified_run_end(timeline: list[Event], i: int) -> int:
    """The index of the last of the consecutive checkpoint verifications that start at ``i`` (``i`` if none)."""
    j = i
    while (
        j + 1 < len(timeline)
        and timeline[i].kind is EventKind.CHECKPOINT_VERIFIED
        and timeline[j + 1].kind is EventKind.CHECKPOINT_VERIFIED
    ):
        j += 1
    return j


def _verified_line(run: list[Event]) -> str:
    first, last = run[0], run[-1]
    steps = [int(x.evidence["step"]) for x in run if isinstance(x.evidence.get("step"), int)]
    span = f" ({step_span(min(steps), max(steps))})" if steps else ""
    when = stamp(first.at) if first.at == last.at else f"{stamp(first.at)} to {stamp(last.at)}"
    return f"- {when} [{first.actor}]: {count(len(run))} checkpoint verifications passed{span}"


def last_record(attempts: list[AttemptRecord], events: list[Event]) -> float:
    """The time of the newest record: the chronicle's "now", so that it reads no clock."""
    times = [e.at for e in events] + [
        t for a in attempts for t in (a.submitted_at, a.started_at, a.ended_at) if t is not None
    ]
    return max(times, default=0.0)


def causal_order(e: Event) -> tuple[float, int, int, str, str]:
    """A sort key: by time, then attempt, then the causal order of kinds recorded in the same instant."""
    attempt = -1 if e.attempt is None else e.attempt
    return (e.at, attempt, _CAUSAL.get(e.kind, len(_CAUSAL)), e.key, e.message)


# ---------------------------------------------------------------- parts


def _title(run: RunRecord, attempts: list[AttemptRecord]) -> list[str]:
    spec = run.spec
    excluded = markdown(", ".join(sorted(run.excluded))) or "none"
    lines = [
        f"# Logbook of run {run.name}",
        "",
        f"Written by slurm-supervisor from the run's logbook; all times UTC. "
        f"{spec.nodes} nodes on partition {markdown(spec.partition)}; state **{run.state.value}**; "
        f"{len(attempts)} attempt{'s' if len(attempts) != 1 else ''}; "
        f"restarts spent {restarts(run.restarts_spent, spec.max_restarts)}; nodes kept out: {excluded}.",
        "",
    ]
    if run.end_reason:
        lines[-1:-1] = [f"Ended: {markdown(run.end_reason)}."]
    return lines


def _note(run: RunRecord, e: Event) -> list[str]:
    head = f"### {heading_stamp(e.at)} [{e.actor}]: Run {run.name}{attempt_words(e.attempt)} — note"
    body = [f"> {line}" if line else ">" for line in e.message.splitlines()] or [">"]
    return [head, "", *body, "", f"— {e.actor}, {stamp(e.at)}", ""]


def _terminal(run: RunRecord, e: Event, attempts: list[AttemptRecord]) -> list[str]:
    head = f"### {heading_stamp(e.at)} [{e.actor}]: Run {run.name}{attempt_words(e.attempt)} — {TERMINAL[e.kind]}"
    lines = [head, "", f"- **Outcome**: {strip_label(e)}"]
    if e.evidence:
        lines.append(f"- **Evidence**: {pairs(e.evidence)}")
    started = [a.started_at for a in attempts if a.started_at is not None]
    span = f"; {seconds(e.at - min(started))} since the first attempt started" if started else ""
    lines.append(
        f"- **Totals**: {len(attempts)} attempt{'s' if len(attempts) != 1 else ''}; restarts spent "
        f"{restarts(run.restarts_spent, run.spec.max_restarts)}{span}."
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
    lines += [_attempt_row(a) for a in sorted(attempts, key=lambda x: x.seq)]
    return [*lines, ""]


def _attempt_row(a: AttemptRecord) -> str:
    ran = seconds(a.ended_at - a.started_at) if a.started_at is not None and a.ended_at is not None else "-"
    end = a.end_state or ("running" if a.started_at is not None and a.ended_at is None else "-")
    if a.end_state and a.end_reason and a.end_reason != a.end_state:
        end = f"{a.end_state} ({a.end_reason})"
    if a.exit_code is not None:
        end += f", exit {a.exit_code}"
    return (
        f"| {a.seq} | {a.job_id} | {a.restart_count} | {len(a.nodes)} | "
        f"{stamp(a.started_at) if a.started_at is not None else '-'} | "
        f"{stamp(a.ended_at) if a.ended_at is not None else '-'} | {ran} | {end} |"
    )
