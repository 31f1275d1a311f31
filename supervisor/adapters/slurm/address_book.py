"""Node addresses for the slurmd probe: each name looked up once, off the probing thread, and again
only after a failed probe or ``refresh_s`` — never per node per tick (issue 14).

A lookup runs on a small pool of threads: a slow DNS server costs the probe at most ``wait_s`` on a
name it has never seen, and nothing on a name it knows (the old address serves while the new
lookup runs). An IP literal needs no lookup and is answered at once.
"""

from __future__ import annotations

import ipaddress
import socket
import time
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor, wait
from dataclasses import dataclass
from typing import Any

Key = tuple[str, int]  # (host, port)
SockAddr = tuple[int, Any]  # (family, sockaddr) ready for socket() and connect()
Resolver = Callable[[str, int], Sequence[tuple[Any, ...]]]

LOOKUP_THREADS = 4


def system_resolver(host: str, port: int) -> Sequence[tuple[Any, ...]]:
    return socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)


@dataclass(frozen=True)
class Entry:
    address: SockAddr | None
    error: str | None  # why there is no address (the lookup failed)
    at: float  # when it was looked up (monotonic); -inf: refresh at the next chance


class AddressBook:
    def __init__(
        self,
        resolve: Resolver = system_resolver,
        refresh_s: float = 600.0,
        now: Callable[[], float] = time.monotonic,
        max_entries: int = 65536,
    ) -> None:
        self._resolve, self.refresh_s, self._now, self.max_entries = resolve, refresh_s, now, max_entries
        self._known: dict[Key, Entry] = {}
        self._pending: dict[Key, Future[Entry]] = {}
        self._pool: ThreadPoolExecutor | None = None

    def lookup(self, keys: Iterable[Key], wait_s: float) -> dict[Key, SockAddr | str]:
        """Per key its address, or why there is none (a failed or still pending lookup)."""
        keys = set(keys)
        unseen = [key for key in keys if key not in self._known and not self._inline(key)]
        for key in keys:
            if self._due(key):
                self._start(key)
        waiting = [self._pending[key] for key in unseen if key in self._pending]
        if waiting:
            wait(waiting, timeout=wait_s)
        self._harvest()
        return {key: self._answer(key) for key in keys}

    def forget(self, key: Key) -> None:
        """The address failed a probe: look it up again (the old one serves meanwhile)."""
        entry = self._known.get(key)
        if entry is not None:
            self._known[key] = Entry(entry.address, entry.error, float("-inf"))

    def wait_idle(self, timeout: float = 10.0) -> None:
        """Until the lookups under way have ended (for tests and benchmarks)."""
        if self._pending:
            wait(list(self._pending.values()), timeout=timeout)
        self._harvest()

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
            self._pool = None

    # ------------------------------------------------------------------ inside
    def _inline(self, key: Key) -> bool:
        """An IP literal: answered at once, without the pool."""
        try:
            family = socket.AF_INET6 if ipaddress.ip_address(key[0]).version == 6 else socket.AF_INET
        except ValueError:
            return False
        self._known[key] = Entry((family, (key[0], key[1])), None, float("inf"))
        return True

    def _due(self, key: Key) -> bool:
        if key in self._pending:
            return False
        entry = self._known.get(key)
        return entry is None or self._now() - entry.at >= self.refresh_s

    def _start(self, key: Key) -> None:
        if self._pool is None:
            self._pool = ThreadPoolExecutor(max_workers=LOOKUP_THREADS, thread_name_prefix="probe-dns")
        self._pending[key] = self._pool.submit(self._look_up, key)

    def _look_up(self, key: Key) -> Entry:
        host, port = key
        try:
            infos = self._resolve(host, port)
        except (OSError, UnicodeError) as exc:
            return Entry(None, f"cannot resolve {host}: {exc}", self._now())
        if not infos:
            return Entry(None, f"cannot resolve {host}: no address", self._now())
        return Entry((infos[0][0], infos[0][4]), None, self._now())

    def _harvest(self) -> None:
        for key, future in list(self._pending.items()):
            if future.done():
                del self._pending[key]
                entry = future.result()
                old = self._known.get(key)
                if entry.address is None and old is not None and old.address is not None:
                    entry = Entry(old.address, None, entry.at)  # a failed refresh keeps the old address
                self._known[key] = entry
        while len(self._known) > self.max_entries:
            del self._known[next(iter(self._known))]

    def _answer(self, key: Key) -> SockAddr | str:
        entry = self._known.get(key)
        if entry is None:
            return f"name lookup of {key[0]} still under way"
        return entry.address if entry.address is not None else entry.error or f"cannot resolve {key[0]}"
