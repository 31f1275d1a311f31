"""``slurm-supervisor status``: every run on a line (state and since when, ETTR, restarts, what
pages), or one run on one screen (``status RUN``: also its job, last incident and checkpoints).

What pages now is what the pager (adapters.paging.webhook) would hold open after reading the run's whole
logbook: the same rules the daemon's webhook follows, so the terminal and the pager agree."""

from __future__ import annotations

from collections.abc import Sequence

from supervisor.adapters.paging.webhook import Pager
from supervisor.cli.views.render import ts
from supervisor.domain.lease import Lease
from supervisor.domain.progress.series import ProgressPoint
from supervisor.domain.records import AttemptRecord, Event, RunRecord
from supervisor.domain.text_safety import printable
from supervisor.report.figures import duration, restarts
from supervisor.report.goodput import percent
from supervisor.report.summary import RunSummary, summarize


def open_pages(events: Sequence[Event]) -> list[str]:
    """What pages now for these events: each open alert's summary, oldest first."""
    pager = Pager()
    pager.feed(events)
    return [f"{a.kind}: {a.summary}" for a in sorted(pager.open.values(), key=lambda a: a.at)]


def run_summary(
    run: RunRecord,
    attempts: Sequence[AttemptRecord],
    events: Sequence[Event],
    now: float,
    series: Sequence[ProgressPoint] | None = None,
) -> RunSummary:
    return summarize(run, attempts, events, now, open_pages(events), series)


def leader_line(lease: Lease | None) -> str | None:
    """Who leads the instance's daemons (a shared store), since when, and how long its lease holds;
    None without a lease (SQLite: one daemon, nothing to say)."""
    if lease is None:
        return None
    who = f"leader: {printable(lease.holder, 200)} at {printable(lease.address, 300)}, epoch {lease.epoch}"
    if lease.expires_in_s <= 0:
        return f"{who}, since {ts(lease.since)}; its lease ended {lease.expires_in_s * -1:.0f} s ago: nobody leads"
    return f"{who}, since {ts(lease.since)}; its lease holds {lease.expires_in_s:.0f} s more"


def table_lines(summaries: Sequence[RunSummary]) -> list[str]:
    """One line per run; ``status RUN`` shows one of them whole."""
    rows = [("RUN", "STATE", "SINCE", "ETTR", "JOB", "RESTARTS", "PAGING", "EXCLUDED")]
    for s in summaries:
        r, a = s.run, s.run.attempt
        rows.append(
            (
                printable(r.name),
                r.state.value,
                ts(s.since),
                _ettr(s),
                str(a.job_id) if a else "-",
                restarts(r.restarts_spent, r.spec.max_restarts),
                f"{len(s.paging)} open" if s.paging else "-",
                printable(",".join(sorted(r.excluded))) or "-",
            )
        )
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return ["  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() for row in rows]


def summary_lines(s: RunSummary) -> list[str]:
    """One run on one screen: label, value."""
    r, a = s.run, s.run.attempt
    rows = [
        ("state", f"{r.state.value} since {ts(s.since)} ({duration(s.now - s.since)})"),
        ("ETTR", _ettr(s) + f" ({s.incidents} incident{'s' if s.incidents != 1 else ''})"),
        ("job", f"{a.job_id} (attempt {a.seq}) on {len(a.nodes)} nodes" if a else "none yet"),
        ("restarts", restarts(r.restarts_spent, r.spec.max_restarts)),
        ("last incident", _incident(s)),
        ("last checkpoint", _last_checkpoint(s)),
        ("next checkpoint", _next_checkpoint(s)),
        ("paging", "; ".join(s.paging) or "nothing"),
        ("nodes kept out", ", ".join(sorted(r.excluded)) or "none"),
    ]
    if r.end_reason:
        rows.insert(1, ("ended", r.end_reason))
    width = max(len(k) for k, _ in rows)
    return [f"run {printable(r.name)}", *(f"  {k.ljust(width)}  {printable(v)}" for k, v in rows)]


def _ettr(s: RunSummary) -> str:
    return percent(s.ettr) + (" (upper bound)" if s.ettr_upper_bound and s.ettr is not None else "")


def _incident(s: RunSummary) -> str:
    i = s.last_incident
    if i is None:
        return "none"
    where = f", attempt {i.attempt}" if i.attempt is not None else ""
    return f"{ts(i.at)}{where}: {i.title}; {i.outcome} ({duration(s.now - i.at)} ago)"


def _last_checkpoint(s: RunSummary) -> str:
    e = s.last_checkpoint
    if e is None:
        return "none verified yet"
    step = e.evidence.get("step")
    what = f"step {step}" if isinstance(step, int) else "one"
    return f"{what} verified {ts(e.at)} ({duration(s.now - e.at)} ago)"


def _next_checkpoint(s: RunSummary) -> str:
    n = s.next_checkpoint
    if n is None:
        return "-" if s.run.state.terminal else "unknown (no interval declared, too few verified to measure one)"
    late = s.now - n.at
    when = f"overdue by {duration(late)}" if late > 0 else f"in {duration(-late)}"
    return f"by {ts(n.at)} ({when}; every {duration(n.interval_s)}, from the {n.basis})"
