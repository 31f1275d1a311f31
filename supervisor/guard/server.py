"""The guard's Unix stream socket: the one systemd passes (socket activation, ``LISTEN_FDS``), or
one it binds itself when run by hand. Each connection: the caller from ``SO_PEERCRED`` and the
account databases (never from the request), one request line read within a deadline, one answer
line, closed.

Two stages, so that a silent caller costs a descriptor, never a thread (review 2026-12-02,
finding 3): the accepting thread reads every connection's request line itself (non-blocking, one
selector), at most ``MAX_PENDING`` connections and ``MAX_PENDING_PER_UID`` of one UID at once, each
within ``timeout_s``. Only a whole line takes a worker slot (``slots.Slots``: at most ``per_uid`` of
one UID, the last ``kept`` for root, admins and the instance accounts of ``trusted_users``), and a
line that finds none is answered ``busy`` (transient) at once. The guard's lock orders the
decisions; QUARANTINE reads do not wait for it."""

from __future__ import annotations

import grp
import os
import pwd
import selectors
import socket
import stat
import struct
import threading
import time
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path

import structlog

from supervisor.adapters.guard_client import MAX_LINE
from supervisor.guard.policy import Caller
from supervisor.guard.service import Guard
from supervisor.guard.slots import SlotLimits, Slots

log = structlog.get_logger("supervisor.guard")

SD_LISTEN_FDS_START = 3
MAX_PENDING = 256  # connections still sending their line: a descriptor each, no thread
MAX_PENDING_PER_UID = 8
ACCOUNTS_FRESH_S = 10.0  # how long a UID's name and groups are reused: a flood must not cost a lookup each
TURNED_AWAY_LOG_S = 10.0  # connections closed at once are logged as one count this often, not one by one
WORKER_SLOTS = SlotLimits(total=16, per_uid=4, kept=4)
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


def bound_socket(path: Path, group: str | None = None) -> socket.socket:
    """A socket bound at ``path`` (a stale socket there is replaced; anything else is refused).
    With ``group``: mode 0660 and that group, so only its members may connect at all (least
    privilege: an account that runs no instance cannot take the guard's slots); without: 0666,
    anyone may ask. Either way the policy decides by the caller's UID (SO_PEERCRED)."""
    gid = _group_id(group) if group is not None else None
    if path.is_symlink() or (path.exists() and not stat.S_ISSOCK(path.lstat().st_mode)):
        raise OSError(f"{path} exists and is not a socket")
    path.unlink(missing_ok=True)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    before = os.umask(0o177)  # nobody may connect before the mode below is set
    try:
        sock.bind(str(path))
    finally:
        os.umask(before)
    if gid is not None:
        os.chown(path, -1, gid)
    path.chmod(0o666 if gid is None else 0o660)
    sock.listen(64)
    return sock


def _group_id(group: str) -> int:
    try:
        return grp.getgrnam(group).gr_gid
    except KeyError:
        raise OSError(f"[guard] socket_group: no group {group!r} in the group database") from None


def credentials(conn: socket.socket) -> tuple[int, int, int]:
    """(pid, uid, gid) of the connected process, as the kernel saw it at connect()."""
    pid, uid, gid = _CRED.unpack(conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _CRED.size))
    return pid, uid, gid


def peer(conn: socket.socket) -> Caller:
    """The connected process's identity as the kernel saw it at connect(); groups from the group
    database (a process's own supplementary groups are not trusted: a setgid program's are its own)."""
    return account(*credentials(conn))


def account(pid: int, uid: int, gid: int) -> Caller:
    """The caller with its name and groups from the account databases."""
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


@dataclass
class _Pending:
    """A connection whose request line is still arriving."""

    conn: socket.socket
    caller: Caller
    deadline: float
    data: bytes = b""

    def line(self) -> bytes | None:
        """The request line once it is whole (or overlong: cut at MAX_LINE + 1 bytes, then refused)."""
        head, newline, _ = self.data.partition(b"\n")
        if newline and len(head) <= MAX_LINE:
            return head
        return self.data[: MAX_LINE + 1] if len(self.data) > MAX_LINE else None


