"""Goodput in words: the rows every rendering (terminal, Markdown, HTML) shows, from one place."""

from __future__ import annotations

import re
from datetime import UTC, datetime

from supervisor.domain.goodput.account import KINDS, CheckpointAdvice, Goodput, SpareEconomics
from supervisor.domain.goodput.sweep import Lost
from supervisor.domain.run import RunSpec


def hours(s: float) -> str:
    """Seconds as a short human figure: ``45 s``, ``12.5 min``, ``3.25 h``, ``2.10 d``."""
    if s < 60:
        return f"{s:.0f} s"
    if s < 3600:
        return f"{s / 60:.1f} min"
    if s < 2 * 86400:
        return f"{s / 3600:.2f} h"
    return f"{s / 86400:.2f} d"


def percent(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:.1f} %"


def summary_rows(g: Goodput, advice: CheckpointAdvice, gpus: int | None = None) -> list[tuple[str, str]]:
    """(label, value) pairs: ETTR, where the time went, the interruption rate and the checkpoint advice."""
    rows = [
        ("ETTR (productive / wall)", percent(g.ettr) + (" (upper bound)" if g.upper_bound else "")),
        ("wall time", hours(g.wall_s)),
        ("productive", hours(g.productive_s)),
        *((f"lost: {k}", hours(getattr(g.lost, f"{k}_s"))) for k in KINDS),
        ("idle (before the first submission or after the end)", hours(g.idle_s)),
        ("interruptions", str(len(g.interruptions))),
        ("interruptions per day", "-" if g.interruptions_per_day is None else f"{g.interruptions_per_day:.2f}"),
        ("mean time between interruptions (running)", "-" if g.mtbi_s is None else hours(g.mtbi_s)),
    ]
    rows += spare_rows(g.spares)
    if gpus:
        rows.append(("GPU-hours lost", f"{g.lost.total_s * gpus / 3600:,.1f} ({gpus} GPUs)"))
    if advice.interval_s is not None:
        rows.append(
            (
                "checkpoint interval (Young)",
                f"{hours(advice.interval_s)} — {advice.reason}; expected overhead {percent(advice.expected_waste)}",
            )
        )
    else:
        rows.append(("checkpoint interval (Young)", f"- ({advice.reason})"))
    return rows


def spare_rows(spares: SpareEconomics | None) -> list[tuple[str, str]]:
    """In-allocation runs: what the hot spares cost (idle node-hours) against what the swaps saved."""
    if spares is None:
        return []
    return [
        ("hot spares: idle node-hours", f"{spares.idle_spare_node_s / 3600:.2f}"),
        ("hot spares: what the swaps saved", _saving(spares)),
    ]


def _saving(s: SpareEconomics) -> str:
    if not s.swaps:
        return "no swap yet"
    each = "-" if s.swap_recovery_s is None else hours(s.swap_recovery_s)
    swaps = f"{s.swaps} swap(s), {each} each from detection to computing again"
    if s.saved_s is None or s.resubmit_recovery_s is None:
        return f"{swaps}; no resubmission of this run on record to compare with"
    return (
        f"{swaps}, against {hours(s.resubmit_recovery_s)} per resubmission ({s.resubmissions} on record): "
        f"saved {s.saved_s:.0f} s ({hours(max(0.0, s.saved_s))})"
    )


def cause_rows(g: Goodput) -> list[tuple[str, str, str, str]]:
    """(cause, interruptions, lost, Table 5) rows, most lost time first: every interruption in its
    cause's row (one that cost no time too), and the rows of time lost outside any interruption."""
    counts: dict[str, int] = {}
    table5: dict[str, str] = {}
    for i in g.interruptions:
        counts[i.cause.category] = counts.get(i.cause.category, 0) + 1
        table5[i.cause.category] = "yes" if i.cause.table5 else "no"
    lost = {cause: g.by_cause.get(cause, Lost()).total_s for cause in {*g.by_cause, *counts}}
    rows = []
    for cause, s in sorted(lost.items(), key=lambda kv: (-kv[1], kv[0])):
        rows.append((cause, str(counts.get(cause, 0)), hours(s), table5.get(cause, "-")))
    return rows


def markdown_lines(g: Goodput, advice: CheckpointAdvice, gpus: int | None = None) -> list[str]:
    lines = [
        "## Goodput",
        "",
        f"From {_iso(g.start)} to {_iso(g.end)}. Lost time is counted once, in this order: "
        "detection, restart, queue, rework.",
        "",
        "| figure | value |",
        "|---|---|",
    ]
    lines += [f"| {k} | {v} |" for k, v in summary_rows(g, advice, gpus)]
    causes = cause_rows(g)
    if causes:
        lines += ["", "| cause | interruptions | lost | Llama 3 Table 5 category |", "|---|---|---|---|"]
        lines += [f"| {c} | {n} | {lost} | {t} |" for c, n, lost, t in causes]
    lines += [""] + [f"- {n}." for n in g.notes]
    return [*lines, ""] if g.notes else lines


def gpus_of(spec: RunSpec) -> int | None:
    """The run's GPU count from ``--gpus-per-node=N`` or ``--gres=gpu[:type]:N`` in its sbatch args."""
    for arg in spec.sbatch_args:
        m = re.fullmatch(r"--gpus-per-node=(?:\w+:)?(\d+)|--gres=gpu(?::\w+)?:(\d+)", arg)
        if m:
            return spec.nodes * int(m.group(1) or m.group(2))
    return None


def _iso(t: float) -> str:
    return datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
