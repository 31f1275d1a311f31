"""The Slurm hooks' commands: `slurm-supervisor hook prolog|epilog|healthcheck`, and the console
scripts `slurm-supervisor-prolog`, `slurm-supervisor-epilog` and `slurm-supervisor-healthcheck`
that `pip install` puts next to `slurm-supervisor` (the paths slurm.conf names; docs/hooks.md).

Only a fatal GPU finding makes a hook fail (and so drain the node). Anything else — a bad config,
a bug, NVML missing on a CPU node — is written to stderr (slurmd's log) and the hook succeeds: a
broken hook must never drain a cluster.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import click

DEFAULT_HOOKS_CONFIG = "/etc/slurm-supervisor/hooks.toml"


@click.group()
def hook() -> None:
    """Slurm hooks (slurm.conf Prolog, Epilog, HealthCheckProgram); see docs/hooks.md."""


def _run(kind: str, config: str | None) -> None:
    from supervisor.agent.hooks import run_hook
    from supervisor.config import ConfigError, load_hooks_config

    path = config or os.environ.get("SLURM_SUPERVISOR_HOOKS_CONFIG")
    if path is None and Path(DEFAULT_HOOKS_CONFIG).exists():
        path = DEFAULT_HOOKS_CONFIG
    try:
        cfg = load_hooks_config(path)
        outcome = run_hook(kind, cfg, os.environ)
    except ConfigError as exc:
        _say({"event": f"hook_{kind}", "error": str(exc), "exit_code": 0})
        sys.exit(0)
    except Exception as exc:  # noqa: BLE001 - see the module docstring
        _say({"event": f"hook_{kind}", "error": f"{type(exc).__name__}: {exc}", "exit_code": 0})
        sys.exit(0)
    _say(outcome.summary())
    sys.exit(outcome.exit_code)


def _say(doc: dict[str, object]) -> None:
    sys.stderr.write(json.dumps(doc, default=str) + "\n")
    sys.stderr.flush()


_CONFIG = click.option(
    "--config",
    type=click.Path(dir_okay=False),
    default=None,
    help=f"hooks.toml (default: $SLURM_SUPERVISOR_HOOKS_CONFIG, else {DEFAULT_HOOKS_CONFIG}).",
)


@hook.command()
@_CONFIG
def prolog(config: str | None) -> None:
    """Before a job: a fatal GPU finding fails the prolog (Slurm drains the node, requeues the job held)."""
    _run("prolog", config)


@hook.command()
@_CONFIG
def epilog(config: str | None) -> None:
    """After a job: record the GPUs' state; a fatal finding fails the epilog (Slurm drains the node)."""
    _run("epilog", config)


@hook.command()
@_CONFIG
def healthcheck(config: str | None) -> None:
    """Periodic: a fatal finding drains the node through scontrol (Slurm ignores the exit status)."""
    _run("healthcheck", config)


def prolog_main() -> None:
    """Console script `slurm-supervisor-prolog` (slurm.conf ``Prolog=``)."""
    prolog.main(prog_name="slurm-supervisor-prolog")


def epilog_main() -> None:
    """Console script `slurm-supervisor-epilog` (slurm.conf ``Epilog=``)."""
    epilog.main(prog_name="slurm-supervisor-epilog")


def healthcheck_main() -> None:
    """Console script `slurm-supervisor-healthcheck` (slurm.conf ``HealthCheckProgram=``)."""
    healthcheck.main(prog_name="slurm-supervisor-healthcheck")
