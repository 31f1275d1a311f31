"""Rendering a 10,000-event logbook: terminal (rich), the Markdown chronicle and the HTML page.

    .venv/bin/python bench/logbook_render.py [--events 10000] [--repeat 3] [--seed 0]

A synthetic run of ~1,270 attempts over ~6 months: each attempt starts, writes and verifies
checkpoints, and ends in a fault (XID, ECC, probe failure or hang, with resume steps on record for
most), which is drained, stopped and restarted; every 50th attempt gets a human note. The HTML
page also gets a 20,000-point progress series (loss and tokens/s) to thin. Each rendering runs
``--repeat`` times; the median is reported. Goal: < 2 s each.

Prints a table, then as its last line one JSON object: ``terminal_s``, ``markdown_s``, ``html_s``
(plus ``events``, sizes and the goal).
"""

from __future__ import annotations

import argparse
import io
import json
import random
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import table  # noqa: E402
from rich.console import Console  # noqa: E402

from supervisor.adapters.logbook_html.page import render_html  # noqa: E402
from supervisor.cli.views.render import EventFilter, print_events  # noqa: E402
from supervisor.domain.records import AttemptRecord, Event, EventKind, RunRecord  # noqa: E402
from supervisor.domain.run import RunSpec, RunState  # noqa: E402
from supervisor.report.chronicle import render_markdown  # noqa: E402

T0 = 1795910400.0
RUN = "llama-405b"
FAULTS = (
    ("XID 79: GPU has fallen off the bus (gpu 3)", "xid-79@1"),
    ("XID 48: double-bit ECC error (gpu 5)", "xid-48@1"),
    ("slurmd probe failed 3 times over 1.0 s: connect refused", None),
    ("mlx5_2 port down: link flapping", None),
)


def synthetic(n_events: int, seed: int) -> tuple[RunRecord, list[AttemptRecord], list[Event]]:
    rng = random.Random(seed)
    nodes = [f"gpu-{i:04d}" for i in range(1, 2049)]
    attempts: list[AttemptRecord] = []
    events: list[Event] = []
    t, step, seq = T0, 0, 0

    def ev(kind: EventKind, at: float, msg: str, **evidence: object) -> None:
        events.append(Event(RUN, kind, msg, f"{RUN}:{len(events)}", at, seq, 10_000 + seq, evidence=evidence))

    events.append(Event(RUN, EventKind.REGISTERED, "run registered: 2048 nodes", f"{RUN}:reg", t, actor="alice"))
    while len(events) < n_events:
        submitted, started = t, t + rng.uniform(30, 900)
        ev(
            EventKind.RESTARTED if seq else EventKind.SUBMITTED,
            submitted,
            f"attempt {seq}: submitted job {10_000 + seq}",
            exclude=rng.sample(nodes, 2),
            resume_step=step if seq else None,
        )
        ev(EventKind.STARTED, started, f"attempt {seq} (job {10_000 + seq}, restart 0) running on 2048 nodes")
        run_s = rng.expovariate(1 / (3.1 * 3600))
        for k in range(1, 4):
            if k * run_s / 4 < run_s:
                ev(
                    EventKind.CHECKPOINT_VERIFIED,
                    started + k * run_s / 4,
                    f"checkpoint step {step + k * 100} verified",
                    step=step + k * 100,
                    location=f"s3://ckpt/{RUN}/step_{step + k * 100}/",
                    save_s=95.0,
                )
        fault_at = started + run_s
        node = rng.choice(nodes)
        why, rule = rng.choice(FAULTS)
        last = step + int(run_s / 12)
        if rng.random() < 0.15:
            ev(
                EventKind.FAULT,
                fault_at,
                f"attempt {seq}: hang: no training step for 600 s",
                last_step=last,
                silent_s=600.0,
                step_interval_s=12.0,
                step_time_s=12.0,
                nodes=nodes[:4],
            )
        else:
            ev(
                EventKind.FAULT,
                fault_at,
                f"attempt {seq}: fault on {node}: {why}",
                node=node,
                observed=why,
                rule=rule,
                lost_steps=int(run_s / 12) % 300,
                step_time_s=12.0,
            )
            ev(
                EventKind.NODE_DRAINED,
                fault_at + 1,
                f"{node} downed and drained in Slurm: {why}",
                node=node,
                reason=why,
            )
        ev(EventKind.STOPPED, fault_at + 3, f"attempt {seq} (job {10_000 + seq}, restart 0) ended NODE_FAIL")
        if seq % 50 == 49:
            events.append(
                Event(
                    RUN,
                    EventKind.NOTE,
                    f"looked at {node}: sent for RMA",
                    f"{RUN}:note{seq}",
                    fault_at + 600,
                    seq,
                    10_000 + seq,
                    actor="bob",
                )
            )
        attempts.append(AttemptRecord(RUN, seq, 10_000 + seq, 0, submitted, (), (), started, fault_at + 3, "NODE_FAIL"))
        step = max(step, last - 100)
        t, seq = fault_at + rng.uniform(5, 120), seq + 1
    spec = RunSpec(
        name=RUN,
        script="train.sbatch",
        partition="gpu",
        nodes=2048,
        max_restarts=100_000,
        sbatch_args=("--gpus-per-node=8",),
    )
    return RunRecord(spec, RunState.RUNNING, restarts_spent=seq - 1), attempts, events[:n_events]


