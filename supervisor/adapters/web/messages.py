"""The values of the daemon's HTTP server (``supervisor.adapters.web.server``): a request, an
answer, a route, the limits a client is held to, and the few helpers every route uses."""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import structlog

log = structlog.get_logger(__name__)


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
Gate = Callable[[Request], Response | None]  # a cheap check on the event loop: an answer refuses


@dataclass(frozen=True)
class Route:
    handler: Handler
    blocking: bool = False  # run on the worker thread (pages), not on the event loop
    gate: Gate | None = None


@dataclass(frozen=True)
class Limits:
    """What one client may make the server hold (docs/configuration.md, ``[ingest]``)."""

    max_url_bytes: int = 2048
    max_head_bytes: int = 16384
    max_headers: int = 64
    max_pipelined: int = 16
    max_connections: int = 1024
    max_connections_per_peer: int = 32
    request_deadline_s: float = 30.0
    # the head (request line and headers) within this of the request's first byte: an agent sends
    # it at once, a slow "busy" connection holds a slot this long, not request_deadline_s (finding 5)
    head_deadline_s: float = 5.0
    idle_timeout_s: float = 30.0
    write_buffer_bytes: int = 256 * 1024
    max_pending_pages: int = 32
    node_networks: tuple[str, ...] = ()  # the compute nodes' subnets: each address its own peer (web.peers)


_REASONS = {
    200: "OK",
    400: "Bad Request",
    401: "Unauthorized",
    403: "Forbidden",
    404: "Not Found",
    405: "Method Not Allowed",
    413: "Payload Too Large",
    414: "URI Too Long",
    422: "Unprocessable Entity",
    431: "Request Header Fields Too Large",
    500: "Internal Server Error",
    503: "Service Unavailable",
}


def error(status: int, reason: str) -> Response:
    return Response(status, json.dumps({"error": reason}).encode())


def answer(route: Route, request: Request) -> Response:
    """The route's answer; a handler's bug is a 500, never a dead server."""
    try:
        return route.handler(request)
    except Exception:  # noqa: BLE001 - a handler's bug must not take the server down
        log.exception("http_handler_failed", path=request.path[:200])
        return error(500, "internal error (see the daemon's log)")


def head(response: Response, keep_alive: bool) -> bytes:
    lines = [
        f"HTTP/1.1 {response.status} {_REASONS.get(response.status, 'Status')}",
        f"Content-Type: {response.content_type}",
        f"Content-Length: {len(response.body)}",
    ]
    lines += [f"{k}: {v}" for k, v in response.headers.items()]
    if not keep_alive:
        lines.append("Connection: close")
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")
