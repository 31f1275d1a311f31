"""The daemon's HTTP/1.1 server: asyncio with httptools' parser (keep-alive, pipelining), on its
own thread and event loop. Routes are mounted by path prefix; a handler takes a ``Request`` and
returns a ``Response``. The ingest (``supervisor.adapters.ingest``) and the pages are routes.

Nothing a client sends stops the server: bounded request line, headers and body, an idle timer,
and a handler's exception answered with 500.
"""

from __future__ import annotations

import asyncio
import json
import threading
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import httptools
import structlog

log = structlog.get_logger(__name__)

MAX_URL = 2048
MAX_HEADERS = 64
MAX_HEADER_BYTES = 16384
IDLE_TIMEOUT_S = 75.0


@dataclass(frozen=True)
class Request:
    method: str
    path: str
    query: str
    headers: Mapping[str, str]  # names in lower case
    body: bytes
    peer: str


@dataclass(frozen=True)
class Response:
    status: int
    body: bytes = b""
    content_type: str = "application/json"
    headers: Mapping[str, str] = field(default_factory=dict)


Handler = Callable[[Request], Response]

_REASONS = {
    200: "OK",
    400: "Bad Request",
    401: "Unauthorized",
    403: "Forbidden",
    404: "Not Found",
    405: "Method Not Allowed",
    411: "Length Required",
    413: "Payload Too Large",
    422: "Unprocessable Entity",
    431: "Request Header Fields Too Large",
    500: "Internal Server Error",
    503: "Service Unavailable",
}


def error(status: int, reason: str) -> Response:
    return Response(status, json.dumps({"error": reason}).encode())


class Router:
    """Longest matching path prefix wins."""

    def __init__(self) -> None:
        self._routes: list[tuple[str, Handler]] = []

    def mount(self, prefix: str, handler: Handler) -> None:
        self._routes.append((prefix, handler))
        self._routes.sort(key=lambda r: len(r[0]), reverse=True)

    def dispatch(self, request: Request) -> Response:
        for prefix, handler in self._routes:
            if request.path == prefix or request.path.startswith(prefix if prefix.endswith("/") else prefix + "/"):
                return handler(request)
        return error(404, f"no such path: {request.path[:200]}")


