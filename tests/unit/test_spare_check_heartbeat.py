"""A hot spare's one pre-flight report (``agent --once --send``: an agent report that promises no
heartbeat, ``interval_s`` 0) must not make that spare a "silent agent" later, when node agents run
on the step's nodes only (e.g. started inside the training step): the daemon would then call a
healthy spare dead and drain it. Real ingest and NodeWatch, the pure decision, no Slurm.
The ingest counted every report as a heartbeat, and ``stale_heartbeats`` judged every node heard
from: now only reports that promise another (``interval_s`` > 0) are heartbeats."""

from __future__ import annotations

import json

from test_in_allocation import A0, JOB, run, snap

from supervisor.adapters.web.ingest import ReportIngest
from supervisor.adapters.web.server import Request
from supervisor.agent.oneshot import CheckResult, as_agent_report
from supervisor.domain.decide.in_allocation import hot_spares
from supervisor.domain.decide.policy import Observation
from supervisor.domain.health.findings import HeartbeatSettings
from supervisor.domain.health.gpu_health import HealthRules
from supervisor.domain.health.node_report import SCHEMA_VERSION, NodeReport, to_wire
from supervisor.engine.facts.nodes import NodeWatch
from supervisor.testing.kit.clock import ManualClock

TOKEN = "llm-token-0123456789abcdef"


class NoMemory:
    """The store's node memory, empty (NodeWatch reads it once)."""

    def active_findings(self) -> dict:
        return {}

    def verdicts(self) -> list:
        return []


def post(feed: ReportIngest, report: NodeReport) -> int:
    body = json.dumps({"v": SCHEMA_VERSION, "node": report.node, "reports": [to_wire(report)]}).encode()
    headers = {"authorization": f"Bearer {TOKEN}"}
    return feed.handle(Request("POST", "/v1/reports/llm", "", headers, body, "10.0.0.9")).status


def agent_report(node: str, seq: int, at: float) -> NodeReport:
    return NodeReport(v=SCHEMA_VERSION, node=node, seq=seq, at=at, interval_s=5.0)


def test_a_spare_checked_once_is_not_a_silent_agent_while_the_step_nodes_agents_report() -> None:
    clock = ManualClock(A0.started_at + 1.0)
    feed = ReportIngest({"llm": TOKEN}, HealthRules(), clock)
    feed.publish_job_nodes({"llm": frozenset(JOB.nodes)})  # n1, n2 the step; n3 the hot spare
    healthy_check = CheckResult((), NodeReport(v=SCHEMA_VERSION, node="n3", seq=0, at=clock.now()), 0.3)
    assert post(feed, as_agent_report(healthy_check, "n3")) == 200  # the launcher's pre-flight
    watch = NodeWatch(feed, HeartbeatSettings(), finding_ttl_s=3600.0)
    for seq, t in enumerate(range(int(clock.now()), int(A0.started_at) + 300, 5), start=1):
        clock.move_to(float(t))
        assert {post(feed, agent_report(n, seq, clock.now())) for n in ("n1", "n2")} == {200}  # agents in the step
    facts = watch.observe([run()], snap(clock.now()), NoMemory(), [], clock.now())  # type: ignore[arg-type]
    assert "n3" not in facts.stale, facts.stale
    obs = Observation(snap(clock.now()), dead=dict(facts.stale))
    assert hot_spares(run(), JOB, ("n1", "n2"), obs) == ("n3",)
