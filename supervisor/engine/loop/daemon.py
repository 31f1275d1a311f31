"""The daemon's loop around the reconcile tick: pacing, backoff, liveness for the watchdog, clean stop.

Stopping (SIGTERM) ends the loop between ticks and never touches jobs: runs outlive the daemon
and are re-adopted by the next one.

systemd's watchdog is fed from its own timer (``adapters.sdnotify.WatchdogTimer``), not from this
loop, so a long poll interval or a slow Slurm command does not get the daemon killed. The loop
only shows that it makes progress: it stamps a :class:`Heartbeat` when a tick starts and ends and
(through :class:`StampedScheduler`) when each Slurm command starts and returns. The timer feeds
the watchdog only while the last stamp is recent, so a loop stuck for good is still killed.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Collection, Sequence
from typing import Protocol, TypeVar

import structlog

from supervisor.domain.cluster import ClusterSnapshot, NodeChange, SubmitRequest
from supervisor.engine.facts.observe import JobScopedScheduler
from supervisor.engine.loop.leadership import Leadership, Outage, Standing
from supervisor.engine.loop.tick_delay import Pacing, PacingState, next_delay
from supervisor.engine.reconcile import Engine, TickResult
from supervisor.ports import Scheduler, TransientError

__all__ = ["Heartbeat", "NullServiceManager", "Pacing", "ServiceManager", "StampedScheduler", "run_loop"]

log = structlog.get_logger("supervisor.daemon")

_Result = TypeVar("_Result")


class ServiceManager(Protocol):
    """systemd's notify protocol (a no-op outside systemd). Return values are ignored."""

    def ready(self) -> object: ...

    def stopping(self) -> object: ...

    def status(self, text: str) -> object: ...


class NullServiceManager:
    def ready(self) -> None: ...

    def stopping(self) -> None: ...

    def status(self, text: str) -> None: ...


class Heartbeat:
    """When the loop last showed progress, on a monotonic clock (wall time may jump).

    Written by the loop's thread, read by the watchdog's: one float assignment, atomic in CPython,
    so no lock."""

    def __init__(self, now: Callable[[], float] = time.monotonic) -> None:
        self._now = now
        self._last = now()

    def beat(self) -> None:
        self._last = self._now()

    def silence_s(self) -> float:
        """Seconds since the last beat."""
        return self._now() - self._last


class StampedScheduler:
    """The Scheduler, with a heartbeat as each Slurm command starts and returns: a slow command
    (bounded by its timeout) is progress; a command that never returns is not."""

    def __init__(self, inner: Scheduler, heartbeat: Heartbeat) -> None:
        self._inner = inner
        self._heartbeat = heartbeat

    def _stamped(self, command: Callable[[], _Result]) -> _Result:
        self._heartbeat.beat()
        try:
            return command()
        finally:
            self._heartbeat.beat()

    def snapshot(self, include_nodes: bool | Collection[str] = True) -> ClusterSnapshot:
        return self._stamped(lambda: self._inner.snapshot(include_nodes))

    def snapshot_of(self, jobs: Collection[int] | None, include_nodes: bool | Collection[str]) -> ClusterSnapshot:
        """Reads by id (engine/facts/job_reads.py) where the inner scheduler has them, else its snapshot."""
        inner = self._inner
        if isinstance(inner, JobScopedScheduler):
            return self._stamped(lambda: inner.snapshot_of(jobs, include_nodes))
        return self._stamped(lambda: inner.snapshot(include_nodes))

    def submit(self, request: SubmitRequest) -> int:
        return self._stamped(lambda: self._inner.submit(request))

    def requeue(self, job_id: int, *, hold: bool = False) -> None:
        self._stamped(lambda: self._inner.requeue(job_id, hold=hold))

    def hold(self, job_id: int) -> None:
        self._stamped(lambda: self._inner.hold(job_id))

    def release(self, job_id: int) -> None:
        self._stamped(lambda: self._inner.release(job_id))

    def cancel(self, job_id: int) -> None:
        self._stamped(lambda: self._inner.cancel(job_id))

    def set_excluded(self, job_id: int, nodes: Sequence[str]) -> None:
        self._stamped(lambda: self._inner.set_excluded(job_id, nodes))

    def set_node_state(self, node: str, change: NodeChange, reason: str) -> None:
        self._stamped(lambda: self._inner.set_node_state(node, change, reason))


