"""What the commands share: the daemon configuration named by the global options (which instance
to ask), the daemon's local API for every change, and a reader for the read-only commands.

Changes (submit, cancel, notes, clearing a quarantine) always go through the instance's API: the
daemon learns who asks from the kernel and signs the action with that account's passwd name. Reads
go through the API too; only when no daemon answers may the instance's own account (or root) read
its state directory straight (``--state-dir``, or a stopped daemon).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

import click

from supervisor.api.client import ApiClient, ApiFailure, ApiUnavailable, Reader, RemoteStore
from supervisor.api.identity import user_name
from supervisor.config import ConfigError, DaemonConfig, load_daemon_config

CONFIG_DIR = Path("/etc/slurm-supervisor")
DEFAULT_CONFIG = str(CONFIG_DIR / "supervisor.toml")


def config(ctx: click.Context) -> DaemonConfig:
    """The daemon configuration, loaded once per command line (``--config``, ``--instance``,
    ``--state-dir``)."""
    obj: dict[str, Any] = ctx.ensure_object(dict)
    if "cfg" not in obj:
        try:
            cfg = load_daemon_config(config_path(obj))
        except ConfigError as exc:
            raise click.ClickException(str(exc)) from None
        if obj.get("state_dir"):
            cfg = cfg.model_copy(update={"daemon": cfg.daemon.model_copy(update={"state_dir": obj["state_dir"]})})
        obj["cfg"] = cfg
        configure_logging(cfg)
    return obj["cfg"]  # type: ignore[no-any-return]


class _Stderr:
    """Whatever ``sys.stderr`` is when a line is written (a test runner swaps it per command)."""

    def write(self, text: str) -> int:
        return sys.stderr.write(text)

    def flush(self) -> None:
        sys.stderr.flush()

    def isatty(self) -> bool:
        return sys.stderr.isatty()


def configure_logging(cfg: DaemonConfig) -> None:
    """Logs to stderr at the instance's ``[logging] level`` and format, so that stdout carries
    only a command's result (unconfigured, structlog would print every level to stdout)."""
    from supervisor.adapters.logging import configure_logging as configure

    configure(cfg.logging.level, cfg.logging.format, _Stderr())  # type: ignore[arg-type]


def config_path(obj: dict[str, Any]) -> str | None:
    """``--config``; else ``--instance NAME``'s /etc/slurm-supervisor/NAME.toml; else the first that
    exists of your user instance's config, /etc/slurm-supervisor/YOU.toml and the single-instance
    supervisor.toml; else None (built-in defaults)."""
    if obj.get("config_path"):
        return str(obj["config_path"])
    instance = obj.get("instance")
    if instance:
        if "/" in instance or instance.startswith("."):
            raise click.BadParameter(f"{instance!r} is not an instance name (an account name)", param_hint="--instance")
        return str(CONFIG_DIR / f"{instance}.toml")
    xdg = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    for candidate in (Path(xdg) / "slurm-supervisor" / "supervisor.toml", CONFIG_DIR / f"{user()}.toml"):
        if candidate.is_file():
            return str(candidate)
    return DEFAULT_CONFIG if Path(DEFAULT_CONFIG).exists() else None


def user() -> str:
    """Who runs this command: the passwd name of the real UID (never ``$USER``/``$LOGNAME``)."""
    return user_name(os.getuid())


def api(cfg: DaemonConfig) -> ApiClient:
    return ApiClient(cfg.api.socket_path(cfg.daemon.state_dir))


def call(ctx: click.Context, op: str, **args: Any) -> Any:
    """Ask the instance's daemon to do something; its refusal (or absence) becomes the error."""
    client = api(config(ctx))
    try:
        return client.call(op, **args)
    except ApiUnavailable as exc:
        raise unreachable(exc) from None
    except ApiFailure as exc:
        raise click.ClickException(str(exc)) from None


def reader(ctx: click.Context) -> Reader:
    """The store's read side: through the daemon when it answers; else the state directory itself,
    for whoever may open it (the instance's account, root)."""
    cfg = config(ctx)
    client = api(cfg)
    if client.reachable():
        return RemoteStore(client)
    from supervisor.cli import wiring  # the adapters load only when the daemon does not answer

    if cfg.store.postgres:  # the shared database, read-only: no SQLite file is the instance's memory
        shared = wiring.store(cfg, read_only=True)
        click.echo("(no daemon answers on this login node; read the shared store directly)", err=True)
        return shared
    store = wiring.existing_store(Path(cfg.daemon.state_dir))
    if store is None:
        raise unreachable(ApiUnavailable(f"no slurm-supervisor daemon answers at {client.path}"))
    if not ctx.ensure_object(dict).get("state_dir"):
        click.echo(f"(no daemon answers; read {cfg.daemon.state_dir} directly)", err=True)
    return store


def unreachable(exc: Exception) -> click.ClickException:
    return click.ClickException(
        f"{exc}. Fix: start the instance (systemctl start slurm-supervisor@ACCOUNT, or systemctl --user start "
        "slurm-supervisor), or name it: --instance ACCOUNT or --config FILE (docs/operations.md)"
    )


def unknown_run(run: str) -> click.ClickException:
    return click.ClickException(f"unknown run {run!r}; `slurm-supervisor status` lists the runs")
