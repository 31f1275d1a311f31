"""Sends report batches to the daemon's ingest over HTTP, buffering while it is unreachable.

The buffer is bounded (``buffer_max`` reports): when it is full the oldest report is dropped and
counted; the count travels in the next accepted batch (``dropped``). A failed send backs off
(doubling from ``backoff_initial_s`` up to ``backoff_max_s``, with jitter) so a thousand agents do
not hammer a daemon that is restarting. A batch the ingest refuses as malformed (400, 413, 422)
is dropped and counted as rejected — sending it again would not help; an authentication refusal
(401, 403, 404: the daemon may not know the run yet) is retried with backoff. The token is sent
as ``Authorization: Bearer`` in its wire form (``domain.wire_auth``: the token itself never
crosses the network) and never logged.

The connection is held only while a flush sends (``keep_alive=False``, the default): an agent
reports every few seconds, and 2,048 agents each holding an idle connection would hold 2,048 of
the daemon's descriptors (systemd's default soft limit is 1,024) for nothing; one connect per
report costs a handshake (issue 14). ``keep_alive=True`` keeps it between flushes (few agents, TLS).

``timeout_s`` bounds each step of a send, the name lookup included: ``socket.create_connection``
would wait on a dead DNS server as long as the resolver likes (a prolog must end within seconds),
so the name is resolved in a helper thread that is given up on at the deadline.
"""

from __future__ import annotations

import http.client
import json
import random
import socket
import threading
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import structlog

from supervisor.agent.daemon_url import daemon_urls, run_endpoint
from supervisor.domain.health.node_report import SCHEMA_VERSION, NodeReport, ReportBatch, to_wire
from supervisor.domain.wire_auth import wire_token

log = structlog.get_logger(__name__)

_DROP_STATUSES = frozenset({400, 413, 422})

AddrInfo = tuple[Any, ...]  # one getaddrinfo entry: (family, type, proto, canonname, sockaddr)
Resolver = Callable[[str, int], Sequence[AddrInfo]]


def system_resolver(host: str, port: int) -> Sequence[AddrInfo]:
    return socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)


def resolve_within(resolve: Resolver, host: str, port: int, timeout: float) -> Sequence[AddrInfo]:
    """``resolve(host, port)`` given up on after ``timeout`` seconds (TimeoutError); the lookup
    itself goes on in a daemon thread, which cannot hold the process."""
    box: list[Sequence[AddrInfo] | BaseException] = []
    done = threading.Event()

    def lookup() -> None:
        try:
            box.append(resolve(host, port))
        except BaseException as exc:  # noqa: BLE001 - handed to the caller below
            box.append(exc)
        finally:
            done.set()

    threading.Thread(target=lookup, name="agent-dns", daemon=True).start()
    if not done.wait(timeout):
        raise TimeoutError(f"looking up {host} took over {timeout:g} s")
    if isinstance(box[0], BaseException):
        raise box[0]
    return box[0]


@dataclass(frozen=True)
class SenderSettings:
    buffer_max: int = 720  # one hour of 5-second samples
    batch_max: int = 64
    timeout_s: float = 5.0
    backoff_initial_s: float = 1.0
    backoff_max_s: float = 60.0
    keep_alive: bool = False  # hold the connection between flushes (see the module's doc)

    def __post_init__(self) -> None:
        if (
            self.buffer_max < 1
            or self.batch_max < 1
            or self.timeout_s <= 0
            or self.backoff_initial_s <= 0
            or self.backoff_max_s < self.backoff_initial_s
        ):
            raise ValueError(
                "buffer_max and batch_max must be >= 1, timeout_s > 0, 0 < backoff_initial_s <= backoff_max_s"
            )


