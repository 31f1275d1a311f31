"""systemd's watchdog fed from its own timer while the daemon's loop shows progress.

A real AF_UNIX datagram socket stands in for systemd's NOTIFY_SOCKET; the loop's monotonic clock
is injected, so "stuck for two minutes" takes no time. The timer's own period is 10 ms
(WATCHDOG_USEC=20000), so the few real waits below last a fraction of a second.
"""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from structlog.testing import capture_logs

from supervisor.adapters.sdnotify import SystemdNotifier, WatchdogTimer
from supervisor.domain.cluster import ClusterSnapshot
from supervisor.engine.loop.daemon import Heartbeat, Pacing, StampedScheduler, run_loop
from supervisor.engine.reconcile import TickResult
from supervisor.ports import TransientError
from supervisor.testing.kit.clock import ManualClock

STALL_LIMIT_S = 120.0
FAST_WATCHDOG = {"WATCHDOG_USEC": "20000"}  # pinged every 10 ms


@pytest.fixture
def systemd(tmp_path: Path) -> Iterator[tuple[dict[str, str], socket.socket]]:
    """systemd's notify socket; yields (the daemon's environment, the socket)."""
    path = tmp_path / "notify"
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        sock.bind(str(path))
        sock.settimeout(2)
        yield {"NOTIFY_SOCKET": str(path), **FAST_WATCHDOG}, sock


def pings(sock: socket.socket, count: int) -> list[str]:
    return [sock.recv(4096).decode() for _ in range(count)]


def silent_for(sock: socket.socket, seconds: float) -> bool:
    """True when nothing arrives for ``seconds``."""
    sock.settimeout(seconds)
    try:
        sock.recv(4096)
    except TimeoutError:
        return True
    finally:
        sock.settimeout(2)
    return False


def drain(sock: socket.socket) -> None:
    while not silent_for(sock, 0.05):
        pass


class SlowScheduler:
    """A Slurm whose next snapshot blocks until released, advancing the loop's clock by ``takes_s``."""

    def __init__(self, clock: ManualClock, takes_s: float = 0.0) -> None:
        self.clock, self.takes_s = clock, takes_s
        self.entered, self.release = threading.Event(), threading.Event()
        self.error: Exception | None = None

    def snapshot(self, include_nodes: bool = True) -> ClusterSnapshot:
        self.entered.set()
        self.release.wait(5)
        self.clock.advance(self.takes_s)
        if self.error is not None:
            raise self.error
        return ClusterSnapshot(taken_at=0.0)


# ------------------------------------------------------------------- the timer and the socket


def test_the_watchdog_is_fed_while_a_slurm_command_is_slow(systemd: tuple[dict[str, str], socket.socket]) -> None:
    env, sock = systemd
    clock = ManualClock()
    heartbeat = Heartbeat(clock.now)
    slurm = SlowScheduler(clock)
    command = threading.Thread(target=StampedScheduler(slurm, heartbeat).snapshot)  # the loop's thread
    with WatchdogTimer(SystemdNotifier(env), heartbeat, STALL_LIMIT_S):
        command.start()
        assert slurm.entered.wait(2)
        assert pings(sock, 3) == ["WATCHDOG=1"] * 3  # fed while the command has not returned
        assert command.is_alive()
        slurm.release.set()
        command.join(2)


def test_a_loop_stuck_past_the_stall_limit_is_no_longer_fed(systemd: tuple[dict[str, str], socket.socket]) -> None:
    env, sock = systemd
    clock = ManualClock()
    heartbeat = Heartbeat(clock.now)
    clock.advance(STALL_LIMIT_S + 1)  # the loop's last sign of life is now older than the limit
    with capture_logs() as logs, WatchdogTimer(SystemdNotifier(env), heartbeat, STALL_LIMIT_S):
        assert silent_for(sock, 0.2)  # systemd's watchdog runs out and it restarts the daemon
        heartbeat.beat()  # unless the loop moves again first
        assert pings(sock, 1) == ["WATCHDOG=1"]
    events = [e["event"] for e in logs]
    assert events.count("watchdog_withheld") == 1 and "watchdog_resumed" in events


