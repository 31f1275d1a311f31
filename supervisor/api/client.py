"""The CLI's side of the local API: one request per connection, and the read side of the store
over it (:class:`RemoteStore`), so the commands print the same whether they read through the
daemon or, for the daemon's own account, straight from its state directory."""

from __future__ import annotations

import socket
from pathlib import Path
from typing import Any, Protocol, TypeVar

import msgspec

from supervisor.api import wire
from supervisor.domain.health.quarantine import Fault
from supervisor.domain.lease import Lease
from supervisor.domain.progress.series import ProgressPoint
from supervisor.domain.records import AttemptRecord, Event, NodeVerdict, RunRecord

T = TypeVar("T")

MAX_ANSWER_BYTES = 256 << 20  # a daemon's answer larger than this is not one


class ApiUnavailable(Exception):
    """No daemon answers at the socket (not running, wrong instance, or no permission to reach it)."""


class ApiFailure(Exception):
    """The daemon answered with a refusal or an error."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind


class Reader(Protocol):
    """What the read-only commands need of the store (SqliteStore has it too)."""

    def runs(self) -> list[RunRecord]: ...

    def get_run(self, name: str) -> RunRecord | None: ...

    def attempts(self, run: str) -> list[AttemptRecord]: ...

    def events(self, run: str | None = None) -> list[Event]: ...

    def progress(self, run: str) -> list[ProgressPoint]: ...

    def verdicts(self) -> list[NodeVerdict]: ...

    def node_faults(self, since: float) -> list[Fault]: ...

    def quarantine_clears(self) -> dict[str, float]: ...

    def lease(self) -> Lease | None: ...


class ApiClient:
    def __init__(self, path: Path, timeout_s: float = 120.0) -> None:
        self.path = Path(path)
        self.timeout_s = timeout_s  # a submit waits for Slurm's answer (at most its command timeout)

    def call(self, op: str, **args: Any) -> Any:
        """The answer's data; ApiFailure when refused, ApiUnavailable when nobody answers."""
        with self._connect() as sock:
            sock.sendall(wire.encode_request(op, args))
            raw = _read_line(sock)
        reply = msgspec.json.decode(raw)
        if not isinstance(reply, dict) or "ok" not in reply:
            raise ApiFailure(wire.Failure.INTERNAL.value, f"the daemon at {self.path} answered garbage")
        if not reply["ok"]:
            raise ApiFailure(str(reply.get("kind")), str(reply.get("error")))
        return reply.get("data")

    def reachable(self) -> bool:
        try:
            with self._connect():
                return True
        except ApiUnavailable:
            return False

    def _connect(self) -> socket.socket:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(self.timeout_s)
        try:
            sock.connect(str(self.path))
        except OSError as exc:
            sock.close()
            raise ApiUnavailable(f"no slurm-supervisor daemon answers at {self.path}: {exc.strerror or exc}") from None
        return sock


def _read_line(sock: socket.socket) -> bytes:
    chunks: list[bytes] = []
    size = 0
    while True:
        chunk = sock.recv(1 << 20)
        if not chunk:
            break
        chunks.append(chunk)
        size += len(chunk)
        if chunk.endswith(b"\n") or size > MAX_ANSWER_BYTES:
            break
    if not chunks:
        raise ApiFailure(wire.Failure.INTERNAL.value, "the daemon closed the connection without an answer")
    return b"".join(chunks)


class RemoteStore:
    """The store's read side, through the daemon: it shows only what the rules let the caller see."""

    def __init__(self, client: ApiClient) -> None:
        self._client = client

    def _get(self, kind: type[T], op: str, **args: Any) -> T:
        return msgspec.convert(self._client.call(op, **args), type=kind)

    def runs(self) -> list[RunRecord]:
        return self._get(list[RunRecord], "runs")

    def get_run(self, name: str) -> RunRecord | None:
        return self._get(RunRecord | None, "run", run=name)  # type: ignore[arg-type]

    def attempts(self, run: str) -> list[AttemptRecord]:
        return self._get(list[AttemptRecord], "attempts", run=run)

    def progress(self, run: str) -> list[ProgressPoint]:
        """The run's progress series (bounded per run by the store)."""
        return self._get(list[ProgressPoint], "progress", run=run)

    def events(self, run: str | None = None, offset: int = 0) -> list[Event]:
        """Every event from ``offset`` on, page by page."""
        out: list[Event] = []
        while True:
            page = self._get(list[Event], "events", run=run, offset=offset + len(out))
            out.extend(page)
            if len(page) < wire.MAX_EVENTS_PAGE:
                return out

    def verdicts(self) -> list[NodeVerdict]:
        return self._get(list[NodeVerdict], "nodes")

    def node_faults(self, since: float) -> list[Fault]:
        return self._get(list[Fault], "faults", since=since)

    def quarantine_clears(self) -> dict[str, float]:
        return self._get(dict[str, float], "clears")

    def lease(self) -> Lease | None:
        """Who leads the instance; None with SQLite (no lease) or from a daemon older than the op."""
        try:
            return self._get(Lease | None, "leader")  # type: ignore[arg-type]
        except ApiFailure:
            return None
