"""The daemon's ingest: node agents and hooks POST their reports here; findings go to the engine.

``POST /v1/reports/RUN`` with ``Authorization: Bearer TOKEN`` (the run's token, compared in
constant time) and a JSON ``ReportBatch`` body (``supervisor.domain.node_report``). Answers:

* 200 ``{"accepted": N, "duplicates": D, "findings": F}``;
* 400 malformed JSON or wrong types, 422 a well-formed batch that breaks the schema's rules,
  401 no bearer token, 403 a token that is not this run's, 404 an unknown run or path,
  405 another method, 411/413 a body without a length or over ``max_body`` bytes — each with the
  reason as ``{"error": "..."}`` and a counter; nothing a client sends stops the server.

Accepted reports are judged by ``HealthRules`` at once (the time of receipt, from the injected
clock, stamps the findings); findings wait in a bounded queue for the engine's tick
(``drain_findings``), and each node's last report time feeds ``heartbeat_ages``: this class
implements the ``HealthFeed`` port. Other routes (``/metrics``, the logbook) are added with
``mount(prefix, handler)``; a handler takes a ``Request`` and returns a ``Response``.

The server is ``supervisor.adapters.http_server`` (``bench/ingest.py`` measures it).
"""

from __future__ import annotations

import hmac
import re
import threading
from collections import Counter, deque
from collections.abc import Mapping

import msgspec
import structlog

from supervisor.adapters.http_server import HttpServer, Request, Response, error
from supervisor.domain.gpu_health import HealthRules
from supervisor.domain.health import NodeFinding
from supervisor.domain.node_report import ReportBatch, check_batch
from supervisor.ports import Clock

log = structlog.get_logger(__name__)

REPORTS_PREFIX = "/v1/reports/"
_RUN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")


class ReportIngest:
    """Authenticates, validates and judges report batches; the engine's HealthFeed."""

    def __init__(
        self, tokens: Mapping[str, str], rules: HealthRules, clock: Clock, max_findings: int = 100_000
    ) -> None:
        self.tokens = tokens  # run -> token (a TokenStore-like mapping; read on every request)
        self.rules = rules
        self.clock = clock
        self.counters: Counter[str] = Counter()
        self._decoder = msgspec.json.Decoder(ReportBatch)
        self._lock = threading.Lock()
        self._findings: deque[NodeFinding] = deque(maxlen=max_findings)
        self._seen: dict[str, tuple[float, str | None, float]] = {}  # node -> (received, run, interval)
        self._last: dict[str, tuple[int, float]] = {}  # node -> (seq, at) of its last accepted report

    # ------------------------------------------------------------------ HealthFeed
    def drain_findings(self) -> list[NodeFinding]:
        with self._lock:
            found = list(self._findings)
            self._findings.clear()
        return found

    def heartbeat_ages(self, now: float) -> Mapping[str, float]:
        with self._lock:
            return {node: max(0.0, now - at) for node, (at, _, _) in self._seen.items()}

    def heartbeat_intervals(self) -> Mapping[str, float]:
        """Per node: the sample interval its agent announced (0 when a hook reported)."""
        with self._lock:
            return {node: interval for node, (_, _, interval) in self._seen.items()}

    def forget_run(self, run: str) -> None:
        """Stop tracking the nodes whose last report came with ``run``'s token (the run ended)."""
        with self._lock:
            for node in [n for n, (_, r, _) in self._seen.items() if r == run]:
                del self._seen[node]
                self._last.pop(node, None)
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
        denied = self._authenticate(run, request.headers.get("authorization", ""))
        if denied is not None:
            return denied
        try:
            batch = self._decoder.decode(request.body)
        except (msgspec.ValidationError, msgspec.DecodeError) as exc:
            return error(400, f"malformed report batch: {str(exc)[:300]}")
        problem = check_batch(batch)
        if problem is not None:
            return error(422, problem)
        return self._accept(run, batch)

    def _authenticate(self, run: str, header: str) -> Response | None:
        scheme, _, token = header.partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            return error(401, "missing 'Authorization: Bearer TOKEN' (the run's token)")
        expected = self.tokens.get(run)
        if expected is None:
            return error(404, f"no supervised run named {run!r}")
        if not hmac.compare_digest(token.strip().encode(), expected.encode()):
            return error(403, f"the token is not run {run!r}'s token")
        return None

    def _accept(self, run: str, batch: ReportBatch) -> Response:
        now = self.clock.now()
        accepted = duplicates = 0
        findings: list[NodeFinding] = []
        for report in sorted(batch.reports, key=lambda r: (r.at, r.seq)):
            last = self._last.get(batch.node)
            if last is not None and report.seq <= last[0] and report.at <= last[1]:
                duplicates += 1  # a batch sent again after a lost answer
                continue
            self._last[batch.node] = (report.seq, report.at)
            findings.extend(self.rules.evaluate(report, now, run))
            accepted += 1
        interval = batch.reports[-1].interval_s
        with self._lock:
            self._findings.extend(findings)
            self._seen[batch.node] = (now, run, interval)
        self.counters["reports"] += accepted
        self.counters["duplicates"] += duplicates
        self.counters["findings"] += len(findings)
        self.counters["agent_dropped"] += batch.dropped
        for f in findings:
            if f.severity.rank > 0:
                log.warning(
                    "node_finding", run=run, node=f.node, severity=f.severity.value, rule=f.rule, reason=f.reason
                )
        body = b'{"accepted":%d,"duplicates":%d,"findings":%d}' % (accepted, duplicates, len(findings))
        return Response(200, body)


class IngestServer(HttpServer):
    """The HTTP server with the report route mounted; ``ingest`` is its ``ReportIngest``."""

    def __init__(
        self, ingest: ReportIngest, host: str = "127.0.0.1", port: int = 8471, max_body: int = 1 << 20
    ) -> None:
        super().__init__(host, port, max_body, counters=ingest.counters)
        self.ingest = ingest
        self.mount(REPORTS_PREFIX, ingest.handle)


__all__ = ["IngestServer", "ReportIngest", "Request", "Response", "error"]
