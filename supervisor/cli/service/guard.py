"""`slurm-supervisor guard`: the node guard service (docs/guard.md) and the requests people send it.
Wiring only: the policy lives in supervisor/guard."""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from supervisor.adapters.guard_client import DEFAULT_SOCKET, GuardClient
from supervisor.ports import PortError

if TYPE_CHECKING:
    from supervisor.guard.config import GuardConfig
    from supervisor.guard.memory import Memory
    from supervisor.guard.server import GuardServer

_socket_option = click.option(
    "--socket",
    "socket_path",
    envvar="SLURM_SUPERVISOR_GUARD_SOCKET",
    default=DEFAULT_SOCKET,
    show_default=True,
    help="The guard's socket.",
)


@click.group()
def guard() -> None:
    """The node guard: the one service with node rights in Slurm (docs/guard.md)."""


@guard.command()
@click.option("--config", "guard_config", type=click.Path(dir_okay=False), default=None, help="guard.toml.")
def serve(guard_config: str | None) -> None:
    """Run the guard (systemd: slurm-supervisor-guard.socket starts it on the first request)."""
    from supervisor.adapters.logging import configure_logging
    from supervisor.config import ConfigError
    from supervisor.guard.config import DEFAULT_CONFIG, load_guard_config

    if guard_config is None and Path(DEFAULT_CONFIG).exists():
        guard_config = DEFAULT_CONFIG
    try:
        cfg = load_guard_config(guard_config)
    except ConfigError as exc:
        raise click.ClickException(str(exc)) from None
    configure_logging(cfg.logging.level, cfg.logging.format)
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    server = _server(cfg)
    try:
        server.serve(stop)
    finally:
        server.guard.memory.close()
        server.guard.audit.close()


def _server(cfg: GuardConfig) -> GuardServer:
    from supervisor.adapters.slurm.cli import SlurmCli
    from supervisor.guard.audit import AuditLog
    from supervisor.guard.server import GuardServer, bound_socket, passed_socket
    from supervisor.guard.service import Guard
    from supervisor.guard.slurm_node_jobs import GuardSlurm

    g = cfg.guard
    cli = SlurmCli(
        bin_dir=str(cfg.slurm.bin_dir) if cfg.slurm.bin_dir else None,
        slurm_conf=str(cfg.slurm.slurm_conf) if cfg.slurm.slurm_conf else None,
        timeout=cfg.slurm.command_timeout_s,
    )
    slurm = GuardSlurm(cli)
    g.state_dir.mkdir(mode=0o700, parents=True, exist_ok=True)  # the audit log's, whichever memory
    memory = _memory(cfg)
    audit = AuditLog(g.state_dir / "audit.jsonl", max_bytes=int(g.audit_max_mb * 1e6), keep=g.audit_keep)
    core = Guard(slurm=slurm, memory=memory, audit=audit, limits=g.limits(), quarantine=cfg.quarantine.settings())
    try:
        sock = passed_socket() or bound_socket(g.socket, g.socket_group)
    except OSError as exc:
        raise click.ClickException(f"cannot listen on {g.socket}: {exc}") from None
    trusted = frozenset(g.instance_users)
    return GuardServer(sock, core, timeout_s=g.request_timeout_s, idle_exit_s=g.idle_exit_s, trusted_users=trusted)


def _memory(cfg: GuardConfig) -> Memory:
    """The guard's own memory in its state directory, or the one the guards of every login node
    share (``[store] url``; its password from ``password_file`` or the systemd credential)."""
    from supervisor.adapters.secrets import read_secret
    from supervisor.guard.memory import GuardMemory, MemoryUnreachable
    from supervisor.guard.memory_pg import SharedGuardMemory

    s = cfg.store
    if s.url is None:
        return GuardMemory(cfg.guard.state_dir)
    try:
        path = s.credential_path(os.environ)
        what = "password_file" if s.password_file is not None else "password_credential"
        password = read_secret(path, what, "store") if path is not None else None
        return SharedGuardMemory(s.url, password, connect_timeout_s=s.connect_timeout_s)
    except (ValueError, MemoryUnreachable) as exc:
        raise click.ClickException(str(exc)) from None


