"""`slurm-supervisor agent`: the node agent (one per node of a run's allocation). Wiring only."""

from __future__ import annotations

import json
import os
import signal
import sys
from pathlib import Path
from types import FrameType

import click

from supervisor.domain.node_report import to_wire


def _token(token_file: str | None) -> str:
    if token_file:
        try:
            token = Path(token_file).read_text().strip()
        except OSError as exc:
            raise click.ClickException(f"cannot read the token file {token_file}: {exc.strerror}") from None
    else:
        token = os.environ.get("SLURM_SUPERVISOR_TOKEN", "").strip()
    if not token:
        raise click.ClickException(
            "no run token: pass --token-file FILE or set SLURM_SUPERVISOR_TOKEN "
            "(the daemon prints each run's token file at `slurm-supervisor submit`)"
        )
    return token


@click.command()
@click.option(
    "--daemon-url",
    envvar="SLURM_SUPERVISOR_URL",
    metavar="URL",
    help="The daemon's ingest, e.g. http://login1:8471 (env SLURM_SUPERVISOR_URL).",
)
@click.option(
    "--run",
    "run_name",
    envvar="SLURM_SUPERVISOR_RUN",
    metavar="RUN",
    help="The supervised run this node belongs to (env SLURM_SUPERVISOR_RUN).",
)
@click.option(
    "--token-file",
    envvar="SLURM_SUPERVISOR_TOKEN_FILE",
    type=click.Path(dir_okay=False),
    help="File holding the run's token (else env SLURM_SUPERVISOR_TOKEN). Never logged.",
)
@click.option("--node", default=None, help="Node name (default: $SLURMD_NODENAME, else the short host name).")
@click.option(
    "--interval",
    "interval_s",
    type=click.FloatRange(0.05, 3600),
    default=5.0,
    show_default=True,
    help="Seconds between samples (XID events are sent at once).",
)
@click.option(
    "--buffer",
    "buffer_max",
    type=click.IntRange(1, 1_000_000),
    default=720,
    show_default=True,
    help="Reports kept while the daemon is unreachable (the oldest are dropped and counted).",
)
@click.option(
    "--nvml-library",
    default=None,
    type=click.Path(dir_okay=False),
    help="Load this libnvidia-ml.so.1 instead of the one on the library path.",
)
@click.option(
    "--once",
    is_flag=True,
    help="Read the GPUs once, print the findings as JSON, exit 2 on a fatal finding (nothing is sent).",
)
@click.option(
    "--timeout",
    "timeout_s",
    type=click.FloatRange(0.5, 600),
    default=4.0,
    show_default=True,
    help="With --once: the deadline of the NVML read (a wedged driver counts as fatal).",
)
@click.option("--log-level", type=click.Choice(["debug", "info", "warning", "error"]), default="info")
def agent(
    daemon_url: str | None,
    run_name: str | None,
    token_file: str | None,
    node: str | None,
    interval_s: float,
    buffer_max: int,
    nvml_library: str | None,
    once: bool,
    timeout_s: float,
    log_level: str,
) -> None:
    """Report this node's GPU and host health to the daemon (run one per node, e.g. as an overlapping
    job step: srun --overlap --ntasks-per-node=1 slurm-supervisor agent ...)."""
    from supervisor.adapters.logging import configure_logging
    from supervisor.agent.oneshot import check_once, node_name

    node = node or node_name()
    if once:
        result = check_once(timeout_s, node=node, source="healthcheck", library_path=nvml_library)
        click.echo(
            json.dumps(
                {
                    "node": node,
                    "elapsed_s": round(result.elapsed_s, 3),
                    "error": result.error,
                    "findings": [
                        {"severity": f.severity.value, "rule": f.rule, "reason": f.reason} for f in result.findings
                    ],
                    "report": to_wire(result.report) if result.report else None,
                }
            )
        )
        sys.exit(2 if result.worst is not None and result.worst.rank == 2 else 0)
    if not daemon_url or not run_name:
        raise click.ClickException(
            "--daemon-url and --run are required (or SLURM_SUPERVISOR_URL and SLURM_SUPERVISOR_RUN)"
        )
    configure_logging(log_level, "json")
    _run_agent(daemon_url, run_name, _token(token_file), node, interval_s, buffer_max, nvml_library)


def _run_agent(
    url: str, run: str, token: str, node: str, interval_s: float, buffer_max: int, library: str | None
) -> None:
    from supervisor.adapters.nvml import NvmlReader
    from supervisor.agent import Agent, AgentSettings, HttpSender, SenderSettings
    from supervisor.agent.host import read_host

    try:
        sender = HttpSender(url, run, token, node, SenderSettings(buffer_max=buffer_max))
        settings = AgentSettings(interval_s=interval_s, xid_poll_s=min(0.25, interval_s))
    except ValueError as exc:
        raise click.ClickException(str(exc)) from None
    the_agent = Agent(node, NvmlReader(library), sender, settings, host=read_host)

    def _stop(signum: int, frame: FrameType | None) -> None:
        the_agent.stop()

    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGINT, _stop)
    the_agent.run()
