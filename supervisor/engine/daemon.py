"""The daemon's loop around the reconcile tick: pacing, backoff, watchdog, clean stop.

Stopping (SIGTERM) ends the loop between ticks and never touches jobs: runs outlive the daemon
and are re-adopted by the next one.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import structlog

from supervisor.engine.reconcile import Engine

log = structlog.get_logger("supervisor.daemon")


class ServiceManager(Protocol):
    """systemd's notify protocol (a no-op outside systemd). Return values are ignored."""

    def ready(self) -> object: ...

    def stopping(self) -> object: ...

    def watchdog(self) -> object: ...

    def status(self, text: str) -> object: ...


class NullServiceManager:
    def ready(self) -> None: ...

    def stopping(self) -> None: ...

    def watchdog(self) -> None: ...

    def status(self, text: str) -> None: ...


@dataclass(frozen=True)
class Pacing:
    poll_interval_s: float = 5.0
    max_backoff_s: float = 15.0  # short enough to catch up soon after slurmctld returns
    max_busy_ticks: int = 5  # ticks run back to back while actions keep happening
    urgent_interval_s: float = 0.5  # while a recovery or a suspect node is in progress


def run_loop(
    engine: Engine,
    pacing: Pacing,
    service: ServiceManager | None = None,
    max_ticks: int | None = None,
    after_tick: Callable[[], object] | None = None,
) -> int:
    """Tick until the clock's wait is interrupted (stop requested). Returns the number of ticks.
    ``after_tick`` runs after every tick (paging); its errors are logged, never fatal."""
    service = service or NullServiceManager()
    runs = engine.adopt()
    log.info("daemon_started", runs=[r.name for r in runs], poll_interval_s=pacing.poll_interval_s)
    service.ready()
    ticks = busy = 0
    backoff = pacing.poll_interval_s
    while max_ticks is None or ticks < max_ticks:
        result = engine.tick()
        ticks += 1
        service.watchdog()
        if after_tick is not None:
            try:
                after_tick()
            except Exception as exc:  # noqa: BLE001 - paging trouble must never stop supervision
                log.error("after_tick_failed", error=str(exc), error_type=type(exc).__name__)
        if result.ok:
            backoff = pacing.poll_interval_s
            busy = busy + 1 if result.acted else 0
            service.status(f"ok; {len(result.decisions)} active runs")
            delay = 0.0 if 0 < busy < pacing.max_busy_ticks else pacing.poll_interval_s
            if result.urgent and delay:
                delay = min(delay, pacing.urgent_interval_s)
        else:
            backoff = min(pacing.max_backoff_s, max(backoff * 2, result.retry_in or 0.0))
            service.status(f"waiting for Slurm: {result.error}; retry in {backoff:.0f} s")
            delay = backoff
        if delay and engine.clock.wait(delay):
            break
    service.stopping()
    log.info("daemon_stopping", ticks=ticks, note="jobs are left running; the next daemon re-adopts them")
    return ticks
