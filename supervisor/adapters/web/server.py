"""The daemon's HTTP/1.1 server: asyncio with httptools' parser, on its own thread and event loop
(docs/adr/0003-hand-written-http-server.md says why it is not uvicorn or aiohttp). Routes are
mounted by path prefix; a handler takes a ``Request`` and returns a ``Response``. The ingest
(``supervisor.adapters.web.ingest``) and the pages are routes.

Nothing a client sends stops the server or the daemon around it: each connection is bounded as
``supervisor.adapters.web.protocol`` describes, and the server bounds the connections:

* counted as they are accepted (``supervisor.adapters.web.listener``): at most ``max_connections``
  in all — never more than RLIMIT_NOFILE allows after a reserve for the engine — and
  ``max_connections_per_peer`` from one address; one over a cap takes the place of the
  longest-idle connection (of that address, or of the address holding the most) or is closed at
  once. A connection counts as idle from its connection to its first byte;
* a reaper closes connections past their deadline (a request not read and answered within
  ``request_deadline_s`` of its first byte, or its head not read within ``head_deadline_s``) or
  idle for ``idle_timeout_s``;
* routes mounted ``blocking`` (the pages) run one at a time on a worker thread, at most
  ``max_pending_pages`` waiting (503 beyond);
* TLS, when given an ``ssl.SSLContext``: the handshake (within ``request_deadline_s``) runs on a
  connection already counted.
"""

from __future__ import annotations

import asyncio
import socket
import ssl
import threading
from collections import Counter
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import structlog

from supervisor.adapters.web.listener import Acceptor, Registry, fd_budget, listen
from supervisor.adapters.web.messages import Gate, Handler, Limits, Request, Response, Route, answer, error
from supervisor.adapters.web.protocol import Connection

log = structlog.get_logger(__name__)

REAP_EVERY_S = 0.5


class Router:
    """Longest matching path prefix wins."""

    def __init__(self) -> None:
        self._routes: list[tuple[str, Route]] = []

    def mount(self, prefix: str, handler: Handler, *, blocking: bool = False, gate: Gate | None = None) -> None:
        self._routes.append((prefix, Route(handler, blocking, gate)))
        self._routes.sort(key=lambda r: len(r[0]), reverse=True)

    def find(self, path: str) -> Route | None:
        for prefix, route in self._routes:
            if path == prefix or path.startswith(prefix if prefix.endswith("/") else prefix + "/"):
                return route
        return None

    def dispatch(self, request: Request) -> Response:
        """Answer in this thread (gates included): for callers outside the server."""
        route = self.find(request.path)
        if route is None:
            return error(404, f"no such path: {request.path[:200]}")
        refused = route.gate(request) if route.gate is not None else None
        return refused or answer(route, request)


