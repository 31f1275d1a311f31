"""sd_notify(3) without libsystemd: readiness, stopping, watchdog and status datagrams.

systemd passes ``NOTIFY_SOCKET`` (a path, or ``@name`` for the abstract namespace) to a
``Type=notify`` service, and ``WATCHDOG_USEC``/``WATCHDOG_PID`` when ``WatchdogSec=`` is set.
Outside systemd ``NOTIFY_SOCKET`` is unset and every call does nothing.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Mapping

import structlog

__all__ = ["SystemdNotifier"]

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
