"""The commands about runs and nodes: `submit`, `status`, `cancel`, `nodes`. They read or write the
daemon's store; the daemon acts on its next tick."""

from __future__ import annotations

import json
from pathlib import Path

import click

from supervisor.cli import context, render, wiring
from supervisor.config import ConfigError, DaemonConfig, check_partition, load_run_spec
from supervisor.domain.actions import Submit
from supervisor.domain.records import Event, EventKind
from supervisor.domain.run import RunSpec
from supervisor.engine.intents import submit_request
from supervisor.ports import PermanentError, PortError, SubmitCheck


@click.command()
@click.argument("spec_path", metavar="RUN.toml", type=click.Path(dir_okay=False))
@click.option("--no-slurm-check", is_flag=True, help="Do not ask Slurm whether the partition exists.")
@click.pass_context
def submit(ctx: click.Context, spec_path: str, no_slurm_check: bool) -> None:
    """Register a run; the daemon submits its job on its next tick."""
    cfg = context.config(ctx)
    spec = _checked_spec(cfg, spec_path, no_slurm_check)
    _register(cfg, spec, spec_path)
    click.echo(f"run {spec.name} registered; the daemon submits it on its next tick")


def _checked_spec(cfg: DaemonConfig, spec_path: str, no_slurm_check: bool) -> RunSpec:
    """The run spec, loaded and (unless told not to) its partition checked against Slurm's."""
    try:
        spec = load_run_spec(spec_path)
        if not no_slurm_check:
            slurm = wiring.scheduler(cfg)
            snap = slurm.snapshot()
            check_partition(spec, {p for n in snap.nodes.values() for p in n.partitions})
            _slurm_would_accept(slurm, spec)
    except ConfigError as exc:
        raise click.ClickException(str(exc)) from None
    except PortError as exc:
        raise click.ClickException(
            f"could not ask Slurm about partition {spec.partition!r}: {exc}. "
            "Fix: check that slurmctld is up, or pass --no-slurm-check"
        ) from None
    return spec


def _slurm_would_accept(slurm: SubmitCheck, spec: RunSpec) -> None:
    """``sbatch --test-only`` with the job the daemon would submit: what Slurm refuses (a GRES the
    cluster lacks, too many nodes, a limit) is refused here, in Slurm's words, not retried later."""
    request = submit_request(spec, Submit(spec.name, (), restart=False, reason="check"), "slurm-supervisor:check", 0)
    try:
        slurm.test_submit(request)
    except PermanentError as exc:
        raise click.ClickException(
            f"run {spec.name}: Slurm would refuse its job: {exc}. Fix: change the spec's [run] (partition, "
            "nodes, sbatch_args) or ask the cluster's admins; --no-slurm-check skips this check"
        ) from None


def _register(cfg: DaemonConfig, spec: RunSpec, spec_path: str) -> None:
    """Add the run to the store with its first logbook event, signed by the user."""
    store = wiring.store(cfg)
    now = wiring.clock().now()
    try:
        with store.transaction():
            store.add_run(spec, now)
            store.record_event(
                Event(
                    spec.name,
                    EventKind.REGISTERED,
                    f"run registered by {context.user()}: {spec.nodes} nodes on {spec.partition}, "
                    f"up to {spec.max_restarts} restarts",
                    f"{spec.name}:registered:{now:.6f}",
                    now,
                    actor=context.user(),
                    evidence={"spec": str(Path(spec_path).resolve())},
                )
            )
    except PortError as exc:
        raise click.ClickException(str(exc)) from None


@click.command()
@click.argument("run", required=False)
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.pass_context
def status(ctx: click.Context, run: str | None, as_json: bool) -> None:
    """Show supervised runs (all, or one with its attempts)."""
    store = wiring.store(context.config(ctx))
    runs = store.runs()
    if run is not None:
        runs = [r for r in runs if r.name == run]
        if not runs:
            raise context.unknown_run(run)
    if as_json:
        click.echo(json.dumps([render.run_dict(r, store.attempts(r.name)) for r in runs], indent=2))
        return
    for line in render.status_lines(runs):
        click.echo(line)


@click.command()
@click.pass_context
def nodes(ctx: click.Context) -> None:
    """Nodes the supervisor drained or excluded, with the evidence."""
    verdicts = wiring.store(context.config(ctx)).verdicts()
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
    store = wiring.store(context.config(ctx))
    try:
        store.request_cancel(run, wiring.clock().now())
    except PortError as exc:
        raise click.ClickException(str(exc)) from None
    click.echo(f"cancel of run {run} requested; the daemon cancels its job on its next tick")
