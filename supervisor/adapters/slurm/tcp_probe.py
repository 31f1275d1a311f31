"""Direct liveness probe of slurmd: a TCP connect to each node's slurmd port.

A refused connection means nothing listens (slurmd is dead); a connect that does not finish
within the timeout means the host does not answer. Either is one failed probe; the engine calls
a node dead only after failures spanning its confirmation time. Cost: one non-blocking connect per
node per tick, no RPC to slurmctld.

Within the daemon's descriptor budget (issue 14): at most ``window`` connects are open at once (a
sliding window on one selector, so 2,048 healthy nodes take a few milliseconds on a LAN), and a
call returns by ``round_limit_s`` (its share of the tick) however many nodes hang: the connects
still open then stay open and are answered at the next call (a node is "no answer" once its
connect has been open ``timeout`` when looked at), and the nodes not reached go first next time.
Names are looked up once (``AddressBook``), not per node per tick.

What goes wrong on the daemon's side is never a node's fault: a socket that cannot be opened
(EMFILE, ENFILE, ENOBUFS), a local address or route missing, a name that does not resolve, a round
cut short. Such a node is left out of the result — "not probed", unknown — and listed with the
reason in ``last_round.not_run``; the engine neither counts it as a failure nor as a recovery.

So is a node whose slurmd port Slurm did not give (a grouped read names no port): slurmd may
listen anywhere (slurm.conf's Port, the test harness's ports chosen at runtime), so the probe does
not guess 6818 — that read a healthy node as refused. ``default_port`` is the site's own word
(``[probe] slurmd_port``), used then.
"""

from __future__ import annotations

import errno
import resource
import selectors
import socket
import time
from collections import Counter, deque
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

import structlog

from supervisor.adapters.slurm.address_book import AddressBook, Key, Resolver, SockAddr, system_resolver
from supervisor.domain.cluster import NodeInfo

log = structlog.get_logger(__name__)

MAX_WINDOW = 256
_OUT_OF_DESCRIPTORS = frozenset({errno.EMFILE, errno.ENFILE})
_OURS = frozenset({errno.ENOBUFS, errno.ENOMEM, errno.EADDRNOTAVAIL, errno.ENETUNREACH, errno.EAGAIN})
_CONNECTING = (0, errno.EINPROGRESS)
_NO_PORT = "slurmd port unknown (not read from Slurm, no [probe] slurmd_port)"
ROUND_BUDGET_S = 0.5  # a call's share of a tick (the tick's goal is under 1 s): the rest carries over