class HttpSender:
    def __init__(
        self,
        url: str,
        run: str,
        token: str,
        node: str,
        settings: SenderSettings | None = None,
        rng: random.Random | None = None,
        resolve: Resolver = system_resolver,
    ) -> None:
        # several login nodes' URLs, the leader at the job's submission first (issue 33 item 4): the
        # one that last took a batch is asked; one that does not answer or stands by (503), the next
        self._endpoints = [run_endpoint(one, "/v1/reports/", run) for one in daemon_urls(url)]
        self._at = 0
        self.run = run
        self._token = wire_token(token)  # what is sent: the token never crosses the network
        self.node = node
        self.settings = settings or SenderSettings()
        self._rng = rng or random.Random()
        self._resolve = resolve
        self._buffer: deque[NodeReport] = deque()
        self._conn: http.client.HTTPConnection | None = None
        self.dropped = 0  # dropped since the last accepted batch (sent with it)
        self.dropped_total = 0
        self.rejected_total = 0
        self.sent_total = 0
        self._delay = 0.0
        self._next_try = 0.0
        self._last_problem: str | None = None
        self.last_rejection: str | None = None  # why the ingest last refused a batch as malformed

    @property
    def pending(self) -> int:
        return len(self._buffer)

    @property
    def problem(self) -> str | None:
        """Why the last send did not go through (None: it did)."""
        return self._last_problem

    def add(self, report: NodeReport) -> None:
        if len(self._buffer) >= self.settings.buffer_max:
            self._buffer.popleft()
            self.dropped += 1
            self.dropped_total += 1
        self._buffer.append(report)

    def flush(self, now: float, *, force: bool = False) -> bool:
        """Send what is buffered, batch by batch; False when the daemon did not take it (backing off).
        ``force`` ignores the backoff (an XID must not wait for it)."""
        if not force and now < self._next_try:
            return False
        try:
            return self._send_all(now)
        finally:
            if not self.settings.keep_alive:
                self.close()  # the agent's side closes: the daemon holds no idle descriptor

    def _send_all(self, now: float) -> bool:
        while self._buffer:
            batch = list(self._buffer)[: self.settings.batch_max]
            status, reason = self._post(batch)
            if status == 200 or status in _DROP_STATUSES:
                for _ in batch:
                    self._buffer.popleft()
                if status == 200:
                    self.sent_total += len(batch)
                    self.dropped = 0
                else:
                    self.rejected_total += len(batch)
                    self.last_rejection = f"{status}: {reason}"
                    log.error("agent_batch_rejected", status=status, reason=reason, reports=len(batch))
                self._delay = 0.0
                self._problem(None)
                continue
            self._delay = min(self.settings.backoff_max_s, max(self.settings.backoff_initial_s, self._delay * 2))
            self._next_try = now + self._delay * self._rng.uniform(0.5, 1.0)
            self._problem(f"{status or 'no answer'}: {reason}")
            return False
        return True

    def _problem(self, problem: str | None) -> None:
        if problem != self._last_problem:
            if problem is None:
                log.info("agent_daemon_reachable", pending=len(self._buffer))
            else:
                log.warning(
                    "agent_send_failed", problem=problem, pending=len(self._buffer), retry_in_s=round(self._delay, 1)
                )
            self._last_problem = problem

    def _body(self, batch: list[NodeReport]) -> bytes:
        wire = to_wire(ReportBatch(v=SCHEMA_VERSION, node=self.node, reports=tuple(batch), dropped=self.dropped))
        return json.dumps(wire, separators=(",", ":")).encode()

    @property
    def path(self) -> str:
        return self._endpoints[self._at][1]

    def _post(self, batch: list[NodeReport]) -> tuple[int, str]:
        """The batch to the daemon that took the last one; to each next login node's daemon in turn
        while one does not answer or stands by (at once: a failover must not wait for the backoff)."""
        for _ in self._endpoints:
            status, reason = self._post_here(batch)
            if status not in (0, 503) or len(self._endpoints) == 1:
                return status, reason
            self.close()
            self._at = (self._at + 1) % len(self._endpoints)
        return status, reason

    def _post_here(self, batch: list[NodeReport]) -> tuple[int, str]:
        body = self._body(batch)
        headers = {"Content-Type": "application/json", "Authorization": f"Bearer {self._token}"}
        for attempt in (1, 2):  # a kept-alive connection the server closed fails once: reconnect
            conn = self._connection()
            try:
                conn.request("POST", self.path, body=body, headers=headers)
                response = conn.getresponse()
                text = response.read(4096).decode(errors="replace")
            except (OSError, http.client.HTTPException) as exc:
                self.close()
                if attempt == 2:
                    return 0, f"{type(exc).__name__}: {exc}"
                continue
            if response.getheader("Connection", "").lower() == "close":
                self.close()
            return response.status, _reason(text)
        return 0, "unreachable"

    def _connection(self) -> http.client.HTTPConnection:
        if self._conn is None:
            p = self._endpoints[self._at][0]
            cls = http.client.HTTPSConnection if p.scheme == "https" else http.client.HTTPConnection
            self._conn = cls(p.hostname or "", p.port, timeout=self.settings.timeout_s)
            self._conn._create_connection = self._connect  # type: ignore[attr-defined]
        return self._conn

    def _connect(self, address: tuple[str, int], timeout: float | None, source: Any = None) -> socket.socket:
        """``socket.create_connection`` with the name lookup bounded by the same timeout."""
        host, port = address
        limit = timeout if timeout is not None else self.settings.timeout_s
        error: OSError = OSError(f"{host} has no address")
        for family, kind, proto, _, sockaddr in resolve_within(self._resolve, host, port, limit):
            sock = socket.socket(family, kind, proto)
            try:
                sock.settimeout(limit)
                sock.connect(sockaddr)
                return sock
            except OSError as exc:
                sock.close()
                error = exc
        raise error

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None


def _reason(text: str) -> str:
    try:
        value = json.loads(text)
    except ValueError:
        return text[:300]
    return str(value.get("error", value))[:300] if isinstance(value, dict) else text[:300]
