"""The tokens the ingest accepts: each supervised run's, and the site's hook token.

The ingest runs on its own thread and asks for a token on every request; this book answers from
a snapshot it refreshes from the store at most every ``refresh_s`` (through its own SQLite
connection: connections are not shared between threads). A run that ended loses its token at
the next refresh: telemetry of ended runs is refused.

The hook token is a secret file read like every other (``adapters.secrets.read_secret``: owned by
the daemon's user or root, mode 600, not empty): a file that fails the check is refused when the
book is made (the daemon does not start), and — should it change later — hooks are refused, with
one ``hook_token_refused`` error in the log until it is fixed.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path

import structlog

from supervisor.adapters.secrets import read_secret

log = structlog.get_logger(__name__)

HOOKS = "HOOKS"  # the pseudo-run hooks report under (run names are lowercase: no clash)


class TokenBook(Mapping[str, str]):
    def __init__(
        self,
        load: Callable[[], dict[str, str]],
        *,
        hook_token_file: str | None = None,
        refresh_s: float = 2.0,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self._load = load
        self._hook_file = Path(hook_token_file) if hook_token_file else None
        self._refresh_s = refresh_s
        self._monotonic = monotonic
        self._lock = threading.Lock()
        self._tokens: dict[str, str] = {}
        self._at = float("-inf")
        self._problem: str | None = None  # why the hook token file is refused now, once logged
        if self._hook_file is not None:
            read_secret(self._hook_file, "hook_token_file", "ingest")  # refused at start: ValueError

    def _current(self) -> dict[str, str]:
        now = self._monotonic()
        if now - self._at > self._refresh_s:
            with self._lock:
                if now - self._at > self._refresh_s:
                    self._tokens = self._snapshot()
                    self._at = now
        return self._tokens

    def __getitem__(self, run: str) -> str:
        return self._current()[run]

    def __iter__(self) -> Iterator[str]:
        return iter(self._current())

    def __len__(self) -> int:
        return len(self._current())

    def _snapshot(self) -> dict[str, str]:
        tokens = dict(self._load())
        hook = self._hook_token()
        if hook:
            tokens[HOOKS] = hook
        return tokens

    def _hook_token(self) -> str | None:
        if self._hook_file is None:
            return None
        try:
            token = read_secret(self._hook_file, "hook_token_file", "ingest")
        except ValueError as exc:
            if str(exc) != self._problem:
                log.error("hook_token_refused", error=str(exc))
            self._problem = str(exc)
            return None
        self._problem = None
        return token
