"""`slurm-supervisor daemon`: the supervisor itself (systemd: Type=notify). Wiring only: it builds
the adapters from the configuration, hands them to the engine and runs the loop until a signal."""

from __future__ import annotations

import os
import signal
import socket
import sys
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from supervisor.cli import context, wiring
from supervisor.config import DaemonConfig

if TYPE_CHECKING:
    from supervisor.adapters.clock import SystemClock
    from supervisor.adapters.paging.webhook import WebhookNotifier
    from supervisor.adapters.web.ingest import IngestServer, ReportIngest
    from supervisor.api.server import ApiServer
    from supervisor.cli.wiring import DaemonStore
    from supervisor.engine.loop.daemon import Heartbeat
    from supervisor.engine.loop.leadership import Leadership
    from supervisor.engine.reconcile import Engine, EngineSettings
    from supervisor.ports import Fencer, NodeGuard, Scheduler

    Ingest = tuple[ReportIngest, IngestServer] | None
    Paging = tuple[WebhookNotifier, Callable[[], None]] | None


@click.command()
@click.option(
    "--config",
    "daemon_config",
    type=click.Path(dir_okay=False),
    default=None,
    help="Daemon configuration (same as the global --config).",
)
@click.option("--once", is_flag=True, help="Run one reconcile tick and exit.")
@click.option(
    "--crash-at", hidden=True, default=None, help="Fault injection for tests: BOUNDARY[:ACTION] — exit abruptly there."
)
@click.pass_context
def daemon(ctx: click.Context, daemon_config: str | None, once: bool, crash_at: str | None) -> None:
    """Run the supervisor daemon (systemd: Type=notify)."""
    if daemon_config:
        ctx.ensure_object(dict)["config_path"] = daemon_config
    from supervisor.adapters.lock import AlreadyRunning, StateDirLock
    from supervisor.adapters.logging import configure_logging
    from supervisor.adapters.rlimits import raise_nofile

    cfg = context.config(ctx)
    configure_logging(cfg.logging.level, cfg.logging.format)
    raise_nofile()  # before the probe and the ingest size their windows from the limit
    clock = wiring.clock()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: clock.stop())
    _own_state_dir(Path(cfg.daemon.state_dir))
    try:
        with StateDirLock(cfg.daemon.state_dir):
            _serve(cfg, clock, once=once, crash_at=crash_at)
    except AlreadyRunning as exc:
        raise click.ClickException(str(exc)) from None


def _serve(cfg: DaemonConfig, clock: SystemClock, *, once: bool, crash_at: str | None) -> None:
    """Build the engine and its companions (ingest, pager), then tick until stopped."""
    from supervisor.adapters import gc_tuning
    from supervisor.engine.loop.daemon import Heartbeat
    from supervisor.engine.loop.leadership import LostLead

    opened: list[DaemonStore] = []  # every writing connection: the leader's epoch fences them all
    store = wiring.store(cfg, opened=opened)
    ingest = wiring.ingest(cfg, clock, opened)
    heartbeat = Heartbeat()  # the loop's sign of life for the watchdog's own timer
    settings = _start_ingest(cfg, ingest, wiring.engine_settings(cfg))
    api = _start_api(cfg, clock, opened)
    own_url = settings.ingest_url.split(",")[0] if settings.ingest_url else socket.getfqdn()  # own first
    leadership = wiring.leadership(cfg, store, opened, own_url)
    if ingest is not None and leadership is not None:  # a standby's ingest sends agents to the leader
        ingest[0].follow_leadership(leadership.may_act)
    engine = _engine(cfg, store, clock, settings, heartbeat, ingest, crash_at, leadership)
    paging = _start_paging(cfg, store, clock)
    gc_tuning.settle()  # wired: what exists now is never walked again; collections 30x rarer
    try:
        _run(cfg, engine, heartbeat, paging, once=once, leadership=leadership)
    except LostLead as exc:
        raise click.ClickException(
            f"this daemon no longer leads: {exc}; it ends, to start again as a standby"
        ) from None
    finally:
        api.stop()
        if paging is not None:
            paging[0].close()
        if ingest is not None:
            ingest[1].stop()


def _own_state_dir(path: Path) -> None:
    """The state directory is the daemon's alone: its account's, mode 0700 (made so, or tightened)."""
    try:
        path.mkdir(mode=0o700, parents=True, exist_ok=True)
        owner = path.stat().st_uid
        if owner != os.geteuid():
            raise click.ClickException(
                f"state_dir {path} belongs to uid {owner}, not to this instance's account (uid {os.geteuid()}). "
                "Fix: run the instance as the account that owns it, or move the files into the instance's own "
                "state directory (docs/operations.md, Upgrade)"
            )
        if path.stat().st_mode & 0o077:
            path.chmod(0o700)
    except OSError as exc:
        raise click.ClickException(f"state_dir {path}: {exc.strerror}; the instance's account must own it") from None


