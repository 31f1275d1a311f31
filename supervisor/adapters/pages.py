"""Read-only pages on the daemon's HTTP endpoint: ``GET /metrics`` (Prometheus) and
``GET /runs/RUN/logbook`` (the HTML logbook). They run on the ingest's thread with a store
connection of their own; nothing here writes."""

from __future__ import annotations

import re
import time
from collections.abc import Callable

from supervisor.adapters.html_logbook import logbook_page
from supervisor.adapters.http_server import Request, Response
from supervisor.adapters.ingest import IngestServer
from supervisor.adapters.metrics import metrics_page
from supervisor.ports import Store

_LOGBOOK = re.compile(r"^/runs/([a-z0-9][a-z0-9._-]{0,62})/logbook/?$")


def _answer(status: int, headers: list[tuple[str, str]], body: bytes) -> Response:
    content_type = next((v for k, v in headers if k.lower() == "content-type"), "text/plain; charset=utf-8")
    return Response(status, body, content_type, {k: v for k, v in headers if k.lower() != "content-type"})


def mount_pages(server: IngestServer, store: Store, now: Callable[[], float] = time.time) -> None:
    def metrics(request: Request) -> Response:
        if request.method != "GET":
            return Response(405, b'{"error": "GET only"}')
        return _answer(*metrics_page(store, now()))

    def logbook(request: Request) -> Response:
        match = _LOGBOOK.match(request.path)
        if request.method != "GET" or match is None:
            return Response(404, b'{"error": "GET /runs/RUN/logbook"}')
        return _answer(*logbook_page(store, match.group(1), now=now()))

    server.mount("/metrics", metrics)
    server.mount("/runs/", logbook)
