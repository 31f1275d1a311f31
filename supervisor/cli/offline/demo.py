"""`slurm-supervisor demo`: the daemon supervising a run on a simulated cluster with injected node
crashes, then its logbook and node verdicts. Exits 1 when a crash went unrecovered or two
incarnations of the run overlapped."""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING

import click

from supervisor.cli.views import render
from supervisor.cli.views.logbook_view import folded_lines
from supervisor.report.figures import restarts

if TYPE_CHECKING:
    from supervisor.sim.demo import DemoOutcome


@click.command()
@click.option("--nodes", "total_nodes", default=20, show_default=True, help="Nodes in the simulated partition.")
@click.option("--run-nodes", default=16, show_default=True, help="Nodes the run needs.")
@click.option("--spares", default=2, show_default=True, help="Named spare nodes.")
@click.option("--hours", default=24.0, show_default=True, help="Simulated hours.")
@click.option("--crashes", default=3, show_default=True, help="Node crashes to inject.")
@click.option("--seed", default=7, show_default=True)
@click.option(
    "--state-dir",
    "demo_dir",
    type=click.Path(file_okay=False),
    default=None,
    help="Keep the demo's store here (default: a temporary directory).",
)
def demo(
    total_nodes: int, run_nodes: int, spares: int, hours: float, crashes: int, seed: int, demo_dir: str | None
) -> None:
    """The daemon supervising a run on a simulated cluster with injected node crashes."""
    from supervisor.adapters.logging import configure_logging
    from supervisor.sim.demo import DemoSettings, run_demo

    configure_logging("warning", "auto")
    o = run_demo(DemoSettings(total_nodes, run_nodes, spares, hours, crashes, seed), demo_dir)
    _print_summary(o)
    _print_records(o)
    ok = o.recoveries >= min(1, len(o.injected)) and o.overlaps == 0
    sys.exit(0 if ok else 1)


def _print_summary(o: DemoOutcome) -> None:
    s = o.settings
    click.echo(
        f"simulated {s.hours:g} h of a {s.run_nodes}-node run with {s.spares} named spares on "
        f"{s.total_nodes} nodes: {o.ticks} daemon ticks in {o.wall_s:.1f} s of wall time"
    )
    click.echo(
        f"injected node crashes: {', '.join(o.injected) or 'none'}; recoveries: {o.recoveries}; "
        f"overlapping incarnations: {o.overlaps}"
    )
    click.echo(
        f"run state: {o.run.state.value}; restarts spent: {restarts(o.run.restarts_spent, o.run.spec.max_restarts)}; "
        f"excluded: {', '.join(sorted(o.run.excluded)) or 'none'}\n"
    )


def _print_records(o: DemoOutcome) -> None:
    click.echo("LOGBOOK")
    for line in folded_lines(o.events):
        click.echo(line)
    click.echo("\nNODES")
    for line in render.node_lines(o.verdicts):
        click.echo(line)
