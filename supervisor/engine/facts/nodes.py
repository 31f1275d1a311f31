"""What the tick knows about nodes beyond Slurm's snapshot: active findings (agents, hooks,
straggler scores), silent agents, and nodes back in service after someone took them out.

Reads the store and the health feed; writes nothing: what is to be remembered comes back as
records (a finding on a node no run uses becomes the node's verdict; a node seen out of service
is marked; a returned node is forgotten) for the executor to apply.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

import structlog

from supervisor.domain.actions import ActiveFindings, NodeMark, Record
from supervisor.domain.cluster import ClusterSnapshot, JobInfo
from supervisor.domain.health.findings import HeartbeatSettings, NodeFinding, Severity, stale_heartbeats, worst
from supervisor.domain.health.quarantine import Fault
from supervisor.domain.observation import REASON_PREFIX
from supervisor.domain.records import NodeVerdict, RunRecord, Verdict
from supervisor.ports import HealthFeed, NodeMemory

log = structlog.get_logger("supervisor.engine")

OUT_OF_SERVICE = ("drained", "down", "held-by-slurm")  # verdict actions of a node seen out of service


@dataclass(frozen=True)
class NodeFacts:
    findings: Mapping[str, NodeFinding]  # node -> worst active degraded or fatal finding
    returned: frozenset[str]  # nodes back in service after being out
    stale: Mapping[str, str]  # node -> why its agent counts as silent
    agents: frozenset[str]  # nodes whose agent reports
    records: tuple[Record, ...]


class NodeWatch:
    def __init__(self, health: HealthFeed, heartbeat: HeartbeatSettings, finding_ttl_s: float) -> None:
        self.health = health
        self.heartbeat = heartbeat
        self.finding_ttl_s = finding_ttl_s
        self._findings: dict[str, NodeFinding] = {}  # node -> active finding (degraded or fatal)
        self._loaded = False  # the findings a previous daemon held are read from the store once

    @property
    def finding_nodes(self) -> frozenset[str]:
        """Nodes with an active finding (their state in Slurm says when it has done its work)."""
        return frozenset(self._findings)

    def observe(
        self, runs: list[RunRecord], snap: ClusterSnapshot, store: NodeMemory, new: list[NodeFinding], now: float
    ) -> NodeFacts:
        """``new``: findings from other sources this tick (straggler scores)."""
        if not self._loaded:
            self._findings, self._loaded = store.active_findings(), True
        before = dict(self._findings)
        returned, marks = returned_nodes(store.verdicts(), snap)
        for node in returned:  # an old finding must not fault the run that lands there next
            self._findings.pop(node, None)
        verdicts = self._take_findings(runs, snap, new + self.health.drain_findings(), now)
        ages = self.health.heartbeat_ages(now)
        agents = frozenset(n for n, age in ages.items() if age <= self.heartbeat.timeout_s)
        stale = self._stale_agents(runs, snap, ages, now)
        kept: list[Record] = [] if self._findings == before else [ActiveFindings(tuple(self._findings.values()))]
        return NodeFacts(dict(self._findings), returned, stale, agents, tuple(marks + verdicts + kept))

    def _take_findings(
        self, runs: list[RunRecord], snap: ClusterSnapshot, new: list[NodeFinding], now: float
    ) -> list[Record]:
        """Keep each node's worst degraded or fatal finding for a while; a finding on a node that no
        run uses is remembered as the node's verdict."""
        out: list[Record] = []
        # a node of a run's current attempt (running, or just ended: the finding often comes after
        # the XID killed the job) is the run's decision's to record, with the run's context —
        # counted once toward quarantine, not also as an idle node's fault
        running = running_nodes(runs, snap) | {n for r in runs if r.attempt is not None for n in r.attempt.nodes}
        for node, found in worst(new).items() if new else ():
            if found.severity is Severity.WATCH:
                log.info("node_watch", node=node, reason=found.reason, rule=found.rule)
                continue
            cur = self._findings.get(node)
            if cur is None or found.severity.rank >= cur.severity.rank or now - cur.at > self.finding_ttl_s:
                self._findings[node] = found
                if node not in running:  # else the run's decision records it, with the run's context
                    out += _outside_runs(found)
        ttl = self.finding_ttl_s
        self._findings = {n: f for n, f in self._findings.items() if now - f.at <= ttl and not _acted_on(snap, n)}
        return out

    def _stale_agents(
        self, runs: list[RunRecord], snap: ClusterSnapshot, ages: Mapping[str, float], now: float
    ) -> dict[str, str]:
        """Nodes whose agent stopped reporting while the job's other nodes' agents still report."""
        stale: dict[str, str] = {}
        for run in runs:
            a = run.attempt
            job = snap.jobs.get(a.job_id) if a else None
            if a is None or job is None or job.state.finished or a.started_at is None:
                continue
            stale.update(stale_heartbeats(job.nodes, ages, now - a.started_at, self.heartbeat))
        return stale


