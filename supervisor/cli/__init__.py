"""`slurm-supervisor`: the daemon and the commands engineers run. Wiring only.

The group and its global options live here; each command (or group of commands) in its own module."""

from __future__ import annotations

import importlib

import click

from supervisor.api.client import ApiFailure, ApiUnavailable
from supervisor.cli.context import DEFAULT_CONFIG, unreachable

# Each command's module is imported when the command runs (or help lists it), not at every start:
# `status` need not load the daemon, the simulator or numpy (the tests poll it ten times a second).
COMMANDS = {
    "guard": "supervisor.cli.service.guard:guard",
    "daemon": "supervisor.cli.service.daemon:daemon",
    "submit": "supervisor.cli.user.runs:submit",
    "status": "supervisor.cli.user.runs:status",
    "logbook": "supervisor.cli.user.logbook:logbook",
    "nodes": "supervisor.cli.user.runs:nodes",
    "cancel": "supervisor.cli.user.runs:cancel",
    "demo": "supervisor.cli.offline.demo:demo",
    "ckpt": "supervisor.cli.node.ckpt:ckpt",
    "agent": "supervisor.cli.node.agent:agent",
    "launch": "supervisor.cli.node.launch:launch",
    "quarantine": "supervisor.cli.user.quarantine:quarantine",
    "hook": "supervisor.cli.node.hooks:hook",
    "simulate": "supervisor.cli.offline.simulate:simulate",
    "analyze": "supervisor.cli.offline.analyze:analyze",
    "stacks": "supervisor.cli.user.stacks:stacks",
    "doctor": "supervisor.cli.service.doctor:doctor",
    "store": "supervisor.cli.service.store:store",
}


class _Main(click.Group):
    """A refusal from the daemon's API (not allowed, unknown run) ends any command with its message.
    Commands load lazily (``COMMANDS``)."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted({*COMMANDS, *super().list_commands(ctx)})

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        where = COMMANDS.get(cmd_name)
        if where is None:
            return super().get_command(ctx, cmd_name)  # one added with add_command
        module, _, name = where.partition(":")
        command = getattr(importlib.import_module(module), name)
        assert isinstance(command, click.Command)
        return command

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
