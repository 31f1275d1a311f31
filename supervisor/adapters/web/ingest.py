"""The daemon's ingest: node agents and hooks POST their reports here; findings go to the engine.

``POST /v1/reports/RUN`` with ``Authorization: Bearer TOKEN`` (the run's token, compared in
constant time) and a JSON ``ReportBatch`` body (``supervisor.domain.health.node_report``). Answers:

* 200 ``{"accepted": N, "duplicates": D, "findings": F}``;
* 400 malformed JSON, wrong types or a value out of the schema's bounds (the decoder says the
  field's path), 422 a well-formed batch that breaks the schema's other rules (an identifier that
  is not one, a control character, a report stamped more than ``max_skew_s`` ahead of the daemon's
  clock), 401 no bearer token, 403 a token that is not this run's — or a
  node that is not one of this run's current job's, or a kind of report the token may not send —
  404 an unknown run or path, 405 another method, 413 a body over ``max_body`` bytes — each with
  the reason as ``{"error": "..."}`` and a counter; nothing a client sends stops the server.

A run's token speaks for the nodes of that run's current job only, and for agent reports only;
the engine publishes those nodes every tick (``publish_job_nodes``, from its squeue snapshot and
the attempt's record). The hook token (``HOOKS``) speaks for any node, for prolog, epilog and
healthcheck reports only. Duplicates are told per (run, node); what is kept of a run that ended, or
of a node its job left, is forgotten; and per-node memory is an LRU of ``max_nodes`` entries (here
and in ``HealthRules``) whatever a client sends.

Accepted reports are judged by ``HealthRules`` at once (the time of receipt, from the injected
clock, stamps the findings); findings wait in a bounded queue for the engine's tick
(``drain_findings``), and each node's last report time feeds ``heartbeat_ages``: this class
implements the ``HealthFeed`` port. Other routes (``/metrics``, the logbook) are added with
``mount(prefix, handler)``; a handler takes a ``Request`` and returns a ``Response``.

The server is ``supervisor.adapters.web.server`` (``bench/ingest.py`` measures it).
"""

from __future__ import annotations

import re
import threading
from collections import Counter, OrderedDict, deque
from collections.abc import Callable, Mapping
from operator import attrgetter
from typing import Any, TypeVar

import msgspec
import structlog

from supervisor.adapters.web.server import HttpServer, Request, Response, error
from supervisor.adapters.web.tokens import HOOKS
from supervisor.domain.health.findings import NodeFinding
from supervisor.domain.health.gpu_health import MAX_NODES, HealthRules
from supervisor.domain.health.node_report import ReportBatch, check_batch
from supervisor.domain.text_safety import printable
from supervisor.domain.wire_auth import speaks_for
from supervisor.ports import Clock, NotLeading

log = structlog.get_logger(__name__)

REPORTS_PREFIX = "/v1/reports/"
_RUN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
HOOK_SOURCES = frozenset({"prolog", "epilog", "healthcheck"})  # what the hook token may report
MAX_SKEW_S = 60.0  # a report stamped further ahead of the daemon's clock is refused
_ORDER = attrgetter("at", "seq")  # a batch's reports in the order they were made
_AT = attrgetter("at")
_K = TypeVar("_K")
_V = TypeVar("_V")


