"""What `slurm-supervisor analyze` prints: a timeline for people (rich, every string from a log
through ``printable``: the log is hostile input) or one JSON document for tools (keys documented in
docs/analyze.md; non-finite numbers as the strings "NaN", "Infinity", "-Infinity")."""

from __future__ import annotations

import json
import math
from datetime import UTC, datetime
from typing import Any, TextIO

from rich.console import Console
from rich.text import Text

from supervisor.analyze.replay import AttemptSummary, Entry, ReplayReport
from supervisor.domain.progress.line_clock import ClockSource
from supervisor.domain.text_safety import printable

SCHEMA = 1
_STYLE = {
    "spike": "yellow",
    "spike_healed": "green",
    "rollback": "bold magenta",
    "rollback_blocked": "bold red",
    "hang": "bold red",
    "straggler": "red",
    "slowdown": "yellow",
    "imbalance": "blue",
    "save": "dim",
    "load_failed": "bold red",
}
_SUMMARY = (
    ("spike", "spike"),
    ("spike_healed", "healed"),
    ("rollback", "rollback"),
    ("rollback_blocked", "rollback blocked"),
    ("hang", "hang"),
    ("straggler", "straggler"),
    ("slowdown", "slowdown"),
    ("imbalance", "imbalance"),
    ("save", "save"),
    ("load_failed", "failed load"),
)


# ---------------------------------------------------------------------------- JSON


def report_json(report: ReplayReport) -> str:
    s = report.settings
    doc = {
        "analyze": SCHEMA,
        "run": s.run,
        "settings": {
            "poll_interval_s": s.poll_s,
            "hang": {
                "multiple": s.hang.multiple,
                "floor_s": s.hang.floor_s,
                "cap_s": s.hang.cap_s,
                "startup_grace_s": s.hang.startup_grace_s,
                "pause_cap_s": s.hang.pause_cap_s,
            },
            "spikes": {
                "rollback": s.spikes.rollback,
                "heal_window_steps": s.spikes.heal_window_steps,
                "min_steps_before": s.spikes.min_steps_before,
                "skip_batches": s.spikes.skip_batches,
                "max_rollbacks": s.spikes.max_rollbacks,
                "window_h": s.spikes.window_h,
            },
            "nodes": list(s.nodes),
            "checkpoint_every": s.checkpoint_every,
            "limit": s.limit,
        },
        "attempts": [_attempt_doc(a) for a in report.attempts],
        "events": [_entry_doc(e, _clock_of(report, e)) for e in report.entries],
        "counts": dict(sorted(report.counts.items())),
        "omitted": dict(sorted(report.omitted.items())),
    }
    return json.dumps(_plain(doc), sort_keys=False, allow_nan=False)


def _attempt_doc(a: AttemptSummary) -> dict[str, Any]:
    return {
        "index": a.index,
        "log": a.log,
        "format": a.format,
        "format_note": a.format_note,
        "clock": a.clock,
        "lines": a.lines,
        "records": a.records,
        "first_step": a.first_step,
        "last_step": a.last_step,
        "started_at": a.started_at,
        "ended_at": a.ended_at,
        "step_time_s": a.step_time_s,
        "hang_interval_s": a.hang_interval_s,
        "hang_threshold_s": a.hang_threshold_s,
        "saves": a.saves,
        "save_median_s": a.save_median_s,
        "stopped": a.stopped,
        "stopped_at": a.stopped_at,
    }


def _entry_doc(e: Entry, clock: str) -> dict[str, Any]:
    return {
        "at": e.at,
        "time": when(e.at, clock),
        "attempt": e.attempt,
        "kind": e.kind,
        "step": e.step,
        "message": e.message,
        "after_stop": e.after_stop,
        "evidence": dict(e.evidence),
    }


def _plain(value: Any) -> Any:
    """JSON-safe: non-finite floats as strings, tuples as lists, unknown values as their str."""
    if isinstance(value, float):
        if math.isnan(value):
            return "NaN"
        return value if math.isfinite(value) else ("Infinity" if value > 0 else "-Infinity")
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    if value is None or isinstance(value, bool | int | str):
        return value
    return str(value)


def _clock_of(report: ReplayReport, e: Entry) -> str:
    return report.attempts[e.attempt].clock if e.attempt < len(report.attempts) else ClockSource.STEP_TIMES.value


