"""The commands about runs and nodes: `submit`, `status`, `cancel`, `nodes`. Changes go to the
instance's daemon through its local API; the daemon acts on its next tick."""

from __future__ import annotations

import json
from pathlib import Path

import click

from supervisor.cli import context
from supervisor.cli.views import render


@click.command()
@click.argument("spec_path", metavar="RUN.toml", type=click.Path(dir_okay=False))
@click.option("--no-slurm-check", is_flag=True, help="Do not ask Slurm whether it would accept the job.")
@click.pass_context
def submit(ctx: click.Context, spec_path: str, no_slurm_check: bool) -> None:
    """Register a run; the daemon submits its job, as the instance's account, on its next tick.

    The daemon reads RUN.toml and the batch script as that account; it checks with Slurm
    (`sbatch --test-only`) that the job would be accepted, and records you as the run's owner."""
    name = context.call(ctx, "submit", spec=str(Path(spec_path).resolve()), slurm_check=not no_slurm_check)
    click.echo(f"run {name} registered; the daemon submits it on its next tick")


@click.command()
@click.argument("run", required=False)
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.pass_context
def status(ctx: click.Context, run: str | None, as_json: bool) -> None:
    """Supervised runs, one a line: state and since when, ETTR, restarts, what pages. With RUN:
    that run on one screen, with its last incident and when the next checkpoint is due."""
    from supervisor.cli import wiring
    from supervisor.cli.views import status_view

    store = context.reader(ctx)
    if run is not None:
        record = store.get_run(run)
        if record is None:
            raise context.unknown_run(run)
        runs = [record]
    else:
        runs = store.runs()
    if as_json:
        click.echo(json.dumps([render.run_dict(r, store.attempts(r.name)) for r in runs], indent=2))
        return
    now = wiring.clock().now()
    summaries = [
        status_view.run_summary(r, store.attempts(r.name), store.events(r.name), now, store.progress(r.name))
        for r in runs
    ]
    lines = status_view.summary_lines(summaries[0]) if run is not None else status_view.table_lines(summaries)
    leader = status_view.leader_line(store.lease())
    for line in [*lines, *([leader] if leader else [])]:
        click.echo(line)


@click.command()
@click.pass_context
def nodes(ctx: click.Context) -> None:
    """Nodes the supervisor drained or excluded, with the evidence."""
    verdicts = context.reader(ctx).verdicts()
    if not verdicts:
        click.echo("no node has been drained or excluded")
        return
    for line in render.node_lines(verdicts):
        click.echo(line)


@click.command()
@click.argument("run")
@click.pass_context
def cancel(ctx: click.Context, run: str) -> None:
    """Cancel a run: the daemon cancels its job and stops supervising it."""
    click.echo(context.call(ctx, "cancel", run=run))