def _start_api(cfg: DaemonConfig, clock: SystemClock, opened: list[DaemonStore]) -> ApiServer:
    """The local API the CLI asks (``[api]``): started before the first tick, stopped last."""
    from supervisor.api.identity import UnknownGroup

    try:
        server = wiring.api_server(cfg, clock, opened)
    except UnknownGroup as exc:
        raise click.ClickException(str(exc)) from None
    try:
        server.start()
    except OSError as exc:
        raise click.ClickException(f"{exc}. Fix: give each instance its own [api] socket") from None
    return server


def _start_ingest(cfg: DaemonConfig, ingest: Ingest, settings: EngineSettings) -> EngineSettings:
    """Open the agents' endpoint, if configured; the settings then carry the URL agents report to."""
    if ingest is None:
        return settings
    try:
        ingest[1].start()
    except OSError as exc:
        raise click.ClickException(f"{exc}; set [ingest] port (or enabled = false)") from None
    own = wiring.advertised_url(cfg, ingest[1])
    return replace(settings, ingest_url=",".join((own, *(url for url in cfg.ingest.peer_urls if url != own))))


def _engine(
    cfg: DaemonConfig,
    store: DaemonStore,
    clock: SystemClock,
    settings: EngineSettings,
    heartbeat: Heartbeat,
    ingest: Ingest,
    crash_at: str | None,
    leadership: Leadership | None,
) -> Engine:
    from supervisor.adapters.slurm.tcp_probe import TcpProbe
    from supervisor.engine.loop.daemon import StampedScheduler
    from supervisor.engine.reconcile import Engine

    scheduler = wiring.scheduler(cfg)
    gated, fencer, guard = _gated(leadership, scheduler, wiring.fencer(cfg), wiring.guard(cfg))
    return Engine(
        scheduler=StampedScheduler(gated, heartbeat),
        store=store,
        clock=clock,
        settings=wiring.from_slurm_config(scheduler, settings),
        probe=TcpProbe(timeout=cfg.probe.timeout_s, default_port=cfg.probe.slurmd_port) if cfg.probe.enabled else None,
        fencer=fencer,
        crash_hook=_crash_hook(crash_at),
        progress=wiring.progress(cfg, store),
        checkpoints=wiring.checkpoints(clock, cfg, store),
        health=ingest[0] if ingest else None,
        accounting=wiring.accounting(scheduler),
        guard=guard,
        stacks=wiring.stacks(cfg, clock, leadership),
    )


def _gated(
    leadership: Leadership | None, scheduler: Scheduler, fencer: Fencer | None, guard: NodeGuard | None
) -> tuple[Scheduler, Fencer | None, NodeGuard | None]:
    """Every command that changes Slurm, a node or the guard waits for the lead (self-fencing)."""
    if leadership is None:
        return scheduler, fencer, guard
    from supervisor.engine.loop.leadership import GatedFencer, GatedGuard, GatedScheduler

    gate = leadership.may_act
    return (
        GatedScheduler(scheduler, gate),
        GatedFencer(fencer, gate) if fencer is not None else None,
        GatedGuard(guard, gate) if guard is not None else None,
    )


def _start_paging(cfg: DaemonConfig, store: DaemonStore, clock: SystemClock) -> Paging:
    """The webhook pager, started, if ``[notify]`` names one."""
    try:
        paging = wiring.pager(cfg, store, clock)
    except (OSError, ValueError) as exc:
        raise click.ClickException(str(exc)) from None
    if paging is not None:
        paging[0].start()
    return paging


def _run(
    cfg: DaemonConfig,
    engine: Engine,
    heartbeat: Heartbeat,
    paging: Paging,
    *,
    once: bool,
    leadership: Leadership | None = None,
) -> None:
    """The reconcile loop, under systemd's watchdog."""
    from supervisor.adapters.sdnotify import SystemdNotifier, WatchdogTimer
    from supervisor.engine.loop.daemon import Pacing, run_loop

    notifier = SystemdNotifier()
    with WatchdogTimer(notifier, heartbeat, cfg.daemon.stall_limit_s):
        run_loop(
            engine,
            Pacing(cfg.daemon.poll_interval_s),
            notifier,
            max_ticks=1 if once else None,
            after_tick=paging[1] if paging else None,
            heartbeat=heartbeat,
            leadership=leadership,
        )


def _crash_hook(spec: str | None) -> Any:
    if not spec:
        return None
    boundary, _, kind = spec.partition(":")

    def hook(at: str, action: str) -> None:
        if at == boundary and (not kind or kind == action):
            sys.stderr.write(f"slurm-supervisor: injected crash at {at}:{action}\n")
            sys.stderr.flush()
            os._exit(137)

    return hook
