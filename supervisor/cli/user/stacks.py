"""`slurm-supervisor stacks RUN`: the Python stacks captured before a run's hung jobs were
cancelled (docs/hang-stacks.md). Lists the run's captures, newest first, and shows one: the
verdict, each group of ranks with one representative stack, and with ``--ranks`` every rank's.
``stacks FILE`` reads a capture file (or a folder of them) offline and judges it again. Wiring only:
the views are ``cli.views.stacks_view``.
"""

from __future__ import annotations

from pathlib import Path

import click

from supervisor.cli import context
from supervisor.cli.views.stacks_view import capture_lines, captures_of, listing_lines, read_capture
from supervisor.domain.text_safety import printable


@click.command()
@click.argument("target")
@click.option("--capture", "name", default=None, help="Which capture (its name, as listed); default: the newest.")
@click.option("--ranks", is_flag=True, help="Every rank's main-thread stack, not one per group.")
@click.pass_context
def stacks(ctx: click.Context, target: str, name: str | None, ranks: bool) -> None:
    """Stacks taken before a hung job was cancelled: TARGET is a run (its captures under the
    daemon's state directory) or a capture file or folder (read offline)."""
    path = Path(target)
    if path.is_file():
        paths = [path]
    elif path.is_dir():
        paths = sorted(path.glob("*.json"), key=lambda p: p.stat().st_mtime, reverse=True)
    else:
        paths = captures_of(Path(context.config(ctx).daemon.state_dir), target)
    if not paths:
        raise click.ClickException(f"no stack captures for {printable(target, 200)}")
    chosen = next((p for p in paths if p.stem == name), None) if name else paths[0]
    if chosen is None:
        raise click.ClickException(
            f"no capture {printable(name or '', 200)}; `stacks {printable(target, 200)}` lists them"
        )
    click.echo("captures (newest first):")
    for line in listing_lines(paths[:20]):
        click.echo(f"  {line}")
    click.echo(f"\n{printable(chosen.stem, 200)}:")
    for line in capture_lines(read_capture(chosen), ranks=ranks):
        click.echo(line)