def returned_nodes(verdicts: Iterable[NodeVerdict], snap: ClusterSnapshot) -> tuple[frozenset[str], list[Record]]:
    """Nodes judged bad or suspect that were out of service in Slurm — drained or downed by this
    supervisor, by Slurm's health check or by an admin — and are back in service now. A node kept
    out that Slurm has out of service is marked the first time it is seen so (``held-by-slurm``):
    one that was never out (no node rights, over the blast radius) is not "back" and stays out."""
    out: set[str] = set()
    marks: list[Record] = []
    for v in verdicts:
        info = snap.nodes.get(v.node)
        if info is None or v.verdict is Verdict.HEALTHY:
            continue
        in_service = info.responding and not info.down and not info.drained
        if in_service and v.action in OUT_OF_SERVICE:
            out.add(v.node)
        elif not in_service and v.action not in OUT_OF_SERVICE:
            marks.append(NodeMark(v.node, "held-by-slurm"))
    return frozenset(out), marks


def forget_returned(returned: Iterable[str], now: float) -> list[Record]:
    """Returned nodes start afresh (the bad-node memory still counts their faults)."""
    return [
        NodeVerdict(node=node, verdict=Verdict.HEALTHY, reason="back in service in Slurm", action="returned", at=now)
        for node in sorted(returned)
    ]


def focus_nodes(runs: Iterable[RunRecord], jobs: Mapping[int, JobInfo]) -> frozenset[str]:
    """The nodes the runs' decisions read every tick: their current jobs' (as Slurm shows them and
    as their attempts started), and their named spares."""
    nodes: set[str] = set()
    for run in runs:
        nodes.update(run.spec.spare_nodes)
        a = run.attempt
        if a is not None:
            nodes.update(a.nodes)
            job = jobs.get(a.job_id)
            nodes.update(job.nodes if job is not None else ())
    return frozenset(nodes)


def running_nodes(runs: Iterable[RunRecord], snap: ClusterSnapshot) -> set[str]:
    nodes: set[str] = set()
    for run in runs:
        job = snap.jobs.get(run.attempt.job_id) if run.attempt else None
        if job is not None and not job.state.finished:
            nodes.update(job.nodes)
    return nodes


def _outside_runs(found: NodeFinding) -> list[Record]:
    """A finding on a node no run uses (an idle node's prolog, health check or agent): the node's
    verdict, and for a fatal one a fault quarantine counts like one found in a run."""
    out: list[Record] = [_verdict_of(found)]
    if found.severity is Severity.FATAL:
        key = f"{found.node}:finding:{found.rule}:{found.at:.0f}"
        out.append(Fault(found.node, found.at, found.run or "-", found.reason, key=key, source=found.source))
    return out


def _verdict_of(found: NodeFinding) -> NodeVerdict:
    return NodeVerdict(
        node=found.node,
        verdict=Verdict.BAD if found.severity is Severity.FATAL else Verdict.SUSPECT,
        reason=found.reason,
        evidence={"rule": found.rule, "source": found.source, **found.evidence},
        run=found.run,
        at=found.at,
    )


def _acted_on(snap: ClusterSnapshot, node: str) -> bool:
    """The supervisor drained or downed the node: the finding has done its work. When an operator
    returns the node to service, an old finding must not fault the next run that lands there (the
    bad-node memory remembers repeat offenders)."""
    info = snap.nodes.get(node)
    return info is not None and info.reason.startswith(REASON_PREFIX) and (info.drained or info.down)
