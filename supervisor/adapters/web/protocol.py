"""One connection of the daemon's HTTP/1.1 server (``supervisor.adapters.web.server``): httptools
parses, and everything a client can make the server hold is bounded (``Limits``):

* the request line (``max_url_bytes``: 414) and the whole head (request line and headers,
  ``max_head_bytes``: 431) are counted as the bytes arrive, so an endless line or header is refused
  and the connection closed the moment it passes the cap, never buffered whole; at most
  ``max_headers`` headers (431); a body over ``max_body`` is refused from its Content-Length,
  unread, or as soon as a chunked body passes it (413);
* one request in flight: while a request is being answered the connection is not read, so
  pipelined requests wait in the client's socket (at most ``max_pipelined`` parsed ones from one
  read; more, and the connection is closed after answering those);
* write backpressure: once a connection's unsent answers pass ``write_buffer_bytes``
  (``pause_writing``), it gets no further answer and is not read until the client reads; a large
  answer is handed to the transport ``STREAM_CHUNK`` bytes at a time, as the client reads it;
* deadlines, enforced by the server's reaper from ``since``: a request must be read and answered
  within ``request_deadline_s`` of its first byte (not re-armed by each byte), its head within
  ``head_deadline_s``, and an idle
  keep-alive connection is closed after ``idle_timeout_s``;
* handlers of routes mounted ``blocking`` (pages) run on the server's worker thread, never on the
  event loop; a handler's exception is a 500.
"""

from __future__ import annotations

import asyncio
from collections import Counter, deque
from concurrent.futures import Future
from typing import Any, Protocol

import httptools
import structlog

from supervisor.adapters.web.messages import Limits, Request, Response, Route, answer, error, head
from supervisor.adapters.web.peers import peer_key

log = structlog.get_logger(__name__)

STREAM_CHUNK = 256 * 1024  # a larger answer is written piece by piece, as the client reads


class Host(Protocol):
    """What a connection needs from its server."""

    limits: Limits
    max_body: int
    counters: Counter[str]

    def route(self, path: str) -> Route | None: ...
    def offload(self, route: Route, request: Request) -> Future[Response] | None: ...
    def went_busy(self, conn: Connection) -> None: ...
    def went_idle(self, conn: Connection) -> None: ...
    def forget(self, conn: Connection) -> None: ...
    def now(self) -> float: ...


def _target(url: bytes) -> tuple[str, str]:
    """(path, query) of a request target: origin form (``/p?q``) directly, others parsed."""
    if url.startswith(b"/"):
        path, _, query = url.partition(b"#")[0].partition(b"?")
        return path.decode("latin-1"), query.decode("latin-1")
    try:
        parsed = httptools.parse_url(url)
    except httptools.HttpParserInvalidURLError:
        raise _Stop(error(400, "malformed request target")) from None
    return (parsed.path or b"/").decode("latin-1"), (parsed.query or b"").decode("latin-1")


class _Stop(Exception):
    """Raised from a parser callback: stop reading this connection (answer ``response`` last)."""

    def __init__(self, response: Response | None) -> None:
        self.response = response


