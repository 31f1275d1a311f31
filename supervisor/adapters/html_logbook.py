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
import re
from collections.abc import Iterable, Sequence
from html import escape

from supervisor.adapters import html_svg as svg
from supervisor.domain.chronicle import last_record, render_markdown, stamp
from supervisor.domain.goodput import OPENERS, Goodput, goodput
from supervisor.domain.goodput_text import gpus_of, hours, percent
from supervisor.domain.records import AttemptRecord, Event, EventKind, RunRecord
from supervisor.ports import Store

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
) -> str:
    """The run's logbook as one HTML document; ``series`` adds the progress curves.

    ``now`` ends a live run's accounting (default: the newest record, so the same records give the
    same page)."""
    attempts, events = list(attempts), list(events)
    now = last_record(attempts, events) if now is None else max(now, last_record(attempts, events))
    g = goodput(run.name, attempts, events, now=now)
    points = list(series) if series is not None else series_from_events(events)
    starts = [a.submitted_at for a in attempts] + [e.at for e in events]
    scale = svg.Scale(min(starts, default=now), now)
    marks = _marks(events)
    body = [
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
        markdown_to_html(render_markdown(run, attempts, events, now=now), skip_title=True),
        "</section>",
        _event_table(events),
    ]
    title = f"Logbook of run {run.name}"
    return (
        f'<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        f'<meta http-equiv="Content-Security-Policy" content="{CSP}">'
        f'<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>{escape(title)}</title><style>{_CSS}</style></head>\n<body><main>"
        + "\n".join(body)
        + f"</main><script>{_JS}</script></body></html>\n"
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
    page = render_html(record, store.attempts(run), store.events(run), series, now=now)
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
        ("restarts", f"{run.restarts_spent} / {run.spec.max_restarts}"),
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
    bars = []
    for a in attempts:
        start = a.started_at if a.started_at is not None else now
        bars.append(
            svg.Bar(
                a.submitted_at,
                start,
                0,
                "queue",
                f"attempt {a.seq} (job {a.job_id}) queued {stamp(a.submitted_at)} → {stamp(start)}",
            )
        )
        if a.started_at is None:
            continue
        end = a.ended_at if a.ended_at is not None else now
        state = a.end_state or "running"
        css = (
            "fault"
            if a.seq in interrupted or state in _FAULT_STATES
            else "ok"
            if state in ("running", "COMPLETED")
            else "other"
        )
        bars.append(
            svg.Bar(
                a.started_at,
                end,
                1,
                f"run {css}",
                f"attempt {a.seq} (job {a.job_id}, restart {a.restart_count}) on {len(a.nodes)} nodes: "
                f"{stamp(a.started_at)} → {stamp(end)}, {state}",
                f"#{a.seq}",
            )
        )
    return bars


def _marks(events: Sequence[Event]) -> list[svg.Mark]:
    marks = []
    for e in events:
        kind = e.kind.value
        css = (
            "rollback"
            if kind in ROLLBACK_KINDS
            else "fault"
            if kind in OPENERS
            else "spike"
            if kind in SPIKE_KINDS
            else "rollback"
            if kind in ROLLBACK_KINDS
            else "note"
            if e.kind is EventKind.NOTE
            else "end"
            if e.kind in _END_KINDS
            else None
        )
        if css is not None:
            marks.append(svg.Mark(e.at, css, f"{stamp(e.at)} [{e.actor}] {kind}: {e.message}"))
    return marks


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


# ---------------------------------------------------------------- the chronicle's Markdown, as HTML


_INLINE = re.compile(r"`([^`]+)`|\*\*([^*]+)\*\*")


def _inline(text: str) -> str:
    out, pos = [], 0
    for m in _INLINE.finditer(text):
        out.append(escape(text[pos : m.start()]))
        out.append(f"<code>{escape(m.group(1))}</code>" if m.group(1) is not None else f"<b>{escape(m.group(2))}</b>")
        pos = m.end()
    return "".join(out) + escape(text[pos:])


def markdown_to_html(md: str, *, skip_title: bool = False) -> str:
    """The subset of Markdown the chronicle writes (headings, lists two deep, quotes, tables, text)."""
    out: list[str] = []
    open_list = 0  # nesting depth of <ul>
    table: list[list[str]] = []

    def close(depth: int = 0) -> None:
        nonlocal open_list
        while open_list > depth:
            out.append("</li></ul>")
            open_list -= 1

    def flush_table() -> None:
        if table:
            head, *rest = table
            out.append(
                "<table><thead><tr>"
                + "".join(f"<th>{_inline(c)}</th>" for c in head)
                + "</tr></thead><tbody>"
                + "".join("<tr>" + "".join(f"<td>{_inline(c)}</td>" for c in r) + "</tr>" for r in rest)
                + "</tbody></table>"
            )
            table.clear()

    for line in md.splitlines():
        if line.startswith("|"):
            close()
            cells = [c.strip() for c in line.strip().strip("|").split("|")]
            if not all(set(c) <= {"-", ":"} for c in cells):
                table.append(cells)
            continue
        flush_table()
        m = re.match(r"^(#{1,6}) (.*)$", line)
        if m:
            close()
            level = len(m.group(1))
            if not (skip_title and level == 1):
                ident = re.sub(r"[^a-z0-9]+", "-", m.group(2).lower()).strip("-")[:80]
                out.append(f'<h{level + 1} id="{ident}">{_inline(m.group(2))}</h{level + 1}>')
            continue
        m = re.match(r"^( *)- (.*)$", line)
        if m:
            depth = len(m.group(1)) // 2 + 1
            if depth > open_list:
                out.append("<ul><li>" * (depth - open_list))
                open_list = depth
            else:
                close(depth)
                out.append("</li><li>")
            out.append(_inline(m.group(2)))
            continue
        close()
        if line.startswith(">"):
            out.append(f"<blockquote>{_inline(line[1:].strip())}</blockquote>")
        elif line.strip():
            out.append(f"<p>{_inline(line)}</p>")
    flush_table()
    close()
    return "".join(out).replace("</blockquote><blockquote>", "<br>")


_CSS = """
:root{--fg:#1d2125;--muted:#5f6b76;--bg:#fff;--line:#d0d7de;--ok:#2f9e44;--fault:#c92a2a;--queue:#ffd43b;
--spike:#f08c00;--rollback:#7048e8;--note:#1c7ed6;--card:#f6f8fa}
*{box-sizing:border-box}body{margin:0;font:14px/1.45 system-ui,-apple-system,"Segoe UI",sans-serif;color:var(--fg);
background:var(--bg)}main{max-width:1100px;margin:0 auto;padding:18px 22px 60px}
h1{font-size:24px;margin:4px 0}h2{font-size:18px;margin:26px 0 8px;border-bottom:1px solid var(--line);
padding-bottom:4px}h3{font-size:15px;margin:18px 0 4px}h4{font-size:14px;margin:16px 0 4px}
.muted{color:var(--muted)}.caveat{background:#fff9db;border-left:3px solid var(--queue);padding:4px 8px;margin:6px 0}
.chips{display:flex;flex-wrap:wrap;gap:8px;margin:10px 0}.chip{background:var(--card);border:1px solid var(--line);
border-radius:6px;padding:6px 10px;min-width:92px}.chip span{display:block;font-size:11px;color:var(--muted);
text-transform:uppercase;letter-spacing:.04em}.chip b{font-size:17px}
svg.chart{width:100%;height:auto;display:block;margin:6px 0}svg text{font-size:11px;fill:var(--muted)}
svg .lane{fill:var(--fg);font-size:12px}svg .axis{stroke:var(--muted)}svg .grid{stroke:var(--line);stroke-dasharray:2 3}
.bar rect{stroke:none}.bar.queue rect{fill:var(--queue);opacity:.7}.bar.run.ok rect{fill:var(--ok)}
.bar.run.fault rect{fill:#e03131;opacity:.85}.bar.run.other rect{fill:#868e96}.bar text{fill:#fff;font-size:11px}
.mark line{stroke-width:1.5}.mark.fault line{stroke:var(--fault)}.mark.fault circle{fill:var(--fault)}
.mark.spike line{stroke:var(--spike);stroke-dasharray:4 2}.mark.spike circle{fill:var(--spike)}
.mark.rollback line{stroke:var(--rollback)}.mark.rollback circle{fill:var(--rollback)}
.mark.note line{stroke:var(--note);stroke-dasharray:1 3}.mark.note circle{fill:var(--note)}
.mark.end line{stroke:var(--fg)}.mark.end circle{fill:var(--fg)}
polyline.line{fill:none;stroke-width:1.4}polyline.loss{stroke:#1c7ed6}polyline.throughput{stroke:#2f9e44}
.legend{font-size:12px;color:var(--muted)}.key{display:inline-block;width:12px;height:12px;margin:0 4px 0 12px;
vertical-align:-2px;border-radius:2px}.key.queue{background:var(--queue)}.key.run.ok{background:var(--ok)}
.key.run.fault{background:#e03131}.key.fault{background:var(--fault);width:3px}.key.spike{background:var(--spike);
width:3px}.key.rollback{background:var(--rollback);width:3px}.key.note{background:var(--note);width:3px}
table{border-collapse:collapse;width:100%;margin:8px 0;font-size:13px}th,td{border-bottom:1px solid var(--line);
padding:4px 6px;text-align:left;vertical-align:top}th{background:var(--card)}td.t{white-space:nowrap}
code{background:var(--card);padding:0 3px;border-radius:3px;font-size:12px}blockquote{margin:6px 0;padding:4px 10px;
border-left:3px solid var(--note);background:var(--card)}#chronicle li{margin:2px 0}
.k{font-family:ui-monospace,monospace;font-size:12px;padding:0 4px;border-radius:3px;background:var(--card)}
.k.fault,.k.gave_up,.k.mass_fault{background:#ffe3e3}.k.note{background:#e7f5ff}.k.started,.k.completed{background:#ebfbee}
details summary{cursor:pointer;color:var(--muted);font-size:12px}pre{white-space:pre-wrap;font-size:12px;margin:4px 0}
.filters input{padding:4px 6px;width:260px}.filters select{padding:4px}tr[hidden]{display:none}
"""

_JS = """
(function () {
  var q = document.getElementById("q"), kind = document.getElementById("kind");
  var shown = document.getElementById("shown");
  if (!q || !kind || !shown) { return; }
  var rows = Array.prototype.slice.call(document.querySelectorAll("#events tbody tr"));
  var text = rows.map(function (r) { return r.textContent.toLowerCase(); });
  function apply() {
    var t = q.value.toLowerCase(), k = kind.value, n = 0;
    rows.forEach(function (r, i) {
      var ok = (!k || r.getAttribute("data-kind") === k) && (!t || text[i].indexOf(t) >= 0);
      r.hidden = !ok;
      if (ok) { n += 1; }
    });
    shown.textContent = String(n);
  }
  q.addEventListener("input", apply);
  kind.addEventListener("change", apply);
  document.documentElement.setAttribute("data-ready", "1");
})();
"""