class GuardServer:
    def __init__(
        self,
        sock: socket.socket,
        guard: Guard,
        *,
        timeout_s: float = 1.0,
        idle_exit_s: float = 0,
        trusted_users: frozenset[str] = frozenset(),
        slots: SlotLimits = WORKER_SLOTS,
    ) -> None:
        self.sock, self.guard = sock, guard
        self.timeout_s, self.idle_exit_s = timeout_s, idle_exit_s
        self.trusted_users = trusted_users
        self._slots = Slots(slots)
        self._pending: dict[int, _Pending] = {}  # by descriptor
        self._selector = selectors.DefaultSelector()
        self._last = time.monotonic()
        self._pending_of: Counter[int] = Counter()  # pending connections by UID
        self._accounts: dict[int, tuple[float, Caller]] = {}  # uid -> (looked up at, caller)
        self._turned_away: Counter[int] = Counter()
        self._turned_away_since = time.monotonic()

    def serve(self, stop: threading.Event) -> None:
        """Accept and read until ``stop`` is set (or, with ``idle_exit_s``, after that long without
        a connection: socket activation starts the guard again on the next one)."""
        self.sock.setblocking(False)
        self._selector.register(self.sock, selectors.EVENT_READ)
        try:
            while not stop.is_set() and not self._idle():
                for key, _ in self._selector.select(timeout=0.1):
                    if key.fileobj is self.sock:
                        self._accept()
                    else:
                        self._receive(key.fd)
                self._expire(time.monotonic())
                self.guard.audit.flush_due(self.guard.clock())
                self._log_turned_away(time.monotonic())
        finally:
            for fd in list(self._pending):
                self._drop(fd)
            self._selector.close()
        deadline = time.monotonic() + self.timeout_s + 30
        while self._slots.in_use() and time.monotonic() < deadline:  # let the requests in flight finish
            time.sleep(0.05)

    def _idle(self) -> bool:
        return self.idle_exit_s > 0 and time.monotonic() - self._last > self.idle_exit_s

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except (BlockingIOError, InterruptedError):
                return
            self._last = time.monotonic()
            try:
                pid, uid, gid = credentials(conn)
            except OSError:
                conn.close()
                continue
            if not self._room_to_read(uid):  # decided before any lookup: turning away costs little
                self._turned_away[uid] += 1
                conn.close()
                continue
            conn.setblocking(False)
            self._pending[conn.fileno()] = _Pending(
                conn, self._caller(pid, uid, gid), time.monotonic() + self.timeout_s
            )
            self._pending_of[uid] += 1
            self._selector.register(conn, selectors.EVENT_READ)

    def _room_to_read(self, uid: int) -> bool:
        if len(self._pending) >= MAX_PENDING:
            return False
        return uid == 0 or self._pending_of[uid] < MAX_PENDING_PER_UID

    def _caller(self, pid: int, uid: int, gid: int) -> Caller:
        now = time.monotonic()
        known = self._accounts.get(uid)
        if known is None or now - known[0] > ACCOUNTS_FRESH_S:
            if len(self._accounts) >= 4096:
                self._accounts.clear()
            known = (now, account(pid, uid, gid))
            self._accounts[uid] = known
        return replace(known[1], pid=pid, gid=gid)

    def _log_turned_away(self, now: float) -> None:
        if now - self._turned_away_since < TURNED_AWAY_LOG_S:
            return
        if self._turned_away:
            log.warning("guard.turned_away", by_uid=dict(self._turned_away.most_common(5)), seconds=TURNED_AWAY_LOG_S)
        self._turned_away.clear()
        self._turned_away_since = now

    def _receive(self, fd: int) -> None:
        pending = self._pending[fd]
        try:
            chunk = pending.conn.recv(4096)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            chunk = b""
        if not chunk:
            self._drop(fd)
            return
        pending.data += chunk
        line = pending.line()
        if line is not None:
            self._selector.unregister(pending.conn)
            self._pop(fd)
            self._dispatch(pending, line)

    def _expire(self, now: float) -> None:
        for fd, pending in list(self._pending.items()):
            if now >= pending.deadline:  # nothing whole in time: closed without an answer or audit line
                self._turned_away[pending.caller.uid] += 1  # nothing whole in time
                self._drop(fd)

    def _drop(self, fd: int) -> None:
        pending = self._pop(fd)
        self._selector.unregister(pending.conn)
        pending.conn.close()

    def _pop(self, fd: int) -> _Pending:
        pending = self._pending.pop(fd)
        self._pending_of[pending.caller.uid] -= 1
        if self._pending_of[pending.caller.uid] <= 0:
            del self._pending_of[pending.caller.uid]
        return pending

    def _dispatch(self, pending: _Pending, line: bytes) -> None:
        caller = pending.caller
        if not self._slots.take(caller.uid, trusted=self._trusted(caller)):
            self._turned_away[caller.uid] += 1
            _answer_now(pending.conn, BUSY_ANSWER)
            return
        threading.Thread(target=self._answer, args=(pending.conn, caller, line), daemon=True).start()

    def _trusted(self, caller: Caller) -> bool:
        return caller.admin(self.guard.limits.admin_groups) or caller.name in self.trusted_users

    def _answer(self, conn: socket.socket, caller: Caller, line: bytes) -> None:
        try:
            conn.setblocking(True)
            conn.settimeout(self.timeout_s + 5)  # the answer is small; a caller that does not read is cut
            conn.sendall(self.guard.handle_line(caller, line))
        except OSError as exc:  # the caller went away, or the answer could not be sent
            log.info("guard.connection_lost", error=str(exc))
        except Exception as exc:  # noqa: BLE001 - one request's bug must not take the guard down for every caller
            log.error("guard.request_failed", error=repr(exc)[:500], exc_info=True)
            _answer_now(conn, ERROR_ANSWER, close=False)
        finally:
            conn.close()
            self._slots.give(caller.uid)


ERROR_ANSWER = b'{"ok": false, "granted": false, "rule": "guard-error", "why": "the guard failed", "transient": true}\n'
BUSY_ANSWER = (
    b'{"ok": false, "granted": false, "rule": "busy", "why": "the guard serves as many requests of this account, '
    b'or of all, as it may; try again", "transient": true}\n'
)


def _answer_now(conn: socket.socket, line: bytes, *, close: bool = True) -> None:
    """A short answer without waiting on the caller (it fits the socket's buffer), if it still listens."""
    try:
        conn.setblocking(False)
        conn.send(line)
    except OSError:
        pass
    finally:
        if close:
            conn.close()
