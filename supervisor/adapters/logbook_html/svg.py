"""Inline SVG charts for the HTML logbook: the attempts timeline, progress curves, lost time by cause.

Plain strings, no library and nothing fetched: the page must open on an offline login node. Every
mark carries a ``<title>`` (the browser's own tooltip), so the page needs no script to explain it.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from html import escape

from supervisor.domain.goodput.account import KINDS
from supervisor.domain.goodput.sweep import Lost
from supervisor.domain.progress.series import ProgressPoint
from supervisor.report.goodput import hours

WIDTH = 1000
LEFT = 70  # room for the y-axis labels
RIGHT = 16
COLORS = {"detection": "#d9480f", "restart": "#e8590c", "queue": "#fab005", "rework": "#c92a2a", "overhead": "#868e96"}
MAX_POINTS = 1500  # a curve is thinned to this many points (min and max of each bucket kept)


@dataclass(frozen=True)
class Mark:
    """A moment on the time axis: a fault, a spike, a rollback, a note."""

    at: float
    kind: str  # css class: fault, spike, rollback, note, end
    title: str


@dataclass(frozen=True)
class Bar:
    """A span on the timeline: an attempt running, or waiting in the queue."""

    start: float
    end: float
    lane: int
    css: str
    title: str
    label: str = ""


class Scale:
    def __init__(self, t0: float, t1: float, width: int = WIDTH) -> None:
        self.t0, self.t1 = t0, t1 if t1 > t0 else t0 + 1.0
        self.x0, self.x1 = LEFT, width - RIGHT

    def x(self, t: float) -> float:
        return self.x0 + (t - self.t0) / (self.t1 - self.t0) * (self.x1 - self.x0)

    def ticks(self, n: int = 6) -> list[tuple[float, str]]:
        span = self.t1 - self.t0
        step = _nice_step(
            span / n, (60, 300, 900, 1800, 3600, 3 * 3600, 6 * 3600, 12 * 3600, 86400, 2 * 86400, 7 * 86400)
        )
        first = math.ceil(self.t0 / step) * step
        fmt = "%H:%M" if span <= 2 * 86400 else "%m-%d %H:%M"
        out, t = [], first
        while t <= self.t1:
            out.append((self.x(t), datetime.fromtimestamp(t, UTC).strftime(fmt)))
            t += step
        return out


def _nice_step(raw: float, steps: Sequence[float]) -> float:
    return next((s for s in steps if s >= raw), steps[-1] * math.ceil(raw / steps[-1]))


def _axis(scale: Scale, y: float, top: float) -> list[str]:
    out = [f'<line class="axis" x1="{scale.x0}" y1="{y}" x2="{scale.x1}" y2="{y}"/>']
    for x, label in scale.ticks():
        out.append(f'<line class="grid" x1="{x:.1f}" y1="{top}" x2="{x:.1f}" y2="{y}"/>')
        out.append(f'<text class="tick" x="{x:.1f}" y="{y + 14}" text-anchor="middle">{label}</text>')
    return out


def _marks(scale: Scale, marks: Sequence[Mark], top: float, bottom: float) -> list[str]:
    out = []
    for m in marks:
        x = scale.x(m.at)
        out.append(
            f'<g class="mark {m.kind}"><title>{escape(m.title)}</title>'
            f'<line x1="{x:.1f}" y1="{top}" x2="{x:.1f}" y2="{bottom}"/>'
            f'<circle cx="{x:.1f}" cy="{top + 4}" r="4"/></g>'
        )
    return out


def timeline(scale: Scale, bars: Sequence[Bar], marks: Sequence[Mark], lanes: Sequence[str]) -> str:
    """Attempts (and their queue waits) as bars on lanes, interruptions and the rest as marks."""
    lane_h, top = 26, 10
    height = top + lane_h * max(1, len(lanes)) + 30
    axis_y = top + lane_h * max(1, len(lanes))
    out = [
        f'<svg id="timeline" class="chart" viewBox="0 0 {WIDTH} {height}" role="img" '
        f'aria-label="timeline of attempts and interruptions">'
    ]
    out += _axis(scale, axis_y, top)
    for i, name in enumerate(lanes):
        out.append(
            f'<text class="lane" x="{LEFT - 6}" y="{top + lane_h * i + 17}" text-anchor="end">{escape(name)}</text>'
        )
    for b in bars:
        x, w = scale.x(b.start), max(1.5, scale.x(b.end) - scale.x(b.start))
        y = top + lane_h * b.lane + 4
        out.append(
            f'<g class="bar {b.css}"><title>{escape(b.title)}</title>'
            f'<rect x="{x:.1f}" y="{y}" width="{w:.1f}" height="{lane_h - 8}" rx="3"/>'
        )
        if b.label and w > 7 * len(b.label):
            out.append(f'<text x="{x + 4:.1f}" y="{y + 13}">{escape(b.label)}</text>')
        out.append("</g>")
    out += _marks(scale, marks, top - 6, axis_y)
    out.append("</svg>")
    return "".join(out)


def thin(points: Sequence[tuple[float, float]], limit: int = MAX_POINTS) -> list[tuple[float, float]]:
    """At most ``limit`` points, keeping each bucket's lowest and highest value (spikes survive)."""
    if len(points) <= limit:
        return list(points)
    size = math.ceil(len(points) / (limit // 2))
    out: list[tuple[float, float]] = []
    for i in range(0, len(points), size):
        bucket = points[i : i + size]
        lo, hi = min(bucket, key=lambda p: p[1]), max(bucket, key=lambda p: p[1])
        out += sorted({lo, hi})
    return out


def curve(
    scale: Scale, points: Sequence[tuple[float, float]], marks: Sequence[Mark], *, name: str, unit: str, css: str
) -> str:
    """One line chart over the shared time axis, with spikes and rollbacks marked."""
    height, top, bottom = 170, 12, 140
    pts = thin(sorted(points))
    out = [f'<svg id="{css}" class="chart" viewBox="0 0 {WIDTH} {height}" role="img" aria-label="{escape(name)}">']
    out += _axis(scale, bottom, top)
    if pts:
        lo, hi = min(p[1] for p in pts), max(p[1] for p in pts)
        if hi - lo < 1e-12:
            lo, hi = lo - 1.0, hi + 1.0

        def y(v: float) -> float:
            return bottom - (v - lo) / (hi - lo) * (bottom - top)

        for v in (lo, (lo + hi) / 2, hi):
            out.append(f'<text class="tick" x="{LEFT - 6}" y="{y(v) + 4:.1f}" text-anchor="end">{v:.4g}</text>')
        path = " ".join(f"{scale.x(t):.1f},{y(v):.1f}" for t, v in pts)
        out.append(f'<polyline class="line {css}" points="{path}"><title>{escape(name)}</title></polyline>')
    out.append(f'<text class="unit" x="{LEFT}" y="{height - 4}">{escape(name)} ({escape(unit)})</text>')
    out += _marks(scale, marks, top, bottom)
    out.append("</svg>")
    return "".join(out)


def cause_bars(by_cause: Mapping[str, Lost], counts: Mapping[str, int]) -> str:
    """Lost time per cause, one stacked bar each (detection, restart, queue, rework, overhead); a
    cause whose interruptions cost no time still has its row."""
    every = {**{cause: Lost() for cause in counts}, **by_cause}
    rows = sorted(every.items(), key=lambda kv: (-kv[1].total_s, kv[0]))
    label_w, row_h = 260, 24
    height = 30 + row_h * max(1, len(rows))
    most = max((lost.total_s for _, lost in rows), default=0.0) or 1.0
    span = WIDTH - label_w - 140
    out = [f'<svg id="causes" class="chart" viewBox="0 0 {WIDTH} {height}" role="img" aria-label="lost time by cause">']
    for i, kind in enumerate(KINDS):
        out.append(
            f'<g class="legend"><rect x="{label_w + i * 110}" y="4" width="12" height="12" '
            f'fill="{COLORS[kind]}"/><text x="{label_w + i * 110 + 16}" y="15">{kind}</text></g>'
        )
    for r, (cause, lost) in enumerate(rows):
        y = 26 + r * row_h
        n = counts.get(cause, 0)
        out.append(
            f'<text class="lane" x="{label_w - 8}" y="{y + 15}" text-anchor="end">{escape(cause)}'
            f"{f' ({n})' if n else ''}</text>"
        )
        x = float(label_w)
        for kind in KINDS:
            s = getattr(lost, f"{kind}_s")
            if s <= 0:
                continue
            w = s / most * span
            out.append(
                f'<rect x="{x:.1f}" y="{y + 3}" width="{max(w, 1.0):.1f}" height="{row_h - 8}" '
                f'fill="{COLORS[kind]}"><title>{escape(cause)}: {kind} {hours(s)}</title></rect>'
            )
            x += w
        out.append(f'<text class="tick" x="{x + 6:.1f}" y="{y + 15}">{hours(lost.total_s)}</text>')
    out.append("</svg>")
    return "".join(out)


def page_points(series: Sequence[ProgressPoint]) -> list[tuple[float, int | None, float | None, float | None]]:
    """The store's progress series as the page's curve points: (time, step, loss, throughput)."""
    return [(p.at, p.step, p.loss, p.throughput) for p in sorted(series, key=lambda p: (p.at, p.attempt, p.step))]
