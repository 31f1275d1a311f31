"""The listening socket of the daemon's HTTP server and the count of what it holds.

Connections are accepted here, a few per turn of the event loop, and counted before a transport or
a TLS handshake exists: one over a cap takes the place of the longest-idle connection of the same
address (``max_connections_per_peer``) or, when all are taken (``max_connections``), of an address
holding several, else the longest-idle keep-alive connection, else a new one silent for
``FRESH_GRACE_S`` (``Registry``); when none qualifies it is closed at once, before anything is read. A connection
closed to make room is gone from the count at once and its descriptor is released on the loop's
next turn, so the process holds at most the cap plus one turn's accepts (``ACCEPT_BATCH``): the
budget of ``fd_budget`` leaves the rest of RLIMIT_NOFILE to the engine.
"""

from __future__ import annotations

import asyncio
import errno
import resource
import socket
import time
from collections import Counter, OrderedDict
from collections.abc import Callable
from typing import Any

import structlog

from supervisor.adapters.web.messages import Limits
from supervisor.adapters.web.protocol import Connection

log = structlog.get_logger(__name__)

BACKLOG = 128
ACCEPT_BATCH = 32  # accepts per turn of the loop: what may be open beyond the cap for a moment
PAUSE_ON_EXHAUSTION_S = 0.5
# A new connection's time to send its first byte before it may be closed for room. An agent writes
# its report the moment it connects: a tenth of a second is plenty. At 1 s, connections opened and
# left silent by an attacker held their places so long that honest agents' connections were refused
# (bench/ingest_abuse.py: honest p99 894 ms; 26 ms at 0.1 s).
FRESH_GRACE_S = 0.1
_EXHAUSTED = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM})


def fd_budget(limits: Limits) -> int:
    """Connections this process may hold and still leave the engine a quarter of its descriptors
    (at least 256) — files, SQLite, Slurm's clients."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return limits.max_connections
    return max(8, min(limits.max_connections, soft - max(256, soft // 4) - ACCEPT_BATCH))


class Registry:
    """The open connections by address, and the idle ones oldest first.

    Idle comes in two kinds. *Kept*: a keep-alive connection that has answered a request and waits
    for the next — closing it costs its agent one reconnect. *Fresh*: connected, not a byte read
    yet — usually a request on its way (agents connect per report), so one is taken for room only
    once it has been silent for ``FRESH_GRACE_S`` (a client that connects and says nothing then
    still loses its place). Room is made from an address holding more than one connection first,
    then from the longest-idle kept connection, then from the longest-silent fresh one; with 2,048
    agents on their own addresses each choice is O(1) (issue 14).
    """

    def __init__(
        self, total: int, per_peer: int, counters: Counter[str], now: Callable[[], float] = time.monotonic
    ) -> None:
        self.total, self.per_peer, self.counters, self.now = total, per_peer, counters, now
        self.peers: dict[str, dict[Connection, None]] = {}
        self.idle: dict[str, OrderedDict[Connection, None]] = {}
        self.kept: OrderedDict[Connection, None] = OrderedDict()  # idle after answering, oldest first
        self.fresh: OrderedDict[Connection, None] = OrderedDict()  # idle since connecting, oldest first
        self.served: set[Connection] = set()
        self.crowded: dict[str, None] = {}  # addresses holding more than one connection
        self.count = 0

    def admit(self, conn: Connection) -> bool:
        """Count ``conn`` in, making room by closing an idle connection; False: no room."""
        mine = self.peers.setdefault(conn.key, {})
        if len(mine) >= self.per_peer and not self._close_idle(self._oldest_of(conn.key)):
            return False
        if self.count >= self.total and not self._close_idle(self._victim()):
            return False
        mine[conn] = None
        if len(mine) > 1:
            self.crowded[conn.key] = None
        self.count += 1
        return True

    def _victim(self) -> Connection | None:
        """Who makes room: the crowdest address's oldest idle, else the oldest kept, else the
        oldest fresh past its grace."""
        crowded = [ip for ip in self.crowded if ip in self.idle]
        if crowded:
            return self._oldest_of(max(crowded, key=lambda ip: len(self.peers[ip])))
        if self.kept:
            return next(iter(self.kept))
        oldest = next(iter(self.fresh), None)
        if oldest is not None and self.now() - oldest.since >= FRESH_GRACE_S:
            return oldest
        return None

    def _oldest_of(self, ip: str) -> Connection | None:
        idle = self.idle.get(ip)
        if not idle:
            return None
        kept = [c for c in idle if c in self.kept]
        fresh = [c for c in idle if c in self.fresh and self.now() - c.since >= FRESH_GRACE_S]
        return (kept or fresh or list(idle))[0]

    def _close_idle(self, conn: Connection | None) -> bool:
        if conn is None:
            return False
        self.counters["evicted_idle"] += 1
        self.close(conn)
        return True

    def went_idle(self, conn: Connection) -> None:
        self.idle.setdefault(conn.key, OrderedDict())[conn] = None
        (self.kept if conn in self.served else self.fresh)[conn] = None

    def went_busy(self, conn: Connection) -> None:
        self.served.add(conn)
        self.kept.pop(conn, None)
        self.fresh.pop(conn, None)
        idle = self.idle.get(conn.key)
        if idle is not None:
            idle.pop(conn, None)
            if not idle:
                del self.idle[conn.key]

    def close(self, conn: Connection) -> None:
        """Out of the count now; the descriptor goes on the loop's next turn."""
        self.forget(conn)
        if conn.transport is not None:
            conn.transport.abort()

    def forget(self, conn: Connection) -> None:
        mine = self.peers.get(conn.key)
        if mine is not None and conn in mine:
            del mine[conn]
            self.count -= 1
            if len(mine) <= 1:
                self.crowded.pop(conn.key, None)
            if not mine:
                del self.peers[conn.key]
        self.went_busy(conn)
        self.served.discard(conn)

    def all(self) -> list[Connection]:
        return [c for mine in self.peers.values() for c in mine]


