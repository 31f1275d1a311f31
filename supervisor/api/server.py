"""The instance's local API: a Unix stream socket, one JSON request per line, each answered on one
line. Callers are identified by the kernel (``SO_PEERCRED``) when they connect.

Bounded: at most ``max_connections`` at once, at most ``PER_UID`` of them from one UID, and the
last ``KEPT`` only for root, the instance's account and members of its group (``access.kept_for``:
review 2026-12-02, finding 6: any local user held all 16 with ``whoami`` every 8 s); a connection
beyond these is answered ``busy`` and closed. A request line holds at most
``wire.MAX_REQUEST_BYTES`` (longer: refused, closed); the first must arrive within
``request_timeout_s``, each next one within ``IDLE_GAP_S`` of the last answer (the CLI sends one
request per connection), and no connection lives past ``MAX_LIFETIME_S``. Each connection is
served on its own thread, so a slow answer (a submit asks Slurm) holds up no one else.
"""

from __future__ import annotations

import contextlib
import os
import socket
import stat
import threading
import time
from collections.abc import Callable
from pathlib import Path

import structlog

from supervisor.api import wire
from supervisor.api.access import Caller, Instance, kept_for
from supervisor.api.identity import peer, user_name
from supervisor.guard.slots import SlotLimits, Slots

log = structlog.get_logger("supervisor.api")

Handler = Callable[[Caller, bytes], bytes]

SUN_PATH_MAX = 107  # sockaddr_un.sun_path holds 108 bytes with the terminating NUL
PER_UID = 4
KEPT = 4
IDLE_GAP_S = 1.0
MAX_LIFETIME_S = 300.0  # a submit waits on Slurm, a few requests in a row may each take a while


class SocketInUse(OSError):
    pass


class ApiServer:
    def __init__(
        self,
        path: Path,
        handle: Handler,
        *,
        max_connections: int = 16,
        request_timeout_s: float = 10.0,
        answer_timeout_s: float = 30.0,
        instance: Instance | None = None,
    ) -> None:
        self.path = Path(path)
        self._handle = handle
        self._slots = Slots(SlotLimits(max_connections, min(PER_UID, max_connections), min(KEPT, max_connections - 1)))
        uid = os.geteuid()
        self._instance = instance or Instance(uid, user_name(uid))  # without its group: root and the account
        self._request_timeout_s = request_timeout_s
        self._answer_timeout_s = answer_timeout_s
        self._stop = threading.Event()
        self._sock: socket.socket | None = None
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        """Bind (replacing a stale socket file, never a live one), open it to every local user and
        start accepting. OSError (SocketInUse among them) names the path."""
        if len(os.fsencode(self.path)) > SUN_PATH_MAX:
            raise OSError(f"the API socket path {self.path} is longer than {SUN_PATH_MAX} bytes")
        _remove_stale(self.path)
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.bind(str(self.path))
            os.chmod(self.path, 0o666)  # noqa: S103 - anyone may connect; the rules decide what they may do
            sock.listen(64)
        except OSError as exc:
            sock.close()
            raise OSError(exc.errno, f"cannot serve the API at {self.path}: {exc.strerror}") from None
        sock.settimeout(0.5)  # how often the accept loop looks at the stop flag
        self._sock = sock
        self._thread = threading.Thread(target=self._accept_loop, name="api", daemon=True)
        self._thread.start()
        log.info("api_listening", socket=str(self.path))

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(5.0)
        if self._sock is not None:
            self._sock.close()
            self._sock = None
            with contextlib.suppress(FileNotFoundError):
                self.path.unlink()

    def _accept_loop(self) -> None:
        assert self._sock is not None
        while not self._stop.is_set():
            try:
                conn, _ = self._sock.accept()
            except TimeoutError:
                continue
            except OSError as exc:
                log.error("api_accept_failed", error=str(exc))
                self._stop.wait(0.5)
                continue
            try:
                caller = peer(conn)
            except OSError as exc:
                log.info("api_connection_dropped", error=str(exc))
                conn.close()
                continue
            if not self._slots.take(caller.uid, trusted=kept_for(caller, self._instance)):
                log.info("api_busy", uid=caller.uid, in_use=self._slots.in_use())
                _refuse_busy(conn)
                continue
            threading.Thread(target=self._serve, args=(conn, caller), name="api-conn", daemon=True).start()

    def _serve(self, conn: socket.socket, caller: Caller) -> None:
        try:
            with conn:
                lines = _LineReader(conn, self._request_timeout_s)
                for line in lines:
                    conn.settimeout(self._answer_timeout_s)
                    conn.sendall(self._handle(caller, line))
                    lines.next_within(IDLE_GAP_S)
        except (OSError, _TooLong) as exc:
            log.info("api_connection_dropped", error=str(exc))
        finally:
            self._slots.give(caller.uid)


class _TooLong(Exception):
    pass


class _LineReader:
    """Request lines until the client closes; each must arrive whole within the timeout and fit
    the size limit (the client is told when it does not)."""

    def __init__(self, conn: socket.socket, timeout_s: float) -> None:
        self._conn = conn
        self._timeout_s = timeout_s
        self._buf = b""
        self._ends = time.monotonic() + MAX_LIFETIME_S

    def __iter__(self) -> _LineReader:
        return self

    def next_within(self, seconds: float) -> None:
        """The next request must come within ``seconds`` (after an answer: a client that holds its
        connection between requests holds a slot someone else needs)."""
        self._timeout_s = seconds

    def __next__(self) -> bytes:
        deadline = min(time.monotonic() + self._timeout_s, self._ends)
        while b"\n" not in self._buf:
            if len(self._buf) > wire.MAX_REQUEST_BYTES:
                self._conn.sendall(wire.failure(wire.Failure.INVALID, "request too long"))
                raise _TooLong(f"request over {wire.MAX_REQUEST_BYTES} bytes")
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"no whole request within {self._timeout_s:g} s")
            self._conn.settimeout(left)
            chunk = self._conn.recv(65536)
            if not chunk:
                raise StopIteration
            self._buf += chunk
        line, self._buf = self._buf.split(b"\n", 1)
        if len(line) > wire.MAX_REQUEST_BYTES:
            self._conn.sendall(wire.failure(wire.Failure.INVALID, "request too long"))
            raise _TooLong(f"request over {wire.MAX_REQUEST_BYTES} bytes")
        return line


def _refuse_busy(conn: socket.socket) -> None:
    with conn:
        try:
            conn.settimeout(1.0)
            conn.sendall(wire.failure(wire.Failure.BUSY, "too many connections to the daemon; try again"))
        except OSError:
            pass


def _remove_stale(path: Path) -> None:
    """Remove a socket file no daemon answers on; refuse when one does (another instance)."""
    try:
        mode = path.lstat().st_mode
    except FileNotFoundError:
        return
    if not stat.S_ISSOCK(mode):
        raise SocketInUse(f"{path} exists and is not a socket; remove it or set [api] socket")
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        probe.settimeout(1.0)
        probe.connect(str(path))
    except OSError:
        path.unlink()
        return
    finally:
        probe.close()
    raise SocketInUse(f"another daemon serves {path}; give each instance its own [api] socket")