class ReportIngest:
    """Authenticates, validates and judges report batches; the engine's HealthFeed."""

    def __init__(
        self,
        tokens: Mapping[str, str],
        rules: HealthRules,
        clock: Clock,
        max_findings: int = 100_000,
        *,
        max_nodes: int = MAX_NODES,
        max_skew_s: float = MAX_SKEW_S,
    ) -> None:
        self.tokens = tokens  # run -> token (a TokenStore-like mapping; read on every request)
        self.rules = rules
        self.clock = clock
        self.max_nodes, self.max_skew_s = max(1, max_nodes), max_skew_s
        self.counters: Counter[str] = Counter()
        self._decoder = msgspec.json.Decoder(ReportBatch)
        self._lock = threading.Lock()  # the engine's thread drains and publishes; the server's accepts
        self._findings: deque[NodeFinding] = deque(maxlen=max_findings)
        self._held: dict[str, frozenset[str]] = {}  # run -> the nodes of its current job (the engine's word)
        self._seen: OrderedDict[str, tuple[float, str, float]] = OrderedDict()  # node -> (received, run, interval)
        self._last: OrderedDict[tuple[str, str], tuple[int, float]] = OrderedDict()  # (run, node) -> (seq, at)
        self._may_act: Callable[[], None] | None = None  # raises NotLeading on a standby (issue 33)

    def follow_leadership(self, may_act: Callable[[], None]) -> None:
        """With daemons on several login nodes: refuse reports (503) while ``may_act`` raises
        ``NotLeading``: a standby's ingest would keep them where no tick reads them, and the
        agent's sender asks the next login node's daemon instead (agent/sender.py)."""
        self._may_act = may_act

    # ------------------------------------------------------------------ HealthFeed
    def drain_findings(self) -> list[NodeFinding]:
        with self._lock:
            found = list(self._findings)
            self._findings.clear()
        return found

    def heartbeat_ages(self, now: float) -> Mapping[str, float]:
        """Nodes whose last report promised another (an agent's, ``interval_s`` > 0): a hook's or
        a one-shot check's report (a hot spare's pre-flight) promises none, and its node must not
        be judged a silent agent later."""
        with self._lock:
            return {node: max(0.0, now - at) for node, (at, _, interval) in self._seen.items() if interval > 0}

    def heartbeat_intervals(self) -> Mapping[str, float]:
        """Per node: the sample interval its agent announced (0 when a hook reported)."""
        with self._lock:
            return {node: interval for node, (_, _, interval) in self._seen.items()}

    # ------------------------------------------------------------------ which run holds which node
    def publish_job_nodes(self, held: Mapping[str, frozenset[str]]) -> None:
        """The nodes of each supervised run's current job, from the engine's tick (a run absent has
        ended): a run's token is heard for these nodes only. What the ingest kept of a run that
        ended, or of a node its job no longer holds, is forgotten."""
        with self._lock:
            for run, nodes in self._held.items():
                for node in nodes - held.get(run, frozenset()):
                    self._forget(run, node)
            self._held = {run: frozenset(nodes) for run, nodes in held.items()}

    def forget_run(self, run: str) -> None:
        """Forget what was kept of ``run``'s nodes (its heartbeats, duplicates, rule state)."""
        with self._lock:
            for node in {n for r, n in self._last if r == run} | {n for n, (_, r, _) in self._seen.items() if r == run}:
                self._forget(run, node)
            self._held.pop(run, None)

    def tracked(self) -> dict[str, int]:
        """How much per-node state is kept: nodes heard from, (run, node) report streams, rule states."""
        with self._lock:
            return {"nodes": len(self._seen), "streams": len(self._last), "rules": self.rules.tracked}

    def _forget(self, run: str, node: str) -> None:
        self._last.pop((run, node), None)
        seen = self._seen.get(node)
        if seen is not None and seen[1] == run:
            del self._seen[node]
            self.rules.forget(node)

    # ------------------------------------------------------------------ the route
    def handle(self, request: Request) -> Response:
        self.counters["requests"] += 1
        response = self._handle(request)
        if response.status != 200:
            self.counters[f"rejected_{response.status}"] += 1
        return response

    def _handle(self, request: Request) -> Response:
        run = request.path[len(REPORTS_PREFIX) :]
        if not _RUN.match(run):
            return error(404, "POST reports to /v1/reports/RUN (RUN: the run's name)")
        if request.method != "POST":
            return error(405, "reports are sent with POST")
        denied = self._authenticate(run, request.headers.get("authorization", "")) or self._standing_by()
        if denied is not None:
            return denied
        try:
            batch = self._decoder.decode(request.body)
        except (msgspec.ValidationError, msgspec.DecodeError) as exc:
            return error(400, f"malformed report batch: {printable(str(exc), 300)}")
        problem = check_batch(batch)
        if problem is not None:
            return error(422, printable(problem, 500))
        return self._accept(run, batch)

    def _standing_by(self) -> Response | None:
        if self._may_act is None:
            return None
        try:
            self._may_act()
        except NotLeading as exc:
            return error(503, f"{exc}; send to the next login node's daemon")
        return None

    def _authenticate(self, run: str, header: str) -> Response | None:
        return bearer_refusal(self.tokens, run, header)

    def _refusal(self, run: str, batch: ReportBatch, now: float) -> Response | None:
        """Why a well-formed batch is not heard: not this token's node or kind, or from the future.
        Called with the lock held."""
        sources = {r.source for r in batch.reports} if len(batch.reports) > 1 else {batch.reports[0].source}
        if run == HOOKS:
            if not sources <= HOOK_SOURCES:
                return error(403, f"the hook token sends {', '.join(sorted(HOOK_SOURCES))} reports only")
        elif batch.node not in self._held.get(run, ()):
            return error(403, f"node {batch.node!r} is not a node of run {run!r}'s current job (as of the last tick)")
        elif sources != {"agent"}:
            return error(403, "a run's token sends agent reports only (hooks use the hook token)")
        ahead = max(map(_AT, batch.reports)) - now
        if ahead > self.max_skew_s:
            return error(
                422,
                f"a report is {ahead:.3g} s ahead of the daemon's clock (over {self.max_skew_s:g} s): fix the node's clock",
            )
        return None

    def _accept(self, run: str, batch: ReportBatch) -> Response:
        now = self.clock.now()
        with self._lock:
            refused = self._refusal(run, batch, now)
            if refused is not None:
                return refused
            accepted, duplicates, findings = self._judge(run, batch, now)
            self._findings.extend(findings)
            self._heard(batch.node, (now, run, batch.reports[-1].interval_s))
        counters = self.counters
        counters["reports"] += accepted
        if duplicates or findings or batch.dropped:
            counters["duplicates"] += duplicates
            counters["findings"] += len(findings)
            counters["agent_dropped"] += batch.dropped
        for f in findings:
            if f.severity.rank > 0:
                log.warning(
                    "node_finding", run=run, node=f.node, severity=f.severity.value, rule=f.rule, reason=f.reason
                )
        body = b'{"accepted":%d,"duplicates":%d,"findings":%d}' % (accepted, duplicates, len(findings))
        return Response(200, body)

    def _judge(self, run: str, batch: ReportBatch, now: float) -> tuple[int, int, list[NodeFinding]]:
        """The batch's new reports through the rules, in order; a report already heard from this
        (run, node) — a batch sent again after a lost answer — counts as a duplicate."""
        accepted = duplicates = 0
        findings: list[NodeFinding] = []
        key = (run, batch.node)
        reports = batch.reports if len(batch.reports) == 1 else sorted(batch.reports, key=_ORDER)
        for report in reports:
            last = self._last.get(key)
            if last is not None and report.seq <= last[0] and report.at <= last[1]:
                duplicates += 1
                continue
            _put(self._last, key, (report.seq, report.at), self.max_nodes)
            findings.extend(self.rules.evaluate(report, now, run))
            accepted += 1
        return accepted, duplicates, findings

    def _heard(self, node: str, seen: tuple[float, str, float]) -> None:
        for evicted in _put(self._seen, node, seen, self.max_nodes):
            self.rules.forget(evicted)