def listen(host: str, port: int) -> socket.socket:
    """A non-blocking listening socket on ``host``:``port`` (port 0: any free port)."""
    family, kind, proto, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)[
        0
    ]
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
        sock.listen(BACKLOG)
        sock.setblocking(False)
    except OSError:
        sock.close()
        raise
    return sock


class Acceptor:
    """Accepts on ``sock`` and hands each connection to ``take`` (socket, peer address)."""

    def __init__(
        self, loop: asyncio.AbstractEventLoop, sock: socket.socket, take: Callable[[socket.socket, Any], None]
    ) -> None:
        self.loop, self.sock, self.take = loop, sock, take
        self.failures = 0
        loop.add_reader(sock.fileno(), self._accept)

    def _accept(self) -> None:
        for _ in range(ACCEPT_BATCH):
            try:
                conn, address = self.sock.accept()
            except (BlockingIOError, InterruptedError, ConnectionAbortedError):
                return
            except OSError as exc:
                if exc.errno not in _EXHAUSTED:
                    raise
                self._pause(exc)
                return
            self.take(conn, address)

    def _pause(self, exc: OSError) -> None:
        """Out of descriptors or memory: stop accepting for a moment (as asyncio's own server does)."""
        self.failures += 1
        log.warning("http_accept_paused", error=str(exc), pause_s=PAUSE_ON_EXHAUSTION_S)
        self.loop.remove_reader(self.sock.fileno())
        self.loop.call_later(PAUSE_ON_EXHAUSTION_S, self._resume)

    def _resume(self) -> None:
        if self.sock.fileno() >= 0:
            self.loop.add_reader(self.sock.fileno(), self._accept)

    def close(self) -> None:
        if self.sock.fileno() >= 0:
            self.loop.remove_reader(self.sock.fileno())
            self.sock.close()
