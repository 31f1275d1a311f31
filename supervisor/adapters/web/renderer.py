"""Where the daemon's pages are rendered: ``/metrics`` and the HTML logbook, as (status, headers,
body).

* ``ThreadRenderer(store)`` renders in the calling thread (the HTTP server's worker thread).
* ``ProcessRenderer(state_dir)`` renders in a child process, ``python -I -m
  supervisor.adapters.web.renderer STATE_DIR``, with a read-only store connection of its own
  (SQLite ``mode=ro``: it never writes or migrates the store; a store of a schema it does not know
  gets a 503 that says why) — started on first use, started again if it dies or stalls past
  ``timeout_s``. The daemon uses it: a 20,000-event logbook takes ~2 s of CPU and ~100 MB to
  render, and in a thread of the daemon's process that work holds the GIL against the event loop
  that takes agents' reports — every system call of the loop (accept, recv, send) then waits up to
  the interpreter's switch interval to get it back, and a burst of accepts stalled the loop
  0.1–0.35 s (ADR 0003). In a process of its own the operating system shares the CPU, and the
  daemon never holds a render's peak memory.

The child reads one JSON request a line on stdin (``{"kind": "metrics"}`` or ``{"kind":
"logbook", "run": RUN, "now": T}``) and answers each with a JSON line (status, headers, length)
followed by that many bytes of body on stdout.
"""

from __future__ import annotations

import json
import os
import select
import sqlite3
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import IO, Any, Protocol

from supervisor.adapters.logbook_html.page import logbook_page
from supervisor.adapters.metrics import HEADERS, StoreCollector, collector_text
from supervisor.adapters.sqlite.schema import SchemaMismatch
from supervisor.ports import Store

Page = tuple[int, list[tuple[str, str]], bytes]


class Renderer(Protocol):
    def metrics(self) -> Page: ...
    def logbook(self, run: str, now: float) -> Page: ...
    def close(self) -> None: ...


class ThreadRenderer:
    """Renders in the calling thread from ``store`` (one thread at a time)."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self.collector = StoreCollector(store, time.time)  # kept: it remembers runs that ended

    def metrics(self) -> Page:
        return 200, list(HEADERS), collector_text(self.collector)

    def logbook(self, run: str, now: float) -> Page:
        return logbook_page(self.store, run, now=now)

    def close(self) -> None:
        pass


class RenderFailed(OSError):
    """The child died, stalled or answered nonsense; the next page starts a new one."""


class RenderStalled(RenderFailed):
    """No answer within ``timeout_s``."""


class ProcessRenderer:
    """Renders in one child process; one page at a time."""

    def __init__(self, state_dir: str | Path, timeout_s: float = 120.0) -> None:
        self.state_dir, self.timeout_s = str(state_dir), timeout_s
        self._child: subprocess.Popen[bytes] | None = None
        self._lock = threading.Lock()

    def metrics(self) -> Page:
        return self._ask({"kind": "metrics"})

    def logbook(self, run: str, now: float) -> Page:
        return self._ask({"kind": "logbook", "run": run, "now": now})

    def _ask(self, request: dict[str, object]) -> Page:
        with self._lock:
            for attempt in (1, 2):  # a child found dead is started again once
                child = self._started()
                try:
                    assert child.stdin is not None and child.stdout is not None
                    child.stdin.write(json.dumps(request).encode() + b"\n")
                    child.stdin.flush()
                    return _read_page(child.stdout, time.monotonic() + self.timeout_s)
                except (OSError, ValueError) as exc:
                    self._stop()
                    if attempt == 2 or isinstance(exc, RenderStalled):
                        raise RenderFailed(f"the page renderer failed: {exc}") from None
            raise AssertionError("not reached")

    def _started(self) -> subprocess.Popen[bytes]:
        if self._child is None or self._child.poll() is not None:
            argv = [sys.executable, "-I", "-m", "supervisor.adapters.web.renderer", self.state_dir]
            self._child = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, cwd="/")
        return self._child

    def _stop(self) -> None:
        child, self._child = self._child, None
        if child is not None:
            child.kill()
            child.wait(10)

    @property
    def pid(self) -> int | None:
        return self._child.pid if self._child is not None else None

    def close(self) -> None:
        with self._lock:
            self._stop()


def _wait(fd: int, deadline: float) -> None:
    ready, _, _ = select.select([fd], [], [], max(0.0, deadline - time.monotonic()))
    if not ready:
        raise RenderStalled("no answer in time")


def _read_line(fd: int, deadline: float) -> bytes:
    line = b""
    while not line.endswith(b"\n"):
        _wait(fd, deadline)
        byte = os.read(fd, 1)
        if not byte or len(line) > 65536:
            raise RenderFailed("the renderer exited, or its answer's head is too long")
        line += byte
    return line


def _read_body(fd: int, size: int, deadline: float) -> bytes:
    """``size`` bytes, read into one buffer."""
    body, got = bytearray(size), 0
    view = memoryview(body)
    while got < size:
        _wait(fd, deadline)
        n = os.readv(fd, [view[got : got + (1 << 20)]])
        if n == 0:
            raise RenderFailed("the renderer exited")
        got += n
    return bytes(body)


def _read_page(stream: IO[bytes], deadline: float) -> Page:
    fd = stream.fileno()
    head = json.loads(_read_line(fd, deadline))
    body = _read_body(fd, int(head["length"]), deadline)
    return int(head["status"]), [(str(k), str(v)) for k, v in head["headers"]], body


# ---------------------------------------------------------------- the child
def serve(state_dir: str, requests: IO[bytes], answers: IO[bytes]) -> None:
    """Answer each request line. The store is opened read-only (the child holds no right to write
    it, and never migrates it); until it opens — absent, or of a schema this code does not know —
    each page is a 503 that says why, and the next request tries again."""
    pages: ThreadRenderer | None = None
    for line in requests:
        request = json.loads(line)
        try:
            pages = pages or ThreadRenderer(_open_store(state_dir))
        except (sqlite3.Error, SchemaMismatch) as exc:
            status, headers, body = _unreadable(state_dir, exc)
        else:
            status, headers, body = _page(pages, request)
        answers.write(json.dumps({"status": status, "headers": headers, "length": len(body)}).encode() + b"\n")
        answers.write(body)
        answers.flush()


def _open_store(state_dir: str) -> Store:
    from supervisor.adapters.sqlite import SqliteStore

    return SqliteStore(Path(state_dir), read_only=True)


def _page(pages: ThreadRenderer, request: dict[str, Any]) -> Page:
    if request["kind"] == "metrics":
        return pages.metrics()
    return pages.logbook(str(request["run"]), float(request["now"]))


def _unreadable(state_dir: str, exc: Exception) -> Page:
    reason = f"the page renderer cannot read the store in {state_dir}: {exc}"
    headers = [("Content-Type", "application/json"), ("Cache-Control", "no-store")]
    return 503, headers, json.dumps({"error": reason}).encode()


if __name__ == "__main__":
    serve(sys.argv[1], sys.stdin.buffer, sys.stdout.buffer)