@guard.command()
@click.argument("node")
@click.option("--run", "run", required=True, help="The run the node faulted in.")
@click.option("--cause", required=True, help="What was seen (goes into the Slurm reason, cleaned).")
@click.option("--down", is_flag=True, help="DOWN instead of DRAIN (Slurm ends or requeues the job at once).")
@_socket_option
def drain(node: str, run: str, cause: str, down: bool, socket_path: str) -> None:
    """Ask the guard to drain NODE of one of your running jobs."""
    _report(_ask(socket_path, {"op": "DOWN" if down else "DRAIN", "node": node, "run": run, "cause": cause}))


@guard.command()
@click.argument("node")
@_socket_option
def resume(node: str, socket_path: str) -> None:
    """Return NODE to service: an admin's clears its quarantine; yours must be a node you drained
    and hold in your maintenance reservation (it passed validation), and forgives your own fault."""
    _report(_ask(socket_path, {"op": "RESUME", "node": node}))


@guard.command()
@click.argument("node")
@_socket_option
def clear(node: str, socket_path: str) -> None:
    """Forget NODE's faults in the shared quarantine (admins only)."""
    _report(_ask(socket_path, {"op": "CLEAR", "node": node}))


@guard.command()
@click.argument("node")
@click.option("--run", "run", required=True, help="The run whose fault drained the node.")
@_socket_option
def reserve(node: str, run: str, socket_path: str) -> None:
    """Hold NODE, which you drained, in a maintenance reservation for your account (to validate it)."""
    _report(_ask(socket_path, {"op": "RESERVE", "node": node, "run": run}))


@guard.command()
@click.argument("node")
@click.option("--run", "run", required=True, help="The run whose fault drained the node.")
@click.option("--cause", required=True, help="Why it is rebooted (goes into the Slurm reason, cleaned).")
@_socket_option
def reboot(node: str, run: str, cause: str, socket_path: str) -> None:
    """Reboot NODE through Slurm, back into your maintenance reservation (RESERVE it first)."""
    _report(_ask(socket_path, {"op": "REBOOT", "node": node, "run": run, "cause": cause}))


@guard.command()
@click.argument("node")
@_socket_option
def unreserve(node: str, socket_path: str) -> None:
    """Remove your maintenance reservation of NODE, leaving its state as it is."""
    _report(_ask(socket_path, {"op": "UNRESERVE", "node": node}))


@guard.command("quarantine")
@click.option("--json", "as_json", is_flag=True, help="One JSON object per node.")
@_socket_option
def quarantine_(as_json: bool, socket_path: str) -> None:
    """Nodes the guard's shared memory keeps out of every instance's submissions."""
    answer = _ask(socket_path, {"op": "QUARANTINE"})
    items = answer.get("quarantined") or []
    if not items and not as_json:
        click.echo("no node is quarantined")
    for item in items:
        if as_json:
            click.echo(json.dumps(item, sort_keys=True))
            continue
        until = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(item["until"]))
        runs = "; ".join(f"{f['run']}: {f['reason']}" for f in item["faults"][-3:])
        click.echo(f"{item['node']}  until {until}  {len(item['faults'])} fault(s): {runs}")


def _ask(socket_path: str, request: Mapping[str, Any]) -> Mapping[str, Any]:
    try:
        return GuardClient(socket_path).ask(request)
    except PortError as exc:
        raise click.ClickException(str(exc)) from None


def _report(answer: Mapping[str, Any]) -> None:
    if answer.get("granted") is not True:
        raise click.ClickException(f"refused ({answer.get('rule')}): {answer.get('why')}")
    job = f", job {answer['job']}" if answer.get("job") is not None else ""
    reason = f"; Slurm reason: {answer['reason']}" if answer.get("reason") else ""
    click.echo(f"granted ({answer.get('rule')}{job}): {answer.get('why')}{reason}")