def bearer_refusal(tokens: Mapping[str, str], run: str, header: str) -> Response | None:
    """Why a request does not speak for ``run`` (None: it does): no bearer token, an unknown run,
    or a token that is neither the run's wire token nor the run's token (compared in constant time). The launcher channel shares it."""
    scheme, _, token = header.partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        return error(401, "missing 'Authorization: Bearer TOKEN' (the run's token)")
    expected = tokens.get(run)
    if expected is None:
        return error(404, f"no supervised run named {run!r}")
    if not speaks_for(token.strip(), expected):  # the wire token (domain.wire_auth), or the token itself
        return error(403, f"the token is not run {run!r}'s token")
    return None


def _put(lru: OrderedDict[_K, _V], key: _K, value: _V, cap: int) -> list[_K]:
    """Set ``key`` as the most recent entry; drop (and return) the oldest beyond ``cap``."""
    lru[key] = value
    lru.move_to_end(key)
    if len(lru) <= cap:  # nearly always: no list to build
        return _NONE
    return [lru.popitem(last=False)[0] for _ in range(len(lru) - cap)]


_NONE: list[Any] = []  # what _put evicted, nearly always (never appended to)


class IngestServer(HttpServer):
    """The HTTP server with the report route mounted; ``ingest`` is its ``ReportIngest``."""

    def __init__(
        self, ingest: ReportIngest, host: str = "127.0.0.1", port: int = 8471, max_body: int = 1 << 20
    ) -> None:
        super().__init__(host, port, max_body, counters=ingest.counters)
        self.ingest = ingest
        self.mount(REPORTS_PREFIX, ingest.handle)


__all__ = ["IngestServer", "ReportIngest", "Request", "Response", "bearer_refusal", "error"]
