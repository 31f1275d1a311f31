"""Read-only pages on the daemon's HTTP endpoint: ``GET /metrics`` (Prometheus) and
``GET /runs/RUN/logbook`` (the HTML logbook). Nothing here writes.

* **Behind a read token.** Every page request must carry ``Authorization: Bearer READ_TOKEN``
  (``[ingest] read_token_file``; Prometheus' ``authorization: {credentials_file: ...}`` sends
  exactly that), compared in constant time on the event loop before any work: 401 without one, 403
  with another (a run's token included). Without a configured read token the pages are off (403).
* **Off the event loop.** Pages are mounted ``blocking``: the HTTP server's worker thread asks the
  renderer (``supervisor.adapters.web.renderer``; the daemon's renders in a child process with a
  store connection of its own), so agents' reports are never queued behind them.
* **Cached and capped** (``PageSettings``). ``/metrics`` is kept one engine tick and a logbook page
  30 s, so a burst of scrapes or page loads renders once; a page over ``max_page_bytes`` is refused
  (503, with the CLI command that exports it), and each cache holds at most ``max_cache_bytes``.
  A renderer that fails answers 503 (nothing cached).
"""

from __future__ import annotations

import hmac
import re
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

from supervisor.adapters.web.renderer import Renderer, RenderFailed
from supervisor.adapters.web.server import HttpServer, Request, Response, error

_LOGBOOK = re.compile(r"^/runs/([a-z0-9][a-z0-9._-]{0,62})/logbook/?$")
MiB = 1 << 20


class PageCache:
    """Answers by path, each kept ``ttl_s`` seconds; at most ``max_bytes`` of bodies (oldest out)."""

    def __init__(self, ttl_s: float, max_bytes: int, clock: Callable[[], float] = time.monotonic) -> None:
        self.ttl_s, self.max_bytes, self.clock = ttl_s, max_bytes, clock
        self._pages: OrderedDict[str, tuple[float, Response]] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, key: str, render: Callable[[], Response]) -> Response:
        now = self.clock()
        with self._lock:
            kept = self._pages.get(key)
            if kept is not None and now - kept[0] < self.ttl_s:
                return kept[1]
        response = render()
        with self._lock:
            self._pages[key] = (now, response)
            self._pages.move_to_end(key)
            while sum(len(r.body) for _, r in self._pages.values()) > self.max_bytes and len(self._pages) > 1:
                self._pages.popitem(last=False)
        return response


def read_gate(read_token: str | None) -> Callable[[Request], Response | None]:
    """The check every page request passes on the event loop: the read token, then GET."""

    def gate(request: Request) -> Response | None:
        if read_token is None:
            return error(403, "pages are off: set [ingest] read_token_file to serve /metrics and the logbook")
        scheme, _, given = request.headers.get("authorization", "").partition(" ")
        if scheme.lower() != "bearer" or not given.strip():
            return Response(
                401,
                b'{"error": "missing \'Authorization: Bearer TOKEN\' (the read token)"}',
                headers={"WWW-Authenticate": 'Bearer realm="slurm-supervisor"'},
            )
        if not hmac.compare_digest(given.strip().encode(), read_token.encode()):
            return error(403, "the token is not the read token")
        if request.method != "GET":
            return error(405, "pages are read with GET")
        return None

    return gate


def _answer(status: int, headers: list[tuple[str, str]], body: bytes) -> Response:
    content_type = next((v for k, v in headers if k.lower() == "content-type"), "text/plain; charset=utf-8")
    return Response(status, body, content_type, {k: v for k, v in headers if k.lower() != "content-type"})


def _capped(response: Response, what: str, cap: int, export: str) -> Response:
    if len(response.body) <= cap:
        return response
    size = f"{len(response.body) / MiB:.1f} MiB"
    return error(503, f"the {what} is {size}, over the {cap / MiB:.0f} MiB page cap; {export}")


@dataclass(frozen=True)
class PageSettings:
    ttl_s: float = 5.0  # /metrics: one engine tick
    logbook_ttl_s: float = 30.0  # a page for people
    max_page_bytes: int = 32 * MiB
    max_cache_bytes: int = 64 * MiB


class Pages:
    """The two page routes over a renderer, each with its cache."""

    def __init__(self, renderer: Renderer, settings: PageSettings, now: Callable[[], float]) -> None:
        self.renderer, self.settings, self.now = renderer, settings, now
        self.scrapes = PageCache(settings.ttl_s, settings.max_cache_bytes)
        self.books = PageCache(settings.logbook_ttl_s, settings.max_cache_bytes)

    def metrics(self, request: Request) -> Response:
        try:
            return self.scrapes.get("/metrics", lambda: _answer(*self.renderer.metrics()))
        except RenderFailed as exc:
            return error(503, f"{exc}; try again")

    def logbook(self, request: Request) -> Response:
        match = _LOGBOOK.match(request.path)
        if match is None:
            return error(404, "GET /runs/RUN/logbook")
        run = match.group(1)
        try:
            return self.books.get(f"/runs/{run}/logbook", lambda: self._render(run))
        except RenderFailed as exc:
            return error(503, f"{exc}; try again")

    def _render(self, run: str) -> Response:
        page = _answer(*self.renderer.logbook(run, self.now()))
        export = f"export it with `slurm-supervisor logbook {run} --format html -o FILE`"
        return _capped(page, f"logbook page of run {run}", self.settings.max_page_bytes, export)


def mount_pages(
    server: HttpServer,
    renderer: Renderer,
    read_token: str | None,
    settings: PageSettings | None = None,
    *,
    now: Callable[[], float] = time.time,
) -> Pages:
    """Mount ``/metrics`` and ``/runs/RUN/logbook`` on ``server`` behind the read token;
    ``renderer`` renders them (``ThreadRenderer(store)``, or the daemon's ``ProcessRenderer``)."""
    pages = Pages(renderer, settings or PageSettings(), now)
    gate = read_gate(read_token)
    server.mount("/metrics", pages.metrics, blocking=True, gate=gate)
    server.mount("/runs/", pages.logbook, blocking=True, gate=gate)
    server.on_stop(renderer.close)
    return pages
