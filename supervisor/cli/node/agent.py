"""`slurm-supervisor agent`: the node agent (one per node of a run's allocation). Wiring only."""

from __future__ import annotations

import json
import os
import signal
import sys
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, NoReturn

import click
import structlog

from supervisor.domain.health.node_report import to_wire

if TYPE_CHECKING:
    from supervisor.agent.sender import HttpSender

log = structlog.get_logger(__name__)


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
    help="Read the GPUs once, print the findings as JSON, exit 2 on a fatal finding (nothing is sent unless --send).",
)
@click.option(
    "--send",
    is_flag=True,
    help="With --once: also send the report to the daemon as the agent does (--daemon-url, --run, the run's "
    "token); the exit code still says what was found, the JSON says whether it was sent.",
)
@click.option(
    "--send-timeout",
    "send_timeout_s",
    type=click.FloatRange(0.5, 600),
    default=30.0,
    show_default=True,
    help="With --once --send: how long to keep trying the daemon (it hears a job's nodes from its next tick).",
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
    send: bool,
    send_timeout_s: float,
    timeout_s: float,
    log_level: str,
) -> None:
    """Report this node's GPU and host health to the daemon (run one per node, e.g. as an overlapping
    job step: srun --overlap --ntasks-per-node=1 slurm-supervisor agent ...)."""
    from supervisor.adapters.logging import configure_logging
    from supervisor.agent.oneshot import node_name

    node = node or node_name()
    if once:
        configure_logging(log_level, "json")  # stderr: stdout holds the check's JSON
        sender = _sender(daemon_url, run_name, token_file, node, 720) if send else None
        _check_and_exit(node, timeout_s, nvml_library, sender, send_timeout_s)
    configure_logging(log_level, "json")
    _run_agent(_sender(daemon_url, run_name, token_file, node, buffer_max), node, interval_s, nvml_library)


def _sender(url: str | None, run: str | None, token_file: str | None, node: str, buffer_max: int) -> HttpSender:
    from supervisor.agent import HttpSender, SenderSettings

    if not url or not run:
        raise click.ClickException(
            "--daemon-url and --run are required (or SLURM_SUPERVISOR_URL and SLURM_SUPERVISOR_RUN)"
        )
    try:
        return HttpSender(url, run, _token(token_file), node, SenderSettings(buffer_max=buffer_max))
    except ValueError as exc:
        raise click.ClickException(str(exc)) from None


def _check_and_exit(
    node: str, timeout_s: float, library: str | None, sender: HttpSender | None, send_timeout_s: float
) -> NoReturn:
    """One check, printed as JSON (and sent, with a sender); exit 2 on a fatal finding."""
    from supervisor.agent.oneshot import as_agent_report, check_once, send_result

    source = "agent" if sender is not None else "healthcheck"  # a run's token sends agent reports only
    result = check_once(timeout_s, node=node, source=source, library_path=library)
    out: dict[str, object] = {
        "node": node,
        "elapsed_s": round(result.elapsed_s, 3),
        "error": result.error,
        "findings": [{"severity": f.severity.value, "rule": f.rule, "reason": f.reason} for f in result.findings],
        "report": to_wire(result.report) if result.report else None,
    }
    if sender is not None:
        problem = send_result(sender, as_agent_report(result, node), send_timeout_s)
        out |= {"sent": problem is None, "send_error": problem}
        if problem is not None:
            log.warning("agent_once_not_sent", node=node, problem=problem)
    click.echo(json.dumps(out))
    sys.exit(2 if result.worst is not None and result.worst.rank == 2 else 0)


def _run_agent(sender: HttpSender, node: str, interval_s: float, library: str | None) -> None:
    from supervisor.adapters.nvml import NvmlReader
    from supervisor.agent import Agent, AgentSettings
    from supervisor.agent.host import read_host

    try:
        settings = AgentSettings(interval_s=interval_s, xid_poll_s=min(0.25, interval_s))
    except ValueError as exc:
        raise click.ClickException(str(exc)) from None
    the_agent = Agent(node, NvmlReader(library), sender, settings, host=read_host)

    def _stop(signum: int, frame: FrameType | None) -> None:
        the_agent.stop()

    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGINT, _stop)
    the_agent.run()
