"""The guard's Unix stream socket: the one systemd passes (socket activation, ``LISTEN_FDS``), or
one it binds itself when run by hand. Each connection: the caller from ``SO_PEERCRED`` and the
account databases (never from the request), one request line read within a deadline, one answer
line, closed. At most ``MAX_CLIENTS`` connections at once, each in its own thread; the guard's
lock orders the decisions."""

from __future__ import annotations

import grp
import os
import pwd
import socket
import stat
import struct
import threading
import time
from collections.abc import Mapping
from pathlib import Path

import structlog

from supervisor.adapters.guard_client import MAX_LINE
from supervisor.guard.policy import Caller
from supervisor.guard.service import Guard

log = structlog.get_logger("supervisor.guard")

SD_LISTEN_FDS_START = 3
MAX_CLIENTS = 16
_CRED = struct.Struct("3i")  # struct ucred: pid, uid, gid


def passed_socket(env: Mapping[str, str] | None = None) -> socket.socket | None:
    """``sd_listen_fds()``: the socket systemd passed this process, if any (the first of them)."""
    env = os.environ if env is None else env
    if env.get("LISTEN_PID") != str(os.getpid()) or not env.get("LISTEN_FDS", "").isdigit():
        return None
    if int(env["LISTEN_FDS"]) < 1:
        return None
    for key in ("LISTEN_PID", "LISTEN_FDS", "LISTEN_FDNAMES"):  # not for our children (scontrol)
        os.environ.pop(key, None)
    os.set_inheritable(SD_LISTEN_FDS_START, False)
    sock = socket.socket(fileno=SD_LISTEN_FDS_START)
    if sock.family != socket.AF_UNIX or sock.type != socket.SOCK_STREAM:
        raise OSError(f"the passed socket is not a Unix stream socket ({sock.family!r}, {sock.type!r})")
    return sock


def bound_socket(path: Path) -> socket.socket:
    """A socket bound at ``path`` (a stale socket there is replaced; anything else is refused).
    Mode 0666: anyone may ask, the policy decides."""
    if path.is_symlink() or (path.exists() and not stat.S_ISSOCK(path.lstat().st_mode)):
        raise OSError(f"{path} exists and is not a socket")
    path.unlink(missing_ok=True)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.bind(str(path))
    path.chmod(0o666)
    sock.listen(64)
    return sock


def peer(conn: socket.socket) -> Caller:
    """The connected process's identity as the kernel saw it at connect(); groups from the group
    database (a process's own supplementary groups are not trusted: a setgid program's are its own)."""
    pid, uid, gid = _CRED.unpack(conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _CRED.size))
    try:
        account = pwd.getpwuid(uid)
    except KeyError:
        return Caller(uid, gid, pid, f"uid:{uid}", frozenset())
    names = set()
    for group_id in os.getgrouplist(account.pw_name, account.pw_gid):
        try:
            names.add(grp.getgrgid(group_id).gr_name)
        except KeyError:
            continue
    return Caller(uid, gid, pid, account.pw_name, frozenset(names))


def read_line(conn: socket.socket, timeout_s: float) -> bytes | None:
    """One request line within ``timeout_s``; an overlong one is cut at MAX_LINE + 1 bytes (and
    then refused); None when the caller sent nothing whole in time."""
    deadline = time.monotonic() + timeout_s
    data = b""
    while b"\n" not in data and len(data) <= MAX_LINE:
        left = deadline - time.monotonic()
        if left <= 0:
            return None
        conn.settimeout(left)
        chunk = conn.recv(4096)
        if not chunk:
            return None
        data += chunk
    head, newline, _ = data.partition(b"\n")
    return head if newline and len(head) <= MAX_LINE else data[: MAX_LINE + 1]


class GuardServer:
    def __init__(self, sock: socket.socket, guard: Guard, *, timeout_s: float = 5.0, idle_exit_s: float = 0) -> None:
        self.sock, self.guard = sock, guard
        self.timeout_s, self.idle_exit_s = timeout_s, idle_exit_s
        self._slots = threading.BoundedSemaphore(MAX_CLIENTS)
        self._last = time.monotonic()

    def serve(self, stop: threading.Event) -> None:
        """Accept until ``stop`` is set (or, with ``idle_exit_s``, after that long without a
        connection: socket activation starts the guard again on the next one)."""
        self.sock.settimeout(0.5)
        while not stop.is_set() and not self._idle():
            try:
                conn, _ = self.sock.accept()
            except TimeoutError:
                continue
            self._last = time.monotonic()
            if not self._slots.acquire(blocking=False):
                log.warning("guard.busy", clients=MAX_CLIENTS)
                conn.close()
                continue
            threading.Thread(target=self._one, args=(conn,), daemon=True).start()
        for _ in range(MAX_CLIENTS):  # let the requests in flight finish
            self._slots.acquire(timeout=self.timeout_s + 30)

    def _idle(self) -> bool:
        return self.idle_exit_s > 0 and time.monotonic() - self._last > self.idle_exit_s

    def _one(self, conn: socket.socket) -> None:
        try:
            caller = peer(conn)
            line = read_line(conn, self.timeout_s)
            if line is None:
                log.info("guard.no_request", uid=caller.uid, pid=caller.pid)
                return
            conn.settimeout(self.timeout_s)
            conn.sendall(self.guard.handle_line(caller, line))
        except OSError as exc:  # the caller went away, or the answer could not be sent
            log.info("guard.connection_lost", error=str(exc))
        except Exception as exc:  # noqa: BLE001 - one request's bug must not take the guard down for every caller
            log.error("guard.request_failed", error=repr(exc)[:500], exc_info=True)
            _answer_error(conn)
        finally:
            conn.close()
            self._slots.release()


ERROR_ANSWER = b'{"ok": false, "granted": false, "rule": "guard-error", "why": "the guard failed", "transient": true}\n'


def _answer_error(conn: socket.socket) -> None:
    """Tell the caller the guard failed (it retries: ``transient``), if it still listens."""
    try:
        conn.settimeout(0.5)
        conn.sendall(ERROR_ANSWER)
    except OSError:
        pass