class HttpServer:
    """The HTTP server on its own thread. ``start()`` binds (port 0: any free port; see ``port``).

    ``counters`` counts refusals by status (``rejected_413``...), connections refused
    (``refused_connections``), evicted (``evicted_idle``) and closed (``closed_deadline``,
    ``closed_idle``); pass a shared Counter to merge them with a route's.
    """

    def __init__(
        self,
        host: str = "127.0.0.1",
        port: int = 8471,
        max_body: int = 1 << 20,
        counters: Counter[str] | None = None,
        *,
        limits: Limits | None = None,
        ssl_context: ssl.SSLContext | None = None,
    ) -> None:
        self.host, self.port, self.max_body = host, port, max_body
        self.counters: Counter[str] = Counter() if counters is None else counters
        self.limits = limits or Limits()
        self.ssl = ssl_context
        self.router = Router()
        self._registry = Registry(self.limits.max_connections, self.limits.max_connections_per_peer, self.counters)
        self._connecting: set[asyncio.Task[None]] = set()
        self._closers: list[Callable[[], None]] = []
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._pages: ThreadPoolExecutor | None = None
        self._pending = 0

    def on_stop(self, close: Callable[[], None]) -> None:
        """Call ``close`` when the server stops (a route's resources)."""
        self._closers.append(close)

    def mount(self, prefix: str, handler: Handler, *, blocking: bool = False, gate: Gate | None = None) -> None:
        """Add a route; ``blocking`` handlers run on the worker thread, ``gate`` first on the loop."""
        self.router.mount(prefix, handler, blocking=blocking, gate=gate)

    # ------------------------------------------------------------------ what connections call
    def route(self, path: str) -> Route | None:
        return self.router.find(path)

    def offload(self, route: Route, request: Request) -> Future[Response] | None:
        if self._pages is None or self._pending >= self.limits.max_pending_pages:
            return None
        self._pending += 1
        future = self._pages.submit(answer, route, request)
        future.add_done_callback(self._page_done)
        return future

    def _page_done(self, _: object) -> None:
        loop = self._loop
        if loop is None or loop.is_closed():
            return  # a page finished after the server stopped: nothing left to count
        try:
            loop.call_soon_threadsafe(self._count_done)
        except RuntimeError:  # the loop closed between the look and the call: the same
            return

    def _count_done(self) -> None:
        self._pending -= 1

    def take(self, sock: socket.socket, address: Any) -> None:
        """A connection just accepted: counted (or closed at once), then connected (TLS: handshake)."""
        assert self._loop is not None
        conn = Connection(self, address)
        conn.since = self.now()
        if not self._registry.admit(conn):
            self.counters["refused_connections"] += 1
            sock.close()
            return
        task = self._loop.create_task(self._connect(conn, sock))
        self._connecting.add(task)
        task.add_done_callback(self._connecting.discard)

    async def _connect(self, conn: Connection, sock: socket.socket) -> None:
        assert self._loop is not None
        handshake = self.limits.request_deadline_s if self.ssl is not None else None
        try:
            await self._loop.connect_accepted_socket(lambda: conn, sock, ssl=self.ssl, ssl_handshake_timeout=handshake)
        except (OSError, TimeoutError) as exc:  # ssl.SSLError and ConnectionError are OSErrors
            self.counters["tls_failed" if self.ssl is not None else "connect_failed"] += 1
            log.info("http_connect_failed", peer=conn.peer, error=f"{type(exc).__name__}: {str(exc)[:200]}")
            self._registry.forget(conn)
            sock.close()

    def went_busy(self, conn: Connection) -> None:
        conn.idle, conn.since = False, self.now()
        self._registry.went_busy(conn)

    def went_idle(self, conn: Connection) -> None:
        if not conn.idle:
            conn.idle, conn.since = True, self.now()
            self._registry.went_idle(conn)

    def forget(self, conn: Connection) -> None:
        self._registry.forget(conn)

    def now(self) -> float:
        assert self._loop is not None
        return self._loop.time()

    @property
    def connections(self) -> int:
        return self._registry.count

    # ------------------------------------------------------------------ the reaper
    def _reap(self) -> None:
        assert self._loop is not None
        now, limits = self.now(), self.limits
        for conn in self._registry.all():
            if conn.transport is None:
                continue  # still connecting: TLS's handshake has the same deadline
            idle_for = now - conn.since
            if conn.idle and idle_for > limits.idle_timeout_s:
                self._close(conn, "closed_idle")
            elif not conn.idle and idle_for > limits.request_deadline_s:
                self._close(conn, "closed_deadline")
            elif not conn.idle and conn.in_head and idle_for > limits.head_deadline_s:
                self._close(conn, "closed_head_deadline")
        self._loop.call_later(REAP_EVERY_S, self._reap)

    def _close(self, conn: Connection, why: str) -> None:
        self.counters[why] += 1
        self._registry.close(conn)

    # ------------------------------------------------------------------ the thread
    def start(self) -> None:
        self._registry.total = fd_budget(self.limits)
        self._registry.per_peer = self.limits.max_connections_per_peer
        if self._registry.total < self.limits.max_connections:
            log.warning("http_connections_capped_by_nofile", max_connections=self._registry.total)
        self._pages = ThreadPoolExecutor(max_workers=1, thread_name_prefix="http-pages")
        ready = threading.Event()
        failure: list[BaseException] = []
        self._thread = threading.Thread(target=self._run, args=(ready, failure), name="ingest", daemon=True)
        self._thread.start()
        ready.wait()
        if failure:
            raise OSError(f"ingest cannot listen on {self.host}:{self.port}: {failure[0]}") from failure[0]
        log.info("ingest_listening", host=self.host, port=self.port, tls=self.ssl is not None)

    def _run(self, ready: threading.Event, failure: list[BaseException]) -> None:
        loop = asyncio.new_event_loop()
        self._loop = loop
        try:
            sock = listen(self.host, self.port)
        except BaseException as exc:  # noqa: BLE001 - handed to start()'s caller
            failure.append(exc)
            ready.set()
            loop.close()
            return
        self.port = sock.getsockname()[1]
        acceptor = Acceptor(loop, sock, self.take)
        loop.call_later(REAP_EVERY_S, self._reap)
        ready.set()
        loop.run_forever()
        acceptor.close()
        for conn in self._registry.all():
            self._registry.close(conn)
        for task in list(self._connecting):
            task.cancel()
        loop.run_until_complete(asyncio.sleep(0))
        loop.close()

    def stop(self) -> None:
        if self._loop is not None and self._thread is not None and self._thread.is_alive():
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(10)
        if self._pages is not None:
            self._pages.shutdown(wait=False, cancel_futures=True)
        for close in self._closers:
            close()


def server_tls(cert_file: str, key_file: str) -> ssl.SSLContext:
    """A server-side TLS context (TLS 1.2 or later) from PEM files; raises OSError or ssl.SSLError."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.load_cert_chain(cert_file, key_file)
    return context


__all__ = ["HttpServer", "Limits", "Request", "Response", "Router", "error", "fd_budget", "server_tls"]
