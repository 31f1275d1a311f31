"""The daemon's ingest: node agents and hooks POST their reports here; findings go to the engine.

``POST /v1/reports/RUN`` with ``Authorization: Bearer TOKEN`` (the run's token, compared in
constant time) and a JSON ``ReportBatch`` body (``supervisor.domain.node_report``). Answers:

* 200 ``{"accepted": N, "duplicates": D, "findings": F}``;
* 400 malformed JSON or wrong types, 422 a well-formed batch that breaks the schema's rules,
  401 no bearer token, 403 a token that is not this run's, 404 an unknown run or path,
  405 another method, 411/413 a body without a length or over ``max_body`` bytes — each with the
  reason as ``{"error": "..."}`` and a counter; nothing a client sends stops the server.

Accepted reports are judged by ``HealthRules`` at once (the time of receipt, from the injected
clock, stamps the findings); findings wait in a bounded queue for the engine's tick
(``drain_findings``), and each node's last report time feeds ``heartbeat_ages``: this class
implements the ``HealthFeed`` port. Other routes (``/metrics``, the logbook) are added with
``mount(prefix, handler)``; a handler takes a ``Request`` and returns a ``Response``.

The server is asyncio with httptools' HTTP/1.1 parser (keep-alive, pipelining), on its own thread
and event loop: one core serves well over 10,000 8-GPU reports a second (``bench/ingest.py``).
"""

from __future__ import annotations

import asyncio
import hmac
import json
import re
import threading
from collections import Counter, deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import httptools
import msgspec
import structlog

from supervisor.domain.gpu_health import HealthRules
from supervisor.domain.health import NodeFinding
from supervisor.domain.node_report import ReportBatch, check_batch
from supervisor.ports import Clock

log = structlog.get_logger(__name__)

REPORTS_PREFIX = "/v1/reports/"
_RUN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
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


class ReportIngest:
    """Authenticates, validates and judges report batches; the engine's HealthFeed."""

    def __init__(
        self, tokens: Mapping[str, str], rules: HealthRules, clock: Clock, max_findings: int = 100_000
    ) -> None:
        self.tokens = tokens  # run -> token (a TokenStore-like mapping; read on every request)
        self.rules = rules
        self.clock = clock
        self.counters: Counter[str] = Counter()
        self._decoder = msgspec.json.Decoder(ReportBatch)
        self._lock = threading.Lock()
        self._findings: deque[NodeFinding] = deque(maxlen=max_findings)
        self._seen: dict[str, tuple[float, str | None, float]] = {}  # node -> (received, run, interval)
        self._last: dict[str, tuple[int, float]] = {}  # node -> (seq, at) of its last accepted report

    # ------------------------------------------------------------------ HealthFeed
    def drain_findings(self) -> list[NodeFinding]:
        with self._lock:
            found = list(self._findings)
            self._findings.clear()
        return found

    def heartbeat_ages(self, now: float) -> Mapping[str, float]:
        with self._lock:
            return {node: max(0.0, now - at) for node, (at, _, _) in self._seen.items()}

    def heartbeat_intervals(self) -> Mapping[str, float]:
        """Per node: the sample interval its agent announced (0 when a hook reported)."""
        with self._lock:
            return {node: interval for node, (_, _, interval) in self._seen.items()}

    def forget_run(self, run: str) -> None:
        """Stop tracking the nodes whose last report came with ``run``'s token (the run ended)."""
        with self._lock:
            for node in [n for n, (_, r, _) in self._seen.items() if r == run]:
                del self._seen[node]
                self._last.pop(node, None)
                self.rules.forget(node)

    # ------------------------------------------------------------------ the route
    def handle(self, request: Request) -> Response:
        self.counters["requests"] += 1
        response = self._handle(request)
        if response.status != 200:
            self.counters[f"rejected_{response.status}"] += 1
        return response

    def _handle(self, request: Request) -> Response:
        run = request.path[len(REPORTS_PREFIX) :]
        if not _RUN.match(run):
            return error(404, "POST reports to /v1/reports/RUN (RUN: the run's name)")
        if request.method != "POST":
            return error(405, "reports are sent with POST")
        denied = self._authenticate(run, request.headers.get("authorization", ""))
        if denied is not None:
            return denied
        try:
            batch = self._decoder.decode(request.body)
        except (msgspec.ValidationError, msgspec.DecodeError) as exc:
            return error(400, f"malformed report batch: {str(exc)[:300]}")
        problem = check_batch(batch)
        if problem is not None:
            return error(422, problem)
        return self._accept(run, batch)

    def _authenticate(self, run: str, header: str) -> Response | None:
        scheme, _, token = header.partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            return error(401, "missing 'Authorization: Bearer TOKEN' (the run's token)")
        expected = self.tokens.get(run)
        if expected is None:
            return error(404, f"no supervised run named {run!r}")
        if not hmac.compare_digest(token.strip().encode(), expected.encode()):
            return error(403, f"the token is not run {run!r}'s token")
        return None

    def _accept(self, run: str, batch: ReportBatch) -> Response:
        now = self.clock.now()
        accepted = duplicates = 0
        findings: list[NodeFinding] = []
        for report in sorted(batch.reports, key=lambda r: (r.at, r.seq)):
            last = self._last.get(batch.node)
            if last is not None and report.seq <= last[0] and report.at <= last[1]:
                duplicates += 1  # a batch sent again after a lost answer
                continue
            self._last[batch.node] = (report.seq, report.at)
            findings.extend(self.rules.evaluate(report, now, run))
            accepted += 1
        interval = batch.reports[-1].interval_s
        with self._lock:
            self._findings.extend(findings)
            self._seen[batch.node] = (now, run, interval)
        self.counters["reports"] += accepted
        self.counters["duplicates"] += duplicates
        self.counters["findings"] += len(findings)
        self.counters["agent_dropped"] += batch.dropped
        for f in findings:
            if f.severity.rank > 0:
                log.warning(
                    "node_finding", run=run, node=f.node, severity=f.severity.value, rule=f.rule, reason=f.reason
                )
        body = b'{"accepted":%d,"duplicates":%d,"findings":%d}' % (accepted, duplicates, len(findings))
        return Response(200, body)


class _Connection(asyncio.Protocol):
    """One client connection: httptools parses, the router answers, in order (pipelining safe)."""

    def __init__(self, server: IngestServer) -> None:
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
            self.server.ingest.counters["rejected_400"] += 1
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
            self.server.ingest.counters[f"rejected_{self.refused.status}"] += 1
            self._send(self.refused, keep_alive=False)

    def on_body(self, body: bytes) -> None:
        if self.refused is not None:
            return
        self.body_len += len(body)
        if self.body_len > self.server.max_body:
            self.refused = error(413, f"body over the {self.server.max_body}-byte limit")
            self.body.clear()
            self.server.ingest.counters["rejected_413"] += 1
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


class IngestServer:
    """The HTTP server on its own thread. ``start()`` binds (port 0: any free port; see ``port``)."""

    def __init__(
        self, ingest: ReportIngest, host: str = "127.0.0.1", port: int = 8471, max_body: int = 1 << 20
    ) -> None:
        self.ingest = ingest
        self.host = host
        self.port = port
        self.max_body = max_body
        self.router = Router()
        self.router.mount(REPORTS_PREFIX, ingest.handle)
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
