"""`slurm-supervisor`: the daemon and the commands engineers run. Wiring only.

The group and its global options live here; each command (or group of commands) in its own module."""

from __future__ import annotations

import click

from supervisor.cli.agent import agent
from supervisor.cli.ckpt import ckpt
from supervisor.cli.context import DEFAULT_CONFIG
from supervisor.cli.daemon import daemon
from supervisor.cli.demo import demo
from supervisor.cli.hooks import hook
from supervisor.cli.logbook import logbook
from supervisor.cli.quarantine import quarantine
from supervisor.cli.runs import cancel, nodes, status, submit
from supervisor.cli.simulate import simulate


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.option(
    "--config",
    "config_path",
    type=click.Path(dir_okay=False),
    envvar="SLURM_SUPERVISOR_CONFIG",
    help=f"Daemon configuration (TOML). Default: {DEFAULT_CONFIG} when it exists.",
)
@click.option(
    "--state-dir",
    type=click.Path(file_okay=False),
    envvar="SLURM_SUPERVISOR_STATE_DIR",
    help="Override daemon.state_dir.",
)
@click.pass_context
def main(ctx: click.Context, config_path: str | None, state_dir: str | None) -> None:
    """Keep long Slurm training runs alive: follow jobs, recover from node faults, keep a logbook."""
    ctx.ensure_object(dict).update(config_path=config_path, state_dir=state_dir)


for _command in (daemon, submit, status, logbook, nodes, cancel, demo, ckpt, agent, quarantine, hook, simulate):
    main.add_command(_command)
