"""`slurm-supervisor quarantine`: list and clear nodes kept out of every run for repeated faults."""

from __future__ import annotations

import json
import time

import click

from supervisor.api.client import Reader
from supervisor.cli import context
from supervisor.domain.health.quarantine import QuarantineSettings, quarantined
from supervisor.domain.text_safety import printable


@click.group()
def quarantine() -> None:
    """Nodes kept out of every run because they faulted again and again ("lemon" nodes)."""


def _settings(ctx: click.Context) -> tuple[QuarantineSettings, Reader]:
    q = context.config(ctx).quarantine
    return QuarantineSettings(q.faults, q.window_h * 3600, q.base_h * 3600, q.max_h * 3600), context.reader(ctx)


@quarantine.command("list")
@click.option("--json", "as_json", is_flag=True, help="One JSON object per node.")
@click.pass_context
def list_(ctx: click.Context, as_json: bool) -> None:
    """Quarantined nodes, until when, and the faults that put them there."""
    settings, store = _settings(ctx)
    now = time.time()
    faults = store.node_faults(now - settings.window_s - settings.max_s)
    found = quarantined(faults, store.quarantine_clears(), now, settings)
    if not found:
        click.echo("no node is quarantined")
        return
    for q in sorted(found.values(), key=lambda q: q.node):
        if as_json:
            click.echo(
                json.dumps(
                    {
                        "node": q.node,
                        "since": q.since,
                        "until": q.until,
                        "reason": q.reason,
                        "faults": [{"at": f.at, "run": f.run, "reason": f.reason} for f in q.faults],
                    }
                )
            )
            continue
        until = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(q.until))
        click.echo(printable(f"{q.node}  until {until}  {q.reason}"))  # reasons quote agents and logs
        for f in q.faults:
            click.echo(printable(f"    {time.strftime('%Y-%m-%d %H:%M', time.gmtime(f.at))}  run {f.run}: {f.reason}"))


@quarantine.command()
@click.argument("node")
@click.option("--note", required=True, help="Why it may return (e.g. 'GPU 3 replaced, ticket 1234').")
@click.pass_context
def clear(ctx: click.Context, node: str, note: str) -> None:
    """End NODE's quarantine; faults before now no longer count against it. Signed with your account."""
    signer = context.call(ctx, "clear", node=node, note=note)
    click.echo(f"{node}: quarantine cleared by {signer} ({note})")
