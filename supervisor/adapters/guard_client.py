"""The node guard's client (docs/guard.md): the NodeGuard port over the guard's Unix socket.

Protocol: the client connects, writes one JSON object and a newline (at most ``MAX_LINE`` bytes),
the guard answers with one JSON object and a newline, and closes. Requests:
``{"op": "DOWN"|"DRAIN", "node", "run", "cause"}``, ``{"op": "RESUME"|"CLEAR", "node"}``,
``{"op": "QUARANTINE"}``, and the remedies ``{"op": "RESERVE"|"REBOOT"|"UNRESERVE", "node", "run",
"cause"}``. Answers: ``{"ok", "granted", "rule", "why", "job", "reason", "frees_at",
"transient"}``, plus ``"quarantined": [...]`` for QUARANTINE. Who asks is the kernel's word
(SO_PEERCRED), so a request names no user.

Errors map onto the port's: no answer (refused connection, timeout, a cut line) -> TransientError;
the socket path missing or not a socket (no guard installed), or not ours to connect to (an
account outside the guard's group) -> PermanentError; the cluster-wide
cap -> CapReached; any other refusal -> GuardRefused (a PermanentError naming the rule). A
refusal is never PermissionDenied: the guard decides per node, so a refusal does not mean the
daemon has no node rights at all.
"""

from __future__ import annotations

import json
import socket
import struct
from collections.abc import Callable, Mapping
from typing import Any

from supervisor.domain.cluster import NodeChange
from supervisor.domain.health.quarantine import Fault, Quarantine
from supervisor.domain.observation import reason_cause
from supervisor.ports import CapReached, PermanentError, TransientError

DEFAULT_SOCKET = "/run/slurm-supervisor-guard.sock"
MAX_LINE = 8192  # bytes of one request line (the guard refuses longer ones)
MAX_ANSWER = 1 << 20  # bytes of one answer (a long quarantine list)

Transport = Callable[[Mapping[str, Any]], Mapping[str, Any]]


class GuardRefused(PermanentError):
    """The guard refused the request; ``rule`` names the rule that did (docs/guard.md)."""

    def __init__(self, message: str, *, rule: str) -> None:
        super().__init__(message)
        self.rule = rule


class GuardClient:
    """``transport`` replaces the socket (tests hand the guard's own ``handle`` in)."""

    def __init__(
        self, path: str = DEFAULT_SOCKET, *, timeout_s: float = 15.0, transport: Transport | None = None
    ) -> None:
        self.path = path
        self.timeout_s = timeout_s
        self._transport = transport or self._over_socket

    # -- the NodeGuard port

    def set_node_state(self, node: str, change: NodeChange, run: str, reason: str) -> None:
        cause = reason_cause(reason)  # the guard writes its own prefix, naming the caller's account
        check(self.ask({"op": change.value, "node": node, "run": run, "cause": cause}))

    def remedy(self, op: str, node: str, run: str = "", cause: str = "") -> None:
        """RESERVE, REBOOT, UNRESERVE or RESUME one node this account drained (docs/guard.md)."""
        check(self.ask({"op": op, "node": node, "run": run, "cause": cause}))

    def quarantined(self) -> dict[str, Quarantine]:
        items = check(self.ask({"op": "QUARANTINE"})).get("quarantined")
        try:
            return {q.node: q for q in map(_quarantine, items or [])}
        except (KeyError, TypeError, ValueError) as exc:
            raise PermanentError(f"the node guard's quarantine list is malformed: {exc}") from exc

    # -- requests

    def ask(self, request: Mapping[str, Any]) -> Mapping[str, Any]:
        """The guard's answer to one request, unchecked (the CLI prints refusals as they are)."""
        return self._transport(request)

    def _over_socket(self, request: Mapping[str, Any]) -> Mapping[str, Any]:
        line = (json.dumps(request, ensure_ascii=True) + "\n").encode("ascii")
        if len(line) > MAX_LINE:
            raise PermanentError(f"request to the node guard over {MAX_LINE} bytes")
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
                _connect_in_turn(sock, self.path, self.timeout_s)
                sock.settimeout(self.timeout_s)
                sock.sendall(line)
                raw = _read_line(sock)
        except (FileNotFoundError, NotADirectoryError) as exc:
            raise PermanentError(f"no node guard at {self.path} ({exc.strerror}); see docs/guard.md") from exc
        except PermissionError as exc:  # the socket's mode: asking again will not help
            raise PermanentError(
                f"may not connect to the node guard at {self.path} ({exc.strerror}): its socket is for members "
                "of the group slurm-supervisor-guard; ask the site to add this account (docs/guard.md)"
            ) from exc
        except OSError as exc:  # refused, reset, timed out
            raise TransientError(f"the node guard at {self.path} did not answer: {exc}", delay=2.0) from exc
        try:
            answer = json.loads(raw)
        except ValueError as exc:
            raise TransientError(f"the node guard's answer is not JSON ({len(raw)} bytes)") from exc
        if not isinstance(answer, dict):
            raise PermanentError("the node guard's answer is not a JSON object")
        return answer


def _connect_in_turn(sock: socket.socket, path: str, timeout_s: float) -> None:
    """Connect, waiting in the guard's accept queue (at most ``timeout_s``) rather than failing
    while it is full. With a Python timeout the socket is non-blocking, and a Unix socket's connect
    to a full queue fails at once (EAGAIN): one user's connect flood then failed every instance's
    request. A blocking connect with SO_SNDTIMEO waits its turn in the kernel instead."""
    seconds = int(timeout_s)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO, struct.pack("ll", seconds, int((timeout_s - seconds) * 1e6)))
    sock.connect(path)


def _read_line(sock: socket.socket) -> bytes:
    chunks: list[bytes] = []
    size = 0
    while True:
        chunk = sock.recv(65536)
        if not chunk:
            raise ConnectionResetError("the guard closed the connection before a full answer")
        chunks.append(chunk)
        size += len(chunk)
        if chunk.endswith(b"\n"):
            return b"".join(chunks)
        if size > MAX_ANSWER:
            raise ConnectionResetError(f"answer over {MAX_ANSWER} bytes")


def check(answer: Mapping[str, Any]) -> Mapping[str, Any]:
    """The answer when granted; else the port error it means."""
    if answer.get("granted") is True:
        return answer
    rule, why = str(answer.get("rule") or "?"), str(answer.get("why") or "no reason given")
    message = f"the node guard refused ({rule}): {why}"
    if answer.get("transient") is True:
        raise TransientError(message, delay=5.0)
    if rule == "cluster-cap":
        frees_at = answer.get("frees_at")
        raise CapReached(message, frees_at=float(frees_at) if isinstance(frees_at, int | float) else 0.0)
    raise GuardRefused(message, rule=rule)


def _quarantine(item: Mapping[str, Any]) -> Quarantine:
    node = str(item["node"])
    faults = tuple(
        Fault(node, float(f["at"]), str(f["run"]), str(f["reason"]), str(f.get("key") or ""), source="guard")
        for f in item["faults"]
    )
    return Quarantine(node, float(item["since"]), float(item["until"]), faults)
