"""The HTML logbook: one self-contained page per run (inline CSS, JS and SVG; nothing fetched).

``render_html`` builds it from the records; ``slurm-supervisor logbook RUN --format html -o FILE``
exports it and the daemon serves it read-only through ``logbook_page`` (a pure handler: status,
headers, body). The page shows the run at a glance — ETTR and the interruption rate — then a
timeline of attempts and interruptions, loss and throughput curves with spikes and rollbacks marked
(when progress data is given or the events carry it), lost time by cause, the OPT-style chronicle of
incidents, and every event with a filter.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from html import escape

from supervisor.adapters.logbook_html import svg
from supervisor.adapters.logbook_html.assets import CSS, JS
from supervisor.adapters.logbook_html.markdown import markdown_to_html
from supervisor.domain.goodput.account import OPENERS, Goodput, goodput
from supervisor.domain.progress.series import ProgressPoint
from supervisor.domain.records import AttemptRecord, Event, EventKind, RunRecord
from supervisor.ports import Store
from supervisor.report.chronicle import last_record, render_markdown
from supervisor.report.figures import restarts
from supervisor.report.goodput import gpus_of, hours, percent
from supervisor.report.text import stamp

Point = tuple[float, int | None, float | None, float | None]  # (time, step, loss, tokens_per_s)

CSP = (
    "default-src 'none'; style-src 'unsafe-inline'; script-src 'unsafe-inline'; img-src data:; "
    "base-uri 'none'; form-action 'none'"
)
SPIKE_KINDS = frozenset({"spike", "loss_spike"})
ROLLBACK_KINDS = frozenset({"rollback"})
_END_KINDS = frozenset({EventKind.COMPLETED, EventKind.GAVE_UP, EventKind.CANCELLED})
_FAULT_STATES = ("NODE_FAIL", "FAILED", "TIMEOUT", "OUT_OF_MEMORY", "BOOT_FAIL", "REQUEUED", "VANISHED")


def render_html(
    run: RunRecord,
    attempts: Sequence[AttemptRecord],
    events: Sequence[Event],
    series: Sequence[Point] | None = None,
    *,
    now: float | None = None,
    progress: Sequence[ProgressPoint] | None = None,
) -> str:
    """The run's logbook as one HTML document; ``series`` adds the progress curves.

    ``progress``: the series the daemon kept (the store's): the curves, when ``series`` is not
    given, and the goodput account from the steps. ``now`` ends a live run's accounting (default:
    the newest record, so the same records give the same page)."""
    attempts, events = list(attempts), list(events)
    now = last_record(attempts, events) if now is None else max(now, last_record(attempts, events))
    if series is not None:
        points = list(series)
    else:
        points = svg.page_points(progress) if progress else series_from_events(events)
    return _page(f"Logbook of run {run.name}", _sections(run, attempts, events, points, now, progress))


def _sections(
    run: RunRecord,
    attempts: list[AttemptRecord],
    events: list[Event],
    points: Sequence[Point],
    now: float,
    progress: Sequence[ProgressPoint] | None,
) -> list[str]:
    """Header, timeline, curves, lost time by cause, chronicle and event table, in that order."""
    g = goodput(run.name, attempts, events, now=now, series=progress)
    starts = [a.submitted_at for a in attempts] + [e.at for e in events]
    scale = svg.Scale(min(starts, default=now), now)
    marks = _marks(events)
    return [
        _header(run, g, now),
        "<section><h2>Timeline</h2>",
        svg.timeline(scale, _bars(attempts, now, {i.attempt for i in g.interruptions}), marks, ("queue", "running")),
        _legend(),
        "</section>",
        _progress(scale, points, [m for m in marks if m.kind in ("spike", "rollback")]),
        "<section><h2>Lost time by cause</h2>",
        svg.cause_bars(g.by_cause, _counts(g)) if g.by_cause else "<p class=muted>No time lost.</p>",
        "</section>",
        '<section id="chronicle"><h2>Chronicle</h2>',
        markdown_to_html(bounded(render_markdown(run, attempts, events, now=now, series=progress)), skip_title=True),
        "</section>",
        _event_table(events),
    ]


PAGE_ENTRIES = 500  # incidents and notes the page's chronicle shows (the newest): the Markdown has all


def bounded(chronicle: str, keep: int = PAGE_ENTRIES) -> str:
    """The chronicle with only its newest ``keep`` incidents and notes (``### `` blocks): a run with
    20,000 notes made the page's Markdown rendering take 8 s and 70 MB more; the event table
    below still lists every event, and ``logbook RUN --format markdown`` has the whole text."""
    lines = chronicle.split("\n")
    starts = [i for i, line in enumerate(lines) if line.startswith("### ")]
    if len(starts) <= keep:
        return chronicle
    first, cut = starts[0], starts[len(starts) - keep]
    note = f"*{len(starts) - keep:,} earlier entries are left out here: `logbook RUN --format markdown` has them all.*"
    return "\n".join([*lines[:first], note, "", *lines[cut:]])


def _page(title: str, body: list[str]) -> str:
    return (
        f'<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        f'<meta http-equiv="Content-Security-Policy" content="{CSP}">'
        f'<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>{escape(title)}</title><style>{CSS}</style></head>\n<body><main>"
        + "\n".join(body)
        + f"</main><script>{JS}</script></body></html>\n"
    )


def series_from_events(events: Iterable[Event]) -> list[Point]:
    """Progress points carried by events (evidence ``step`` with ``loss`` and/or ``tokens_per_s``)."""
    out: list[Point] = []
    for e in events:
        ev = e.evidence
        loss, tps = _num(ev.get("loss")), _num(ev.get("tokens_per_s"))
        if loss is None and tps is None:
            continue
        step = ev.get("step")
        out.append((e.at, int(step) if isinstance(step, int) else None, loss, tps))
    return out


def logbook_page(
    store: Store, run: str, *, now: float | None = None, series: Sequence[Point] | None = None
) -> tuple[int, list[tuple[str, str]], bytes]:
    """A read-only HTTP answer for the daemon: (status, headers, body)."""
    record = store.get_run(run)
    if record is None:
        text = f"unknown run {run!r}; `slurm-supervisor status` lists the runs\n"
        return 404, [("Content-Type", "text/plain; charset=utf-8"), ("Cache-Control", "no-store")], text.encode()
    page = render_html(record, store.attempts(run), store.events(run), series, now=now, progress=store.progress(run))
    headers = [
        ("Content-Type", "text/html; charset=utf-8"),
        ("Cache-Control", "no-store"),
        ("Content-Security-Policy", CSP),
        ("X-Content-Type-Options", "nosniff"),
        ("Referrer-Policy", "no-referrer"),
    ]
    return 200, headers, page.encode()


def _num(v: object) -> float | None:
    return float(v) if isinstance(v, int | float) and not isinstance(v, bool) else None


# ---------------------------------------------------------------- parts


def _header(run: RunRecord, g: Goodput, now: float) -> str:
    gpus = gpus_of(run.spec)
    chips = [
        ("state", run.state.value),
        ("ETTR", percent(g.ettr) + (" ≤" if g.unknown_lost_work else "")),
        ("interruptions", str(len(g.interruptions))),
        ("per day", "-" if g.interruptions_per_day is None else f"{g.interruptions_per_day:.2f}"),
        ("MTBI", "-" if g.mtbi_s is None else hours(g.mtbi_s)),
        ("restarts", restarts(run.restarts_spent, run.spec.max_restarts)),
        ("lost", hours(g.lost.total_s) + (f" · {g.lost.total_s * gpus / 3600:,.0f} GPU-h" if gpus else "")),
    ]
    html = [
        f"<header><h1>Logbook of run {escape(run.name)}</h1>",
        f'<p class="muted">{run.spec.nodes} nodes on partition {escape(run.spec.partition)}; nodes kept out: '
        f"{escape(', '.join(sorted(run.excluded)) or 'none')}; as of {stamp(now)}. All times UTC.</p>",
        '<div class="chips">',
    ]
    html += [f'<div class="chip"><span>{escape(k)}</span><b>{escape(v)}</b></div>' for k, v in chips]
    html.append("</div>")
    html += [f'<p class="caveat">{escape(n)}.</p>' for n in g.notes]
    return "".join(html) + "</header>"


def _bars(attempts: Sequence[AttemptRecord], now: float, interrupted: set[int | None]) -> list[svg.Bar]:
    """Each attempt's time in the queue and, once it started, its time running."""
    bars = []
    for a in attempts:
        bars.append(_queue_bar(a, now))
        if a.started_at is not None:
            bars.append(_run_bar(a, a.started_at, now, interrupted))
    return bars


def _queue_bar(a: AttemptRecord, now: float) -> svg.Bar:
    start = a.started_at if a.started_at is not None else now
    return svg.Bar(
        a.submitted_at,
        start,
        0,
        "queue",
        f"attempt {a.seq} (job {a.job_id}) queued {stamp(a.submitted_at)} → {stamp(start)}",
    )


def _run_bar(a: AttemptRecord, started_at: float, now: float, interrupted: set[int | None]) -> svg.Bar:
    end = a.ended_at if a.ended_at is not None else now
    state = a.end_state or "running"
    css = (
        "fault"
        if a.seq in interrupted or state in _FAULT_STATES
        else "ok"
        if state in ("running", "COMPLETED")
        else "other"
    )
    return svg.Bar(
        started_at,
        end,
        1,
        f"run {css}",
        f"attempt {a.seq} (job {a.job_id}, restart {a.restart_count}) on {len(a.nodes)} nodes: "
        f"{stamp(started_at)} → {stamp(end)}, {state}",
        f"#{a.seq}",
    )


def _marks(events: Sequence[Event]) -> list[svg.Mark]:
    marks = []
    for e in events:
        css = _mark_class(e)
        if css is not None:
            marks.append(svg.Mark(e.at, css, f"{stamp(e.at)} [{e.actor}] {e.kind.value}: {e.message}"))
    return marks


def _mark_class(e: Event) -> str | None:
    """How an event is marked on the timeline, if it is: rollback, fault, spike, note or end."""
    kind = e.kind.value
    if kind in ROLLBACK_KINDS:
        return "rollback"
    if kind in OPENERS:
        return "fault"
    if kind in SPIKE_KINDS:
        return "spike"
    if e.kind is EventKind.NOTE:
        return "note"
    if e.kind in _END_KINDS:
        return "end"
    return None


def _legend() -> str:
    items = [
        ("queue", "queued"),
        ("run ok", "running / completed"),
        ("run fault", "ended by a fault"),
        ("fault", "interruption"),
        ("spike", "loss spike"),
        ("rollback", "rollback"),
        ("note", "note"),
    ]
    return '<p class="legend">' + " ".join(f'<span class="key {c}"></span>{escape(t)}' for c, t in items) + "</p>"


def _progress(scale: svg.Scale, points: Sequence[Point], marks: Sequence[svg.Mark]) -> str:
    loss = [(t, v) for t, _, v, _ in points if v is not None]
    tps = [(t, v) for t, _, _, v in points if v is not None]
    if not loss and not tps:
        return (
            '<section><h2>Loss and throughput</h2><p class="muted">No progress data on record: the events carry '
            "no step/loss evidence and no series was given.</p></section>"
        )
    parts = ["<section><h2>Loss and throughput</h2>"]
    if loss:
        parts.append(svg.curve(scale, loss, marks, name="loss", unit="training loss", css="loss"))
    if tps:
        parts.append(svg.curve(scale, tps, marks, name="throughput", unit="tokens/s", css="throughput"))
    return "".join(parts) + "</section>"


def _counts(g: Goodput) -> dict[str, int]:
    counts: dict[str, int] = {}
    for i in g.interruptions:
        counts[i.cause.category] = counts.get(i.cause.category, 0) + 1
    return counts


def _event_table(events: Sequence[Event]) -> str:
    kinds = sorted({e.kind.value for e in events})
    rows = []
    for e in sorted(events, key=lambda x: x.at):
        evidence = (
            (
                f"<details><summary>evidence</summary><pre>{escape(json.dumps(e.evidence, sort_keys=True, default=str, indent=1))}"
                "</pre></details>"
            )
            if e.evidence
            else ""
        )
        rows.append(
            f'<tr data-kind="{escape(e.kind.value)}"><td class="t">{stamp(e.at)[:-4]}</td>'
            f'<td>{"" if e.attempt is None else e.attempt}</td><td><span class="k {escape(e.kind.value)}">'
            f"{escape(e.kind.value)}</span></td><td>{escape(e.actor)}</td>"
            f"<td>{escape(e.message)}{evidence}</td></tr>"
        )
    options = "".join(f'<option value="{escape(k)}">{escape(k)}</option>' for k in kinds)
    return (
        '<section><h2>Events</h2><p class="filters"><input id="q" type="search" placeholder="filter: node, '
        f'word…" aria-label="filter"> <select id="kind" aria-label="kind"><option value="">all kinds</option>'
        f'{options}</select> <span id="shown">{len(events)}</span> of {len(events)} shown</p>'
        '<table id="events"><thead><tr><th>time (UTC)</th><th>attempt</th><th>kind</th><th>who</th>'
        f"<th>what</th></tr></thead><tbody>{''.join(rows)}</tbody></table></section>"
    )
