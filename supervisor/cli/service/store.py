"""`slurm-supervisor store`: the instance's store itself (SQLite or PostgreSQL, as ``[store]`` says)."""

from __future__ import annotations

import click

from supervisor.cli import context


@click.group()
def store() -> None:
    """The instance's store (``[store]``: SQLite in the state directory, or PostgreSQL)."""


@store.command()
@click.pass_context
def migrate(ctx: click.Context) -> None:
    """Bring the store's schema to this version's (the daemon does it too when it starts).

    Run it before starting a new version's daemons on a shared store: every one of them then
    finds the schema it reads. Running it again changes nothing."""
    from supervisor.adapters.postgres.schema import SchemaTooNew as PostgresTooNew
    from supervisor.adapters.sqlite.schema import SchemaTooNew as SqliteTooNew
    from supervisor.cli import wiring

    cfg = context.config(ctx)
    try:
        where, before, now = wiring.migrate_store(cfg)
    except (PostgresTooNew, SqliteTooNew) as exc:
        raise click.ClickException(str(exc)) from None
    if before == now:
        click.echo(f"{where}: schema version {now}, already current")
    else:
        click.echo(f"{where}: schema version {now} (was {before})")