def when(at: float, clock: str) -> str:
    """A time as the log tells it: its own clock (zone as written; UTC when none), or, on step
    times, seconds from the first attempt's start as +H:MM:SS."""
    if clock == ClockSource.TIMESTAMPS.value:
        return datetime.fromtimestamp(at, UTC).strftime("%Y-%m-%d %H:%M:%S")
    seconds = max(0, round(at))
    return f"~+{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"


# ---------------------------------------------------------------------------- text


def print_report(report: ReplayReport, out: TextIO) -> None:
    console = Console(file=out, soft_wrap=True, highlight=False, markup=False, emoji=False)
    s = report.settings
    n = len(report.attempts)
    console.print(
        Text(
            f"slurm-supervisor analyze: {n} log{'s' if n != 1 else ''} as {n} attempt{'s' if n != 1 else ''} of one "
            f"run; polls every {s.poll_s:g} s; hang limit {s.hang.multiple:g} × the step interval within "
            f"[{s.hang.floor_s:g} s, {s.hang.cap_s:g} s] ({s.hang.startup_grace_s:g} s at start-up); spikes heal "
            f"within {s.spikes.heal_window_steps} steps",
            style="bold",
        )
    )
    by_attempt: dict[int, list[Entry]] = {}
    for e in report.entries:
        by_attempt.setdefault(e.attempt, []).append(e)
    for a in report.attempts:
        _print_attempt(console, a, by_attempt.get(a.index, []))
    console.print(Text("summary: " + _summary(report), style="bold"))
    if report.omitted:
        left = ", ".join(f"{count} {kind}" for kind, count in sorted(report.omitted.items()))
        console.print(Text(f"not listed (over --limit {s.limit} per kind): {left}", style="dim"))


def _print_attempt(console: Console, a: AttemptSummary, entries: list[Entry]) -> None:
    console.print()
    console.print(Text(f"attempt {a.index}  {printable(a.log, 300)}", style="bold cyan"))
    steps = f"steps {a.first_step}–{a.last_step}" if a.first_step is not None else "no steps"
    fmt = f"{a.format or 'no format read'} ({a.format_note})" if a.format_note else str(a.format)
    judged = "" if a.clock == ClockSource.TIMESTAMPS.value else " (hangs not judged: no timestamps)"
    console.print(f"  format {fmt} · {a.lines} lines · {a.records} records · {steps} · clock: {a.clock}{judged}")
    console.print("  " + _pace_line(a))
    stopped = False
    for e in entries:
        if e.after_stop and not stopped:
            stopped = True
            console.print(
                Text(
                    f"  ── the supervisor would have stopped attempt {a.index} here ({a.stopped}); "
                    "what follows in this log happened without it ──",
                    style="bold magenta",
                )
            )
        console.print(_entry_text(e, a.clock))


def _pace_line(a: AttemptSummary) -> str:
    parts = [f"step time {a.step_time_s:g} s" if a.step_time_s else "no step time in the log"]
    if a.hang_interval_s is not None and a.hang_threshold_s is not None and a.clock == ClockSource.TIMESTAMPS.value:
        parts.append(f"hang limit learned {a.hang_threshold_s:.0f} s (a logged step every {a.hang_interval_s:.1f} s)")
    median = f", median {a.save_median_s:.1f} s" if a.save_median_s is not None else ""
    parts.append(f"{a.saves} checkpoint save{'s' if a.saves != 1 else ''}{median}")
    return " · ".join(parts)


def _entry_text(e: Entry, clock: str) -> Text:
    t = Text("  ")
    t.append(f"{when(e.at, clock):<20}", style="dim")
    t.append(f" {'-' if e.step is None else e.step:>9}  ")
    t.append(f"{e.kind:<16}", style=_STYLE.get(e.kind, ""))
    t.append(" " + printable(e.message, 400))
    last = e.evidence.get("last_lines") if e.kind == "hang" else None
    if isinstance(last, list) and last:
        t.append("\n" + " " * 50 + "last line: " + printable(str(last[-1]), 200), style="dim")
    return t


def _summary(report: ReplayReport) -> str:
    counts = report.counts
    parts = []
    for kind, word in _SUMMARY:
        k = counts.get(kind, 0)
        if k or kind in ("spike", "rollback", "hang", "save"):
            parts.append(f"{k} {word}{'s' if k != 1 and not word.endswith('d') else ''}")
    return ", ".join(parts)