def test_a_command_that_never_returns_starves_the_watchdog(systemd: tuple[dict[str, str], socket.socket]) -> None:
    env, sock = systemd
    clock = ManualClock()
    heartbeat = Heartbeat(clock.now)
    slurm = SlowScheduler(clock)
    command = threading.Thread(target=StampedScheduler(slurm, heartbeat).snapshot)
    timer = WatchdogTimer(SystemdNotifier(env), heartbeat, STALL_LIMIT_S)
    command.start()
    assert slurm.entered.wait(2)
    clock.advance(STALL_LIMIT_S + 1)  # stuck inside the command for longer than any timeout allows
    with timer:
        assert silent_for(sock, 0.2)
    slurm.release.set()
    command.join(2)


def test_the_timer_stops_with_its_block(systemd: tuple[dict[str, str], socket.socket]) -> None:
    env, sock = systemd
    with WatchdogTimer(SystemdNotifier(env), Heartbeat(ManualClock().now), STALL_LIMIT_S):
        assert pings(sock, 1) == ["WATCHDOG=1"]
    drain(sock)
    assert silent_for(sock, 0.1)


@pytest.mark.parametrize("env", [{}, {"WATCHDOG_USEC": "20000", "WATCHDOG_PID": "1"}])
def test_no_timer_when_systemd_asked_for_no_watchdog(
    systemd: tuple[dict[str, str], socket.socket], env: dict[str, str]
) -> None:
    address, sock = systemd[0]["NOTIFY_SOCKET"], systemd[1]
    with WatchdogTimer(SystemdNotifier({"NOTIFY_SOCKET": address, **env}), Heartbeat(), STALL_LIMIT_S):
        assert silent_for(sock, 0.1)


def test_one_round_of_the_timer_is_a_plain_call(systemd: tuple[dict[str, str], socket.socket]) -> None:
    env, sock = systemd
    clock = ManualClock()
    timer = WatchdogTimer(SystemdNotifier(env), Heartbeat(clock.now), stall_limit_s=10.0)
    clock.advance(10.0)
    assert timer.ping_if_alive() and pings(sock, 1) == ["WATCHDOG=1"]  # at the limit: still alive
    clock.advance(0.5)
    assert timer.ping_if_alive() is False


# ------------------------------------------------------------------- what stamps the heartbeat


def test_a_slurm_command_stamps_when_it_starts_and_when_it_returns_or_fails() -> None:
    clock = ManualClock()
    heartbeat = Heartbeat(clock.now)
    slurm = SlowScheduler(clock, takes_s=50.0)
    slurm.release.set()
    clock.advance(30.0)
    StampedScheduler(slurm, heartbeat).snapshot()
    assert heartbeat.silence_s() == 0.0
    slurm.error = TransientError("squeue timed out after 20 s")
    clock.advance(30.0)
    with pytest.raises(TransientError):
        StampedScheduler(slurm, heartbeat).snapshot()
    assert heartbeat.silence_s() == 0.0


class StubEngine:
    """Just what ``run_loop`` drives: adopt, tick, and a clock whose wait moves the heartbeat's clock."""

    def __init__(self, monotonic: ManualClock, heartbeat: Heartbeat, ticks: int) -> None:
        self.monotonic, self.heartbeat, self.left = monotonic, heartbeat, ticks
        self.silence_at_tick_start: list[float] = []
        self.clock = self

    def adopt(self) -> list[object]:
        return []

    def tick(self) -> TickResult:
        self.silence_at_tick_start.append(self.heartbeat.silence_s())
        self.monotonic.advance(40.0)  # a long tick
        return TickResult(ok=True)

    def wait(self, seconds: float) -> bool:
        self.monotonic.advance(seconds)
        self.left -= 1
        return self.left == 0  # stop requested


def test_the_loop_stamps_at_each_tick_start_and_end() -> None:
    clock = ManualClock()
    heartbeat = Heartbeat(clock.now)
    engine = StubEngine(clock, heartbeat, ticks=3)
    assert run_loop(engine, Pacing(poll_interval_s=60.0), heartbeat=heartbeat) == 3  # type: ignore[arg-type]
    assert engine.silence_at_tick_start == [0.0, 0.0, 0.0]  # the 60 s waits never count as silence
    assert heartbeat.silence_s() == 60.0  # the last stamp came at the end of the last tick