def run_loop(
    engine: Engine,
    pacing: Pacing,
    service: ServiceManager | None = None,
    max_ticks: int | None = None,
    after_tick: Callable[[], object] | None = None,
    heartbeat: Heartbeat | None = None,
    leadership: Leadership | None = None,
) -> int:
    """Tick until the clock's wait is interrupted (stop requested). Returns the number of ticks.
    ``after_tick`` runs after every tick (paging); its errors are logged, never fatal.
    ``heartbeat`` is stamped at each tick's start and end, for the watchdog's timer. With
    ``leadership`` (daemons on several login nodes sharing a store) only the leader ticks; a loss
    of the lead to another daemon ends the loop by ``LostLead``. ``max_ticks`` counts rounds of
    the loop, a standby's claims included."""
    service = service or NullServiceManager()
    heartbeat = heartbeat or Heartbeat()
    lead = Lead(engine, leadership)
    log.info("daemon_started", runs=lead.adopted, poll_interval_s=pacing.poll_interval_s, holder=lead.holder)
    service.ready()
    ticks = rounds = 0
    state = PacingState.start(pacing)
    while max_ticks is None or rounds < max_ticks:
        heartbeat.beat()
        rounds += 1
        wait = lead.before_tick(service)
        if wait is not None:  # not leading (or not yet acting): no tick, claim again after the wait
            if engine.clock.wait(wait):
                break
            continue
        result = engine.tick()
        ticks += 1
        _after_tick(after_tick)
        heartbeat.beat()  # the wait that follows is bounded by the poll interval or the backoff cap
        step, state = next_delay(pacing, state, result)
        service.status(_status_line(result, step.delay_s))
        delay = lead.wait_after_tick(step.delay_s)
        if delay and engine.clock.wait(delay):
            break
    service.stopping()
    lead.stop()
    log.info("daemon_stopping", ticks=ticks, note="jobs are left running; the next daemon re-adopts them")
    return ticks


class Lead:
    """The loop's view of leadership: with none (one daemon, its lock), it always leads and adopts
    at start; with a ``Leadership``, it claims before every tick and adopts when it gains the lead."""

    def __init__(self, engine: Engine, leadership: Leadership | None) -> None:
        self._engine, self._leadership = engine, leadership
        self._standing: Standing | None = None
        self._outage: Outage | None = None  # the store's outage, until the leader logged it
        self._adopted_epoch: int | None = None
        self._acting_epoch: int | None = None
        self.adopted = [r.name for r in engine.adopt()] if leadership is None else []
        self.holder = leadership.holder if leadership is not None else None

    def before_tick(self, service: ServiceManager) -> float | None:
        """None: tick now. Else the seconds to wait before claiming again."""
        leadership = self._leadership
        if leadership is None:
            return None
        standing = self._standing = leadership.claim()
        if standing.leading:
            self._outage = standing.outage or self._outage
        if standing.leading and leadership.epoch != self._adopted_epoch:
            try:
                self._engine.adopt()
                self._adopted_epoch = leadership.epoch
            except TransientError as exc:
                log.warning("adopt_interrupted", error=str(exc))
                return leadership.settings.retry_s
        if standing.leading and not self._outage_logged():
            return leadership.settings.retry_s
        if standing.leading and standing.wait_s <= 0:
            self._acting(leadership.epoch)
            return None
        service.status(standing.line())
        return leadership.next_claim_in(standing, 0.0)

    def _acting(self, epoch: int | None) -> None:
        """Said once per epoch, at its first tick: when a failover ended (bench/ha.py measures it)."""
        if epoch != self._acting_epoch:
            log.info("leader_acting", epoch=epoch)
            self._acting_epoch = epoch

    def _outage_logged(self) -> bool:
        """The store's outage this daemon's claim ended, in the logbook before anything else is
        done (a standby's is dropped: the daemon that leads on writes its own)."""
        if self._outage is None:
            return True
        try:
            self._engine.store_outage_over(self._outage.since, self._outage.until, self._outage.error)
        except TransientError as exc:
            log.warning("store_outage_not_logged", error=str(exc))
            return False
        self._outage = None
        return True

    def wait_after_tick(self, delay_s: float) -> float:
        if self._leadership is None or self._standing is None:
            return delay_s
        return self._leadership.next_claim_in(self._standing, delay_s)

    def stop(self) -> None:
        if self._leadership is not None:
            self._leadership.release()


def _after_tick(after_tick: Callable[[], object] | None) -> None:
    if after_tick is None:
        return
    try:
        after_tick()
    except Exception as exc:  # noqa: BLE001 - paging trouble must never stop supervision
        log.error("after_tick_failed", error=str(exc), error_type=type(exc).__name__)


def _status_line(result: TickResult, delay_s: float) -> str:
    """The one line ``systemctl status`` shows."""
    if result.ok:
        return f"ok; {len(result.decisions)} active runs"
    return f"waiting for Slurm: {result.error}; retry in {delay_s:.0f} s"
