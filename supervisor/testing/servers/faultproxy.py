"""A fault-injecting HTTP proxy for storage tests: put it between a client and an S3 server.

    with FaultProxy(server.endpoint_url) as proxy:
        proxy.add(Fault("slowdown", method="GET", path_contains="/shard-3", times=2))
        client = boto3.client("s3", endpoint_url=proxy.url, ...)

Requests pass through unchanged (Host included, so SigV4 signatures stay valid) unless a rule
matches. Faults: ``slowdown`` (503 with S3's ``SlowDown`` error), ``error`` (any status and code),
``delay`` (hold the response ``delay_s`` before forwarding: beyond the client's read timeout it is
a timeout), ``reset`` (close the connection with a TCP RST before answering), ``reset_mid_body``
(send the status, the headers and ``after_bytes`` of the body, then RST). A rule applies ``times``
times (None: always); the first matching rule wins. ``hits`` counts faults injected per rule.
"""

from __future__ import annotations

import functools
import http.client
import http.server
import socket
import struct
import threading
import time
from dataclasses import dataclass, field
from urllib.parse import urlsplit

import structlog

log = structlog.get_logger()

KINDS = ("slowdown", "error", "delay", "reset", "reset_mid_body")


@dataclass
class Fault:
    kind: str
    method: str | None = None  # "GET", "HEAD", "PUT"...; None: any
    path_contains: str | None = None  # a substring of the request path (with query); None: any
    times: int | None = None  # how many requests it applies to; None: every one
    delay_s: float = 0.0
    after_bytes: int = 0
    status: int = 503
    code: str = "SlowDown"
    hits: int = field(default=0, init=False)

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"fault kind {self.kind!r} is not one of {', '.join(KINDS)}")

    def matches(self, method: str, path: str) -> bool:
        return (
            (self.method is None or self.method == method)
            and (self.path_contains is None or self.path_contains in path)
            and (self.times is None or self.hits < self.times)
        )


class FaultProxy:
    """A threaded HTTP/1.1 proxy on a free loopback port in front of ``upstream`` (http://host:port)."""

    def __init__(self, upstream: str, *, upstream_timeout: float = 60.0) -> None:
        parts = urlsplit(upstream)
        if parts.scheme != "http" or not parts.hostname or not parts.port:
            raise ValueError(f"upstream {upstream!r} must be http://HOST:PORT")
        self.upstream = (parts.hostname, parts.port)
        self.upstream_timeout = upstream_timeout
        self.rules: list[Fault] = []
        self.requests = 0
        self._lock = threading.Lock()
        self._server: http.server.ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None
        self.url = ""

    def __enter__(self) -> FaultProxy:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self) -> FaultProxy:
        handler = type("Handler", (_Handler,), {"proxy": self})
        self._server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self._server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        # serve_forever's default poll (0.5 s) is what stop() waits: half a second per test using a proxy
        serve = functools.partial(self._server.serve_forever, poll_interval=0.05)
        self._thread = threading.Thread(target=serve, name="fault-proxy", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def add(self, fault: Fault) -> Fault:
        with self._lock:
            self.rules.append(fault)
        return fault

    def clear(self) -> None:
        with self._lock:
            self.rules.clear()

    def pick(self, method: str, path: str) -> Fault | None:
        with self._lock:
            self.requests += 1
            for rule in self.rules:
                if rule.matches(method, path):
                    rule.hits += 1
                    return rule
        return None


class _Handler(http.server.BaseHTTPRequestHandler):
    proxy: FaultProxy
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002 - the base class's name
        pass  # quiet; faults are logged with structlog

    def _handle(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else b""
        fault = self.proxy.pick(self.command, self.path)
        if fault is not None:
            log.debug("faultproxy.fault", kind=fault.kind, method=self.command, path=self.path)
            if fault.kind in ("slowdown", "error"):
                return self._error(fault.status, fault.code)
            if fault.kind == "reset":
                return self._reset()
            if fault.kind == "delay":
                time.sleep(fault.delay_s)
        self._forward(body, fault if fault is not None and fault.kind == "reset_mid_body" else None)

    do_GET = do_HEAD = do_PUT = do_POST = do_DELETE = _handle  # noqa: N815 - http.server's names

    def _error(self, status: int, code: str) -> None:
        payload = (
            f'<?xml version="1.0" encoding="UTF-8"?><Error><Code>{code}</Code>'
            f"<Message>injected by the fault proxy</Message></Error>"
        ).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/xml")
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(payload)

    def _reset(self) -> None:
        self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        self.connection.close()
        self.close_connection = True

    def _forward(self, body: bytes, cut: Fault | None) -> None:
        conn = http.client.HTTPConnection(*self.proxy.upstream, timeout=self.proxy.upstream_timeout)
        try:
            headers = {k: v for k, v in self.headers.items() if k.lower() != "connection"}
            conn.request(self.command, self.path, body=body or None, headers=headers)
            resp = conn.getresponse()
            self.send_response_only(resp.status, resp.reason)
            for k, v in resp.getheaders():
                if k.lower() not in ("connection", "transfer-encoding"):
                    self.send_header(k, v)
            payload_left = cut.after_bytes if cut is not None else None
            chunked = resp.getheader("Transfer-Encoding", "").lower() == "chunked"
            if chunked:
                self.send_header("Connection", "close")
                self.close_connection = True
            self.end_headers()
            while self.command != "HEAD":
                chunk = resp.read(1 << 20)
                if not chunk:
                    break
                if payload_left is not None:
                    if len(chunk) >= payload_left:
                        self.wfile.write(chunk[:payload_left])
                        self.wfile.flush()
                        return self._reset()
                    payload_left -= len(chunk)
                self.wfile.write(chunk)
            if payload_left is not None:
                return self._reset()
        except OSError as exc:
            log.debug("faultproxy.upstream_failed", error=str(exc))
            self.close_connection = True
        finally:
            conn.close()
