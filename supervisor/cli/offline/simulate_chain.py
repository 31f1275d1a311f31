"""`simulate`'s options for a run past the partition's time limit: a chain of jobs (sim.training.chain).
Wiring only; split from ``simulate`` to keep it small."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import click

if TYPE_CHECKING:
    from supervisor.sim.training.chain import ChainSettings

_OPTIONS = (
    click.option(
        "--max-job-hours",
        type=float,
        default=None,
        help="The partition's time limit (MaxTime): the run is a chain of jobs, each signalled "
        "--lead-time before it and continued from its save. [default: no limit]",
    ),
    click.option(
        "--lead-time", type=int, default=600, show_default=True, help="Seconds of the signal before the limit."
    ),
    click.option(
        "--prequeue-minutes",
        type=float,
        default=60.0,
        show_default=True,
        help="The supervisor queues the next job this long before the limit (0: after the end).",
    ),
    click.option(
        "--queue-wait-minutes",
        type=float,
        default=0.0,
        show_default=True,
        help="Median wait of a job entering the queue before it may start (log-normal; 0: none).",
    ),
    click.option("--queue-wait-sigma", type=float, default=1.0, show_default=True, help="Spread of that log-normal."),
    click.option(
        "--accrue-always/--no-accrue-always",
        default=True,
        show_default=True,
        help="PriorityFlags=ACCRUE_ALWAYS: a held, pre-queued job's wait counts from its submission.",
    ),
    click.option("--preempt-per-day", type=float, default=0.0, show_default=True, help="Preemptions per day."),
    click.option("--grace-time", type=float, default=300.0, show_default=True, help="The partition's GraceTime (s)."),
)
_NAMES = (
    "max_job_hours",
    "lead_time",
    "prequeue_minutes",
    "queue_wait_minutes",
    "queue_wait_sigma",
    "accrue_always",
    "preempt_per_day",
    "grace_time",
)


def chain_options(command: Callable[..., Any]) -> Callable[..., Any]:
    for option in reversed(_OPTIONS):
        command = option(command)
    return command


def pop_chain(options: dict[str, Any]) -> ChainSettings:
    """The chain's settings from (and out of) the command's options; a usage error names a bad one."""
    from supervisor.sim.training.chain import ChainSettings

    o = {name: options.pop(name) for name in _NAMES}
    hours = o["max_job_hours"]
    try:
        return ChainSettings(
            max_job_s=None if hours is None else hours * 3600.0,
            lead_s=o["lead_time"],
            prequeue_s=round(o["prequeue_minutes"] * 60),
            queue_wait_median_s=o["queue_wait_minutes"] * 60.0,
            queue_wait_sigma=o["queue_wait_sigma"],
            accrue_always=o["accrue_always"],
            preempt_per_day=o["preempt_per_day"],
            grace_s=o["grace_time"],
        )
    except ValueError as exc:
        raise click.UsageError(str(exc)) from None


def chain_lines(figures: dict[str, dict[str, object]]) -> list[str]:
    """The chain's figures per mode, for people (none when no mode has them)."""
    rows = [(mode, f["chain"]) for mode, f in figures.items() if isinstance(f.get("chain"), dict)]
    if not rows:
        return []
    out = ["\nchain of jobs (mean per run; gap: a planned end to the next job running):"]
    for mode, c in rows:
        assert isinstance(c, dict)
        out.append(
            f"  {mode}: {c['planned_ends']:.1f} planned ends, {c['timeouts']:.1f} time-outs without a save, "
            f"{c['preemptions']:.1f} preemptions ({c['preempted_unsaved']:.1f} unsaved); gap p50 "
            f"{_s(c['gap_s_p50'])}, p99 {_s(c['gap_s_p99'])}"
        )
    return out


def _s(value: object) -> str:
    return "-" if not isinstance(value, (int, float)) else f"{value:.0f} s"
