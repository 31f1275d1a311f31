"""sd_notify(3) without libsystemd: readiness, stopping, watchdog and status datagrams.

systemd passes ``NOTIFY_SOCKET`` (a path, or ``@name`` for the abstract namespace) to a
``Type=notify`` service, and ``WATCHDOG_USEC``/``WATCHDOG_PID`` when ``WatchdogSec=`` is set.
Outside systemd ``NOTIFY_SOCKET`` is unset and every call does nothing.

:class:`WatchdogTimer` feeds the watchdog from its own thread, every half ``WatchdogSec``, so a
long tick or a slow Slurm command does not get the daemon killed — but only while the main loop
shows progress (its heartbeat is younger than a stall limit), so a deadlocked loop still is.
"""

from __future__ import annotations

import os
import socket
import threading
from collections.abc import Mapping
from types import TracebackType
from typing import Protocol

import structlog

__all__ = ["Liveness", "SystemdNotifier", "WatchdogTimer"]

_log = structlog.get_logger(__name__)


class SystemdNotifier:
    """Tells systemd how the daemon is doing. A failed send is logged, never raised: systemd's
    watchdog will notice a daemon that truly cannot reach it."""

    def __init__(self, environ: Mapping[str, str] | None = None, *, pid: int | None = None) -> None:
        env = os.environ if environ is None else environ
        self._address = _socket_address(env.get("NOTIFY_SOCKET", ""))
        self._watchdog_s = _watchdog_seconds(env, os.getpid() if pid is None else pid)

    @property
    def enabled(self) -> bool:
        """True when running under systemd with a notify socket."""
        return self._address is not None

    def ready(self) -> bool:
        """Start-up is done (``Type=notify``: systemd now calls the service started)."""
        return self.notify("READY=1")

    def stopping(self) -> bool:
        """Shutdown has begun."""
        return self.notify("STOPPING=1")

    def watchdog(self) -> bool:
        """The daemon is alive; send at least every :meth:`watchdog_interval` seconds."""
        return self.notify("WATCHDOG=1")

    def status(self, text: str) -> bool:
        """A one-line status shown by ``systemctl status``."""
        return self.notify("STATUS=" + " ".join(text.splitlines()))

    def watchdog_interval(self) -> float | None:
        """Seconds between watchdog pings (half of ``WATCHDOG_USEC``), or None when not asked for."""
        return self._watchdog_s

    def notify(self, *assignments: str) -> bool:
        """Send ``KEY=value`` lines in one datagram; True when sent, False when disabled or failed."""
        if self._address is None:
            return False
        message = "\n".join(assignments).encode()
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as sock:
                sock.sendto(message, self._address)
        except OSError as error:
            _log.warning("sd_notify_failed", message=assignments, error=str(error))
            return False
        return True


class Liveness(Protocol):
    """The main loop's sign of life (``engine.loop.daemon.Heartbeat``)."""

    def silence_s(self) -> float:
        """Seconds since the loop last showed progress."""
        ...


class WatchdogTimer:
    """Sends ``WATCHDOG=1`` from its own thread every ``interval_s`` (half of ``WATCHDOG_USEC``
    unless given) while the loop's silence is at most ``stall_limit_s``; withholds it after that,
    so systemd kills a loop that is stuck for good within ``stall_limit_s`` + ``WatchdogSec``.
    Does nothing when systemd asked for no watchdog. Use as a context manager around the loop."""

    def __init__(
        self,
        notifier: SystemdNotifier,
        liveness: Liveness,
        stall_limit_s: float,
        interval_s: float | None = None,
    ) -> None:
        self._notifier = notifier
        self._liveness = liveness
        self._stall_limit_s = stall_limit_s
        self._interval_s = notifier.watchdog_interval() if interval_s is None else interval_s
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._withheld = False

    def ping_if_alive(self) -> bool:
        """One round of the timer: True when ``WATCHDOG=1`` was sent."""
        silence_s = self._liveness.silence_s()
        if silence_s > self._stall_limit_s:
            if not self._withheld:
                _log.error(
                    "watchdog_withheld",
                    silence_s=round(silence_s, 1),
                    stall_limit_s=self._stall_limit_s,
                    note="the loop shows no progress; systemd restarts the daemon when its watchdog runs out",
                )
            self._withheld = True
            return False
        if self._withheld:
            _log.warning("watchdog_resumed", silence_s=round(silence_s, 1))
        self._withheld = False
        return self._notifier.watchdog()

    def start(self) -> None:
        if self._interval_s is None or self._thread is not None:
            return
        _log.info("watchdog_timer_started", interval_s=self._interval_s, stall_limit_s=self._stall_limit_s)
        self._thread = threading.Thread(target=self._run, args=(self._interval_s,), name="sd-watchdog", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()

    def _run(self, interval_s: float) -> None:
        while True:
            self.ping_if_alive()
            if self._stop.wait(interval_s):
                return

    def __enter__(self) -> WatchdogTimer:
        self.start()
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None:
        self.stop()


def _socket_address(value: str) -> str | None:
    """The address to send to: a path, an abstract name (leading NUL), or None when unusable."""
    if value.startswith("/"):
        return value
    if value.startswith("@") and len(value) > 1:
        return "\0" + value[1:]
    if value:
        _log.warning("sd_notify_unsupported_socket", notify_socket=value)
    return None


def _watchdog_seconds(env: Mapping[str, str], pid: int) -> float | None:
    """Half of ``WATCHDOG_USEC`` in seconds, as sd_watchdog_enabled(3) advises; None when unset,
    malformed, zero, or meant for another process (``WATCHDOG_PID``)."""
    usec = env.get("WATCHDOG_USEC", "")
    watchdog_pid = env.get("WATCHDOG_PID", "")
    if not usec.isdigit() or int(usec) == 0:
        return None
    if watchdog_pid and (not watchdog_pid.isdigit() or int(watchdog_pid) != pid):
        return None
    return int(usec) / 2 / 1_000_000
