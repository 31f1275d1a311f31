"""What the commands share: the daemon configuration named by the global options, the Unix user
who runs a command (it signs the logbook), and the message for a run nobody registered."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import click

from supervisor.config import ConfigError, DaemonConfig, load_daemon_config

DEFAULT_CONFIG = "/etc/slurm-supervisor/supervisor.toml"


def config(ctx: click.Context) -> DaemonConfig:
    """The daemon configuration, loaded once per command line (``--config``, ``--state-dir``)."""
    obj: dict[str, Any] = ctx.ensure_object(dict)
    if "cfg" not in obj:
        path = obj.get("config_path")
        if path is None and Path(DEFAULT_CONFIG).exists():
            path = DEFAULT_CONFIG
        try:
            cfg = load_daemon_config(path)
        except ConfigError as exc:
            raise click.ClickException(str(exc)) from None
        if obj.get("state_dir"):
            cfg = cfg.model_copy(update={"daemon": cfg.daemon.model_copy(update={"state_dir": obj["state_dir"]})})
        obj["cfg"] = cfg
    return obj["cfg"]  # type: ignore[no-any-return]


def user() -> str:
    import getpass

    try:
        return getpass.getuser()
    except (KeyError, OSError):
        return f"uid {os.getuid()}"


def unknown_run(run: str) -> click.ClickException:
    return click.ClickException(f"unknown run {run!r}; `slurm-supervisor status` lists the runs")