class Connection(asyncio.Protocol):
    """One accepted connection, already counted by the server (``http_listener``) before its
    transport (or TLS handshake) exists; ``address`` is the peer's socket address."""

    def __init__(self, host: Host, address: Any) -> None:
        self.host, self.limits = host, host.limits
        self.parser = httptools.HttpRequestParser(self)
        self.transport: Any = None  # set once connected (after the TLS handshake, with TLS)
        peer = address if isinstance(address, tuple) else (str(address), 0)
        self.ip, self.peer = str(peer[0]), f"{peer[0]}:{peer[1]}"
        self.key = peer_key(self.ip, self.limits.node_networks)  # what the per-peer cap counts (web.peers)
        self.queue: deque[tuple[Request | Response, bool]] = deque()  # parsed, not yet answered
        self.in_flight = self.write_paused = self.read_paused = self.done = False
        self.idle, self.since = False, 0.0  # the reaper's view; ``since``: the last progress
        self.in_head, self.mid, self.head_bytes = True, False, 0
        self.url, self.body_len = b"", 0
        self.headers: dict[str, str] = {}
        self.body: list[bytes] = []
        self._out: memoryview | None = None  # the rest of a large answer, written as the client reads
        self._out_keep = True

    # ------------------------------------------------------------------ transport events
    def connection_made(self, transport: Any) -> None:
        self.transport = transport
        transport.set_write_buffer_limits(high=self.limits.write_buffer_bytes)
        self.host.went_idle(self)  # waiting for its first request: the longest-idle may be evicted

    def connection_lost(self, exc: Exception | None) -> None:
        self.done, self.transport = True, None
        self.host.forget(self)

    def eof_received(self) -> bool:
        """The client will send no more: answer what it sent, then close (TLS cannot half-close)."""
        self._stop(None)
        self._flow()
        return not self.tls and self.transport is not None and not self.transport.is_closing()

    def pause_writing(self) -> None:
        self.write_paused = True
        self._flow()

    def resume_writing(self) -> None:
        self.write_paused = False
        # Not from inside the transport's write: closing there makes asyncio call connection_lost
        # twice (CPython gh-156512).
        asyncio.get_running_loop().call_soon(self._resumed)

    def _resumed(self) -> None:
        if self._out is not None:
            self._write_out()
        self._pump()

    @property
    def tls(self) -> bool:
        return self.transport is not None and self.transport.get_extra_info("sslcontext") is not None

    def data_received(self, data: bytes) -> None:
        if self.done:
            return
        if self.idle:
            self.host.went_busy(self)
        try:
            self._feed(data)
        except _Stop as stop:
            self._stop(stop.response)
        except httptools.HttpParserCallbackError as exc:
            cause = exc.__context__
            self._stop(cause.response if isinstance(cause, _Stop) else error(500, "internal error"))
        except httptools.HttpParserUpgrade:
            self._stop(error(400, "protocol upgrades are not supported"))
        except httptools.HttpParserError as exc:
            self._stop(error(400, f"malformed HTTP request: {str(exc)[:200]}"))
        self._pump()

    def _feed(self, data: bytes) -> None:
        """Feed the parser, counting head bytes as they come so a head is never held past the cap
        (a head that starts inside a read after a body is counted from the next read: at most one
        read, 256 KiB, more)."""
        cap = self.limits.max_head_bytes
        while data:
            room = cap - self.head_bytes
            if not self.in_head or len(data) <= room:
                self.head_bytes += len(data) if self.in_head else 0
                self.parser.feed_data(data)
                return
            self.head_bytes = cap
            self.parser.feed_data(data[:room])
            if self.in_head and self.head_bytes >= cap:  # the same head, still going
                raise _Stop(error(431, f"request line and headers over {cap} bytes"))
            data = data[room:]

    # ------------------------------------------------------------------ httptools callbacks
    def on_message_begin(self) -> None:
        self.in_head, self.mid = True, True
        self.url, self.headers, self.body, self.body_len = b"", {}, [], 0

    def on_url(self, url: bytes) -> None:
        self.url += url
        if len(self.url) > self.limits.max_url_bytes:
            raise _Stop(error(414, f"request line longer than {self.limits.max_url_bytes} bytes"))

    def on_header(self, name: bytes, value: bytes) -> None:
        if len(self.headers) >= self.limits.max_headers:
            raise _Stop(error(431, f"more than {self.limits.max_headers} headers"))
        self.headers[name.decode("latin-1").lower()] = value.decode("latin-1")

    def on_headers_complete(self) -> None:
        self.in_head, self.head_bytes = False, 0
        length = self.headers.get("content-length")
        if length is not None and length.isdigit() and int(length) > self.host.max_body:
            raise _Stop(error(413, f"body of {length} bytes is over the {self.host.max_body}-byte limit"))

    def on_body(self, body: bytes) -> None:
        self.body_len += len(body)
        if self.body_len > self.host.max_body:
            raise _Stop(error(413, f"body over the {self.host.max_body}-byte limit"))
        self.body.append(body)

    def on_message_complete(self) -> None:
        self.mid = False
        path, query = _target(self.url)
        method = self.parser.get_method().decode("latin-1")
        body = self.body[0] if len(self.body) == 1 else b"".join(self.body)
        self.queue.append(
            (Request(method, path, query, self.headers, body, self.peer), self.parser.should_keep_alive())
        )
        if len(self.queue) > self.limits.max_pipelined:
            raise _Stop(None)

    # ------------------------------------------------------------------ answering, in order
    def _stop(self, response: Response | None) -> None:
        """Read no more; answer what is queued, then ``response`` (a refusal), then close."""
        self.done = True
        if response is not None:
            self.host.counters[f"rejected_{response.status}"] += 1
            self.queue.append((response, False))
        elif self.queue:
            last, _ = self.queue.pop()
            self.queue.append((last, False))

    def _pump(self) -> None:
        while self.queue and not self.in_flight and not self.write_paused and self.transport is not None:
            item, keep_alive = self.queue.popleft()
            if isinstance(item, Response):
                self._send(item, keep_alive)
            else:
                self._dispatch(item, keep_alive)
        self._flow()

    def _dispatch(self, request: Request, keep_alive: bool) -> None:
        route = self.host.route(request.path)
        refused = error(404, f"no such path: {request.path[:200]}") if route is None else None
        if route is not None and route.gate is not None:
            refused = route.gate(request)
        if refused is not None or route is None:
            self._send(refused or error(404, "no such path"), keep_alive)
        elif not route.blocking:
            self._send(answer(route, request), keep_alive)
        else:
            self._offload(route, request, keep_alive)

    def _offload(self, route: Route, request: Request, keep_alive: bool) -> None:
        future = self.host.offload(route, request)
        if future is None:
            self.host.counters["rejected_503"] += 1
            self._send(error(503, "too many page requests waiting; try again"), keep_alive)
            return
        self.in_flight = True
        asyncio.wrap_future(future).add_done_callback(lambda f: self._answered(f, keep_alive))

    def _answered(self, future: asyncio.Future[Response], keep_alive: bool) -> None:
        self.in_flight = False
        if not future.cancelled():
            self._send(future.result(), keep_alive)
        self._pump()

    def _send(self, response: Response, keep_alive: bool) -> None:
        transport = self.transport
        if transport is None or transport.is_closing():
            return
        if len(response.body) <= STREAM_CHUNK:
            transport.write(head(response, keep_alive) + response.body)
            self._sent(keep_alive)
        else:  # a page: written as the client reads it, never copied whole into the transport
            transport.write(head(response, keep_alive))
            self.in_flight, self._out, self._out_keep = True, memoryview(response.body), keep_alive
            self._write_out()

    def _write_out(self) -> None:
        out, transport = self._out, self.transport
        while out is not None and transport is not None and not self.write_paused and not transport.is_closing():
            transport.write(out[:STREAM_CHUNK])
            out = out[STREAM_CHUNK:] if len(out) > STREAM_CHUNK else None
        self._out = out
        if out is None and self.in_flight and transport is not None:
            self.in_flight = False
            self._sent(self._out_keep)

    def _sent(self, keep_alive: bool) -> None:
        if not keep_alive:
            self.done = True
            if self.transport is not None:
                self.transport.close()
        else:
            self.since = self.host.now()  # progress: the next request's deadline starts now

    def _flow(self) -> None:
        """Read only while nothing waits to be answered or read by the client."""
        transport = self.transport
        if transport is None:
            return
        if transport.is_closing():
            return
        if self.done and not self.queue and not self.in_flight:
            transport.close()  # all answered (the last one may still be flushing)
            return
        busy = bool(self.queue) or self.in_flight or self.write_paused or self.done
        if busy != self.read_paused:
            (transport.pause_reading if busy else transport.resume_reading)()
            self.read_paused = busy
        if not busy and not self.mid:
            self.host.went_idle(self)