def series(attempts: list[AttemptRecord], points: int) -> list[tuple[float, int | None, float | None, float | None]]:
    t0, t1 = attempts[0].submitted_at, attempts[-1].ended_at or attempts[-1].submitted_at
    return [
        (
            t0 + (t1 - t0) * i / points,
            i * 10,
            2.0 + 8.0 / (1 + i / 500) + (1.0 if i % 4999 == 0 else 0.0),
            4.0e5 + (i % 97) * 100.0,
        )
        for i in range(points)
    ]


def timed(fn, repeat: int) -> tuple[float, object]:
    times, out = [], None
    for _ in range(repeat):
        started = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - started)
    return statistics.median(times), out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--events", type=int, default=10_000)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    run, attempts, events = synthetic(args.events, args.seed)
    points = series(attempts, 20_000)

    def terminal() -> str:
        buf = io.StringIO()
        console = Console(
            file=buf,
            force_terminal=True,
            color_system="truecolor",
            soft_wrap=True,
            width=200,
            highlight=False,
            markup=False,
            emoji=False,
        )
        print_events(console, events, EventFilter())
        return buf.getvalue()

    end = events[-1].at
    term_s, term = timed(terminal, args.repeat)
    md_s, md = timed(lambda: render_markdown(run, attempts, events, now=end), args.repeat)
    html_s, html = timed(lambda: render_html(run, attempts, events, points, now=end), args.repeat)
    rows = [
        ("terminal (rich, ANSI colours)", f"{term_s:.3f}", f"{len(str(term)):,}"),
        ("Markdown chronicle", f"{md_s:.3f}", f"{len(str(md)):,}"),
        ("HTML page (+20,000-point series)", f"{html_s:.3f}", f"{len(str(html)):,}"),
    ]
    print(
        f"{len(events):,} events, {len(attempts):,} attempts, {(end - T0) / 86400:.0f} days; median of {args.repeat}\n"
    )
    print(table(rows, ("rendering", "seconds", "characters")))
    print(
        json.dumps(
            {
                "terminal_s": round(term_s, 4),
                "markdown_s": round(md_s, 4),
                "html_s": round(html_s, 4),
                "events": len(events),
                "attempts": len(attempts),
                "goal_s": 2.0,
                "goal_met": max(term_s, md_s, html_s) < 2.0,
            }
        )
    )


if __name__ == "__main__":
    main()
