"""`slurm-supervisor`: the daemon and the commands engineers run. Wiring only.

The group and its global options live here; each command (or group of commands) in its own module."""

from __future__ import annotations

import click

from supervisor.api.client import ApiFailure, ApiUnavailable
from supervisor.cli.agent import agent
from supervisor.cli.analyze import analyze
from supervisor.cli.ckpt import ckpt
from supervisor.cli.context import DEFAULT_CONFIG, unreachable
from supervisor.cli.daemon import daemon
from supervisor.cli.demo import demo
from supervisor.cli.guard import guard
from supervisor.cli.hooks import hook
from supervisor.cli.launch import launch
from supervisor.cli.logbook import logbook
from supervisor.cli.quarantine import quarantine
from supervisor.cli.runs import cancel, nodes, status, submit
from supervisor.cli.simulate import simulate


class _Main(click.Group):
    """A refusal from the daemon's API (not allowed, unknown run) ends any command with its message."""

    def invoke(self, ctx: click.Context) -> object:
        try:
            return super().invoke(ctx)
        except ApiFailure as exc:
            raise click.ClickException(str(exc)) from None
        except ApiUnavailable as exc:
            raise unreachable(exc) from None


@click.group(cls=_Main, context_settings={"help_option_names": ["-h", "--help"]})
@click.option(
    "--instance",
    envvar="SLURM_SUPERVISOR_INSTANCE",
    help="The instance to ask, by its account: reads /etc/slurm-supervisor/INSTANCE.toml. "
    "Default: your own instance's configuration when there is one.",
)
@click.option(
    "--config",
    "config_path",
    type=click.Path(dir_okay=False),
    envvar="SLURM_SUPERVISOR_CONFIG",
    help="The instance's configuration (TOML). Default: ~/.config/slurm-supervisor/supervisor.toml, "
    f"/etc/slurm-supervisor/YOU.toml, {DEFAULT_CONFIG}: the first that exists.",
)
@click.option(
    "--state-dir",
    type=click.Path(file_okay=False),
    envvar="SLURM_SUPERVISOR_STATE_DIR",
    help="Override daemon.state_dir. Reads come from it directly when no daemon answers (its account only).",
)
@click.pass_context
def main(ctx: click.Context, instance: str | None, config_path: str | None, state_dir: str | None) -> None:
    """Keep long Slurm training runs alive: follow jobs, recover from node faults, keep a logbook."""
    ctx.ensure_object(dict).update(config_path=config_path, state_dir=state_dir, instance=instance)


main.add_command(guard)
for _command in (
    daemon,
    submit,
    status,
    logbook,
    nodes,
    cancel,
    demo,
    ckpt,
    agent,
    launch,
    quarantine,
    hook,
    simulate,
    analyze,
):
    main.add_command(_command)
