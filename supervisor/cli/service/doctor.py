"""`slurm-supervisor doctor`: the adapter's reads against this site's Slurm, and what it could not use."""

from __future__ import annotations

import json

import click

from supervisor.adapters.slurm.doctor import Status, check_slurm
from supervisor.cli import context, wiring


@click.command()
@click.option("--json", "as_json", is_flag=True, help="One JSON object per check.")
@click.pass_context
def doctor(ctx: click.Context, as_json: bool) -> None:
    """Run the reads the daemon makes (as this account, with its configuration's [slurm] section)
    and say what the supervisor could not read or use here: the release and what it lacks, the
    account's jobs, a job by id with its exit code, nodes and their addresses, accounting. Nothing
    is submitted or changed. Exit status 1 when a read the daemon needs fails."""
    cfg = context.config(ctx)
    scheduler = wiring.scheduler(cfg)
    checks = check_slurm(scheduler, wiring.accounting(scheduler))
    for check in checks:
        if as_json:
            click.echo(json.dumps({"check": check.name, "status": str(check.status), "detail": check.detail}))
        else:
            click.echo(f"{check.status:<5} {check.name:<15} {check.detail}")
    if any(check.status is Status.FAIL for check in checks):
        ctx.exit(1)