class _Connection(asyncio.Protocol):
    """One client connection: httptools parses, the router answers, in order (pipelining safe)."""

    def __init__(self, server: HttpServer) -> None:
        self.server = server
        self.parser = httptools.HttpRequestParser(self)
        self.transport: asyncio.Transport | None = None
        self.peer = "?"
        self._reset()
        self._idle: asyncio.TimerHandle | None = None

    def _reset(self) -> None:
        self.url = b""
        self.headers: dict[str, str] = {}
        self.header_bytes = 0
        self.body: list[bytes] = []
        self.body_len = 0
        self.refused: Response | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        peer = transport.get_extra_info("peername")
        self.peer = f"{peer[0]}:{peer[1]}" if isinstance(peer, tuple) else str(peer)
        self._arm_idle()

    def connection_lost(self, exc: Exception | None) -> None:
        if self._idle is not None:
            self._idle.cancel()
        self.transport = None

    def _arm_idle(self) -> None:
        if self._idle is not None:
            self._idle.cancel()
        loop = asyncio.get_running_loop()
        self._idle = loop.call_later(IDLE_TIMEOUT_S, self._close)

    def _close(self) -> None:
        if self.transport is not None:
            self.transport.close()

    def data_received(self, data: bytes) -> None:
        self._arm_idle()
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            self._send(error(400, "protocol upgrades are not supported"), keep_alive=False)
        except httptools.HttpParserError as exc:
            self.server.counters["rejected_400"] += 1
            self._send(error(400, f"malformed HTTP request: {exc}"), keep_alive=False)

    # httptools callbacks
    def on_message_begin(self) -> None:
        self._reset()

    def on_url(self, url: bytes) -> None:
        self.url += url
        if len(self.url) > MAX_URL:
            self.refused = error(431, f"request line longer than {MAX_URL} bytes")

    def on_header(self, name: bytes, value: bytes) -> None:
        self.header_bytes += len(name) + len(value)
        if len(self.headers) >= MAX_HEADERS or self.header_bytes > MAX_HEADER_BYTES:
            self.refused = self.refused or error(431, "too many or too large headers")
            return
        self.headers[name.decode("latin-1").lower()] = value.decode("latin-1")

    def on_headers_complete(self) -> None:
        length = self.headers.get("content-length")
        limit = self.server.max_body
        if length is not None and length.isdigit() and int(length) > limit:
            self.refused = self.refused or error(413, f"body of {length} bytes is over the {limit}-byte limit")
        if self.refused is not None:  # answer now and hang up: do not read a body we refuse
            self.server.counters[f"rejected_{self.refused.status}"] += 1
            self._send(self.refused, keep_alive=False)

    def on_body(self, body: bytes) -> None:
        if self.refused is not None:
            return
        self.body_len += len(body)
        if self.body_len > self.server.max_body:
            self.refused = error(413, f"body over the {self.server.max_body}-byte limit")
            self.body.clear()
            self.server.counters["rejected_413"] += 1
            self._send(self.refused, keep_alive=False)
        else:
            self.body.append(body)

    def on_message_complete(self) -> None:
        method = self.parser.get_method().decode("latin-1")
        if self.refused is not None or self.transport is None or self.transport.is_closing():
            return  # already answered (refused) and closing
        parsed = httptools.parse_url(self.url)
        path = (parsed.path or b"/").decode("latin-1")
        request = Request(
            method, path, (parsed.query or b"").decode("latin-1"), self.headers, b"".join(self.body), self.peer
        )
        try:
            response = self.server.router.dispatch(request)
        except Exception:  # noqa: BLE001 - a handler's bug must not take the server down
            log.exception("ingest_handler_failed", path=path[:200])
            response = error(500, "internal error (see the daemon's log)")
        self._send(response, keep_alive=self.parser.should_keep_alive())

    def _send(self, response: Response, *, keep_alive: bool) -> None:
        if self.transport is None or self.transport.is_closing():
            return
        head = [
            f"HTTP/1.1 {response.status} {_REASONS.get(response.status, 'Status')}",
            f"Content-Type: {response.content_type}",
            f"Content-Length: {len(response.body)}",
        ]
        head += [f"{k}: {v}" for k, v in response.headers.items()]
        if not keep_alive:
            head.append("Connection: close")
        self.transport.write(("\r\n".join(head) + "\r\n\r\n").encode("latin-1") + response.body)
        if not keep_alive:
            self.transport.close()


class HttpServer:
    """The HTTP server on its own thread. ``start()`` binds (port 0: any free port; see ``port``).

    ``counters`` counts refusals by status (``rejected_413``...); pass a shared Counter to merge
    them with a route's own.
    """

    def __init__(
        self,
        host: str = "127.0.0.1",
        port: int = 8471,
        max_body: int = 1 << 20,
        counters: Counter[str] | None = None,
    ) -> None:
        self.host = host
        self.port = port
        self.max_body = max_body
        self.counters: Counter[str] = Counter() if counters is None else counters
        self.router = Router()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._server: asyncio.AbstractServer | None = None
        self._thread: threading.Thread | None = None

    def mount(self, prefix: str, handler: Handler) -> None:
        self.router.mount(prefix, handler)

    def start(self) -> None:
        ready = threading.Event()
        failure: list[BaseException] = []

        def run() -> None:
            loop = asyncio.new_event_loop()
            self._loop = loop
            try:
                self._server = loop.run_until_complete(
                    loop.create_server(lambda: _Connection(self), self.host, self.port, reuse_address=True)
                )
                self.port = self._server.sockets[0].getsockname()[1]
            except BaseException as exc:  # noqa: BLE001 - handed to start()'s caller
                failure.append(exc)
                ready.set()
                loop.close()
                return
            ready.set()
            loop.run_forever()
            self._server.close()
            loop.run_until_complete(self._server.wait_closed())
            loop.close()

        self._thread = threading.Thread(target=run, name="ingest", daemon=True)
        self._thread.start()
        ready.wait()
        if failure:
            raise OSError(f"ingest cannot listen on {self.host}:{self.port}: {failure[0]}") from failure[0]
        log.info("ingest_listening", host=self.host, port=self.port)

    def stop(self) -> None:
        if self._loop is not None and self._thread is not None and self._thread.is_alive():
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(10)