def default_window() -> int:
    """Connects open at once: an eighth of RLIMIT_NOFILE's soft limit (128 at systemd's default
    1,024), at most ``MAX_WINDOW`` — the ingest and SQLite keep the rest."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return MAX_WINDOW
    return max(8, min(MAX_WINDOW, soft // 8))


@dataclass(frozen=True)
class ProbeRound:
    """What the last round did: nodes probed, failed, not probed (with why), at most open, seconds."""

    probed: int = 0
    failed: int = 0
    not_run: Mapping[str, str] = field(default_factory=dict)
    most_open: int = 0
    seconds: float = 0.0


@dataclass
class _Pending:
    name: str
    key: Key
    deadline: float


class TcpProbe:
    def __init__(
        self,
        timeout: float = 1.0,
        default_port: int | None = None,
        *,
        window: int | None = None,
        round_limit_s: float | None = None,
        resolve: Resolver = system_resolver,
        refresh_s: float = 600.0,
        monotonic: Callable[[], float] = time.monotonic,
        open_socket: Callable[[int, int], socket.socket] = socket.socket,
    ) -> None:
        self.timeout = timeout
        self.default_port = default_port  # None: a node without a port read is not probed
        self.window = window or default_window()
        self.round_limit_s = round_limit_s if round_limit_s is not None else min(2 * timeout, ROUND_BUDGET_S)
        self.resolver = AddressBook(resolve, refresh_s, monotonic)
        self.open_socket = open_socket
        self._selector = selectors.DefaultSelector()  # holds the connects carried from call to call
        self._carried: dict[socket.socket, _Pending] = {}  # still open when the last call ended
        self._resume_at = ""  # the first node a cut round did not reach
        self.counters: Counter[str] = Counter()  # emfile (each time), not_run (nodes), rounds
        self.last_round = ProbeRound()

    def probe(self, nodes: Iterable[NodeInfo]) -> Mapping[str, str | None]:
        """Per node answered in this call: None alive, else the failure. Nodes left out (listed in
        ``last_round.not_run``) are unknown: not reached, or their connect is still open."""
        started = time.monotonic()
        infos, unknown = self._with_port(nodes)
        wanted = {info.name: self._key(info) for info in infos}
        self._drop_carried(wanted)
        carried = {p.name for p in self._carried.values()}
        queue = deque(n for n in self._in_turn(infos, wanted) if n.name not in carried)
        addresses = self.resolver.lookup({wanted[n.name] for n in queue}, wait_s=self.timeout)
        round_ = _Round(self, started + self.round_limit_s, self._selector, self._carried)
        round_.not_run.update(unknown)
        self._carried = {}  # the round's now (it closes them all if it fails)
        self._carried = round_.run(queue, wanted, addresses)
        self._resume_at = round_.cut_at
        self._account(round_, started)
        return round_.results

    def close(self) -> None:
        self._drop_carried({})
        self._selector.close()
        self.resolver.close()

    # ------------------------------------------------------------------ inside
    def _with_port(self, nodes: Iterable[NodeInfo]) -> tuple[list[NodeInfo], dict[str, str]]:
        """The nodes whose slurmd port is known, and the others (not probed, with why)."""
        known, unknown = [], {}
        for node in nodes:
            if self._port(node) is None:
                unknown[node.name] = _NO_PORT
            else:
                known.append(node)
        return known, unknown

    def _port(self, node: NodeInfo) -> int | None:
        return node.port or self.default_port

    def _key(self, node: NodeInfo) -> Key:
        port = self._port(node)
        assert port is not None  # nodes without one were left out before
        return (node.address or node.name, port)

    def _in_turn(self, nodes: Iterable[NodeInfo], wanted: Mapping[str, Key]) -> list[NodeInfo]:
        """By name (each once), starting where the last cut round stopped."""
        ordered = sorted({n.name: n for n in nodes if n.name in wanted}.values(), key=lambda n: n.name)
        first = next((i for i, n in enumerate(ordered) if n.name >= self._resume_at), 0)
        return ordered[first:] + ordered[:first]

    def _drop_carried(self, wanted: Mapping[str, Key]) -> None:
        """Close the carried connects of nodes no longer asked for (or now at another address)."""
        for sock, pending in list(self._carried.items()):
            if wanted.get(pending.name) != pending.key:
                del self._carried[sock]
                self._selector.unregister(sock)
                sock.close()

    def _account(self, round_: _Round, started: float) -> None:
        failed = sum(v is not None for v in round_.results.values())
        self.last_round = ProbeRound(
            len(round_.results), failed, dict(round_.not_run), round_.most_open, time.monotonic() - started
        )
        self.counters["rounds"] += 1
        self.counters["not_run"] += len(round_.not_run)
        if round_.not_run:
            name, why = next(iter(round_.not_run.items()))
            log.warning("probe_not_run", nodes=len(round_.not_run), example=name, reason=why)


class _Round:
    """One call's round: a sliding window of non-blocking connects on the probe's selector, starting
    with the connects the last call left open."""

    def __init__(
        self, probe: TcpProbe, ends: float, sel: selectors.BaseSelector, carried: Mapping[socket.socket, _Pending]
    ) -> None:
        self.probe, self.ends = probe, ends
        self.window = probe.window
        self.sel = sel
        self.open: dict[socket.socket, _Pending] = dict(carried)  # in start order, which is deadline order
        self.results: dict[str, str | None] = {}
        self.not_run: dict[str, str] = {}
        self.most_open = 0
        self.cut_at = ""

    def run(
        self, queue: deque[NodeInfo], keys: Mapping[str, Key], addresses: Mapping[Key, SockAddr | str]
    ) -> dict[socket.socket, _Pending]:
        """Until every node is answered or the call's time is up; returns the connects still open."""
        try:
            while (queue or self.open) and time.monotonic() < self.ends:
                self._start_some(queue, keys, addresses)
                if self.open:
                    self._wait()
        except BaseException:
            for sock in list(self.open):
                self._close(sock)
            raise
        if queue:
            self._cut(queue)
        for pending in self.open.values():
            self.not_run[pending.name] = "connect still open at the round's end (answered next round)"
        return self.open

    def _start_some(
        self, queue: deque[NodeInfo], keys: Mapping[str, Key], addresses: Mapping[Key, SockAddr | str]
    ) -> None:
        while queue and len(self.open) < self.window and time.monotonic() < self.ends:
            node = queue.popleft()
            address = addresses[keys[node.name]]
            if isinstance(address, str):
                self.not_run[node.name] = address
                continue
            if not self._connect(node.name, keys[node.name], address):
                queue.appendleft(node)  # out of descriptors with connects open: wait for one to end
                return

    def _cut(self, queue: deque[NodeInfo]) -> None:
        self.cut_at = queue[0].name
        for node in queue:
            self.not_run[node.name] = f"round cut at {self.probe.round_limit_s:g} s (probed first next round)"
        queue.clear()

    def _connect(self, name: str, key: Key, address: SockAddr) -> bool:
        """Start one connect; False: no descriptor now, but connects are open (try again later)."""
        try:
            sock = self.probe.open_socket(address[0], socket.SOCK_STREAM)
        except OSError as exc:
            return self._no_socket(name, exc)
        sock.setblocking(False)
        rc = sock.connect_ex(address[1])
        where = f"{key[0]}:{key[1]}"
        if rc in _CONNECTING:
            self.sel.register(sock, selectors.EVENT_WRITE)
            self.open[sock] = _Pending(name, key, time.monotonic() + self.probe.timeout)
            self.most_open = max(self.most_open, len(self.open))
        else:
            sock.close()
            self._ended(name, key, rc, where)
        return True

    def _no_socket(self, name: str, exc: OSError) -> bool:
        if exc.errno in _OUT_OF_DESCRIPTORS:
            self.probe.counters["emfile"] += 1
        if self.open and exc.errno in _OUT_OF_DESCRIPTORS | _OURS:
            self.window = len(self.open)  # the kernel's limit, not ours: stay under it this round
            return False
        self.not_run[name] = f"cannot open a socket: {exc}"
        return True

    def _wait(self) -> None:
        """Until a connect ends or the oldest one's time is up; record what ended."""
        first_deadline = next(iter(self.open.values())).deadline
        for key, _ in self.sel.select(max(0.0, min(first_deadline, self.ends) - time.monotonic())):
            sock: socket.socket = key.fileobj  # type: ignore[assignment]
            pending, rc = self.open[sock], sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
            self._close(sock)
            self._ended(pending.name, pending.key, rc)
        now = time.monotonic()
        while self.open:
            sock, pending = next(iter(self.open.items()))
            if pending.deadline > now:
                break
            self._close(sock)
            self._ended(pending.name, pending.key, None)

    def _close(self, sock: socket.socket) -> None:
        del self.open[sock]
        self.sel.unregister(sock)
        sock.close()

    def _ended(self, name: str, key: Key, rc: int | None, where: str = "") -> None:
        """Record one connect's outcome: rc 0 alive, an errno refused or unreachable, None no answer."""
        where = where or f"{key[0]}:{key[1]}"
        if rc == 0:
            self.results[name] = None
            return
        if rc in _OURS:
            self.not_run[name] = f"connect to {where}: {errno.errorcode.get(rc, rc)} (on this host)"
            return
        self.probe.resolver.forget(key)  # the node may have moved: look its name up again
        if rc is None:
            self.results[name] = f"connect to {where}: no answer within {self.probe.timeout:.1f} s"
        else:
            self.results[name] = f"connect to {where}: {errno.errorcode.get(rc, rc)}"
