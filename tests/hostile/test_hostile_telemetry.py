"""Hostile telemetry: a run's token speaks only for its own job's nodes, and nothing an agent sends
poisons the ingest's memory (issue 17, item 1; security review findings #1 and #9).

Each attack is played against the real ``ReportIngest``; the cross-run one end to end, with the
ingest as the engine's health feed on the simulated cluster. Every test here failed on the code
before the fix (the cross-run report was accepted and drained the victim's node; the far-future
report made the victim's real XID a "duplicate"; made-up node names were all kept)."""

from __future__ import annotations

import json
import tracemalloc

import pytest
from unit.sim_world import SimWorld

from supervisor.adapters.web.ingest import ReportIngest, Request
from supervisor.adapters.web.tokens import HOOKS
from supervisor.domain.health.gpu_health import HealthRules
from supervisor.domain.health.node_report import SCHEMA_VERSION, NodeReport, XidEvent, to_wire
from supervisor.domain.records import EventKind
from supervisor.domain.run import RunSpec
from supervisor.sim.clock import VirtualClock
from supervisor.testing.kit.clock import ManualClock
from supervisor.testing.kit.specs import spec

TOKENS = {"alice": "alice-token-0123456789", "bob": "bob-token-0123456789", HOOKS: "hook-token-0123456789"}
NOW = 1_800_000_000.0


def batch(node: str, *, seq: int = 1, at: float = NOW, xid: int | None = 79, source: str = "agent") -> bytes:
    xids = (XidEvent(gpu=3, xid=xid, at=at),) if xid else ()
    report = NodeReport(v=SCHEMA_VERSION, node=node, seq=seq, at=at, interval_s=5.0, source=source, xids=xids)
    return json.dumps({"v": 1, "node": node, "reports": [to_wire(report)]}).encode()


def post(ingest: ReportIngest, run: str, data: bytes, token: str | None = None) -> tuple[int, dict[str, object]]:
    headers = {"authorization": f"Bearer {token or TOKENS[run]}"}
    answer = ingest.handle(Request("POST", f"/v1/reports/{run}", "", headers, data, "10.0.0.9"))
    return answer.status, json.loads(answer.body)


def ingest_for(held: dict[str, set[str]], **kw: object) -> ReportIngest:
    ingest = ReportIngest(dict(TOKENS), HealthRules(), ManualClock(NOW), **kw)  # type: ignore[arg-type]
    ingest.publish_job_nodes({run: frozenset(nodes) for run, nodes in held.items()})
    return ingest


# ---------------------------------------------------------------- a token speaks for its run's nodes


def _spec(name: str) -> RunSpec:
    return spec(name=name, max_restarts=5)


def test_another_runs_token_cannot_fault_a_node_of_its_job(tmp_path):
    """Run alice's token reports a fake XID 79 for a node of bob's job: refused, nothing drains,
    bob keeps running on its first attempt. Alice's own node is still hers to report."""
    clock = VirtualClock()
    tokens: dict[str, str] = {}
    ingest = ReportIngest(tokens, HealthRules(), clock)
    w = SimWorld(tmp_path, _spec("alice"), _spec("bob"), nodes=6, clock=clock, health=ingest)
    tokens.update({r: w.store.run_token(r) for r in ("alice", "bob")})
    w.until(lambda: w.running(0, "alice") and w.running(0, "bob"))
    w.tick()
    bobs = w.run("bob").attempt.nodes

    def attack(run: str, token_of: str, node: str) -> int:
        headers = {"authorization": f"Bearer {tokens[token_of]}"}
        data = batch(node, at=clock.now())
        return ingest.handle(Request("POST", f"/v1/reports/{run}", "", headers, data, "10.0.0.9")).status

    assert attack("alice", "alice", bobs[0]) == 403  # alice's token, bob's node
    assert attack("bob", "alice", bobs[0]) == 403  # alice's token on bob's route
    for _ in range(10):
        w.tick()
    assert not any(w.cluster.node_info(n).drained for n in w.cluster.node_names)
    assert w.running(0, "bob") and not w.events(EventKind.FAULT, "bob")

    alices = w.run("alice").attempt.nodes
    assert attack("alice", "alice", alices[0]) == 200  # her own node: heard, and acted on
    w.until(lambda: w.running(1, "alice"))
    assert w.cluster.node_info(alices[0]).drained and w.running(0, "bob")
    assert attack("alice", "alice", w.run("alice").attempt.nodes[0]) == 200  # heard on its new node

    w.store.request_cancel("alice", clock.now())  # the run ends: the ingest forgets it
    w.until(lambda: w.run("alice").state.terminal)
    w.tick()
    assert set(ingest.heartbeat_ages(clock.now())) == set() and ingest.tracked()["streams"] == 0


def test_a_report_for_a_node_outside_the_job_is_refused_and_leaves_no_trace():
    ingest = ingest_for({"alice": {"n001"}, "bob": {"n003"}})
    status, answer = post(ingest, "alice", batch("n003"))
    assert status == 403 and "n003" in str(answer["error"]) and "alice" in str(answer["error"])
    assert ingest.drain_findings() == [] and ingest.heartbeat_ages(NOW) == {}


def test_a_run_token_cannot_pose_as_a_hook_nor_the_hook_token_as_an_agent():
    ingest = ingest_for({"alice": {"n001"}})
    assert post(ingest, "alice", batch("n001", source="healthcheck"))[0] == 403
    assert post(ingest, HOOKS, batch("n001", source="agent"))[0] == 403
    assert post(ingest, HOOKS, batch("n009", source="healthcheck"))[0] == 200  # any node, the hooks' kinds
    assert [f.node for f in ingest.drain_findings()] == ["n009"]


# ---------------------------------------------------------------- one report cannot silence the rest


@pytest.mark.parametrize("attacker", ["alice", "bob", HOOKS])
def test_a_far_future_report_does_not_make_real_faults_duplicates(attacker):
    """``seq = 2**63-1`` with a time far in the future, from another run, the node's own run or the
    hooks: refused; and bob's real XID afterwards is heard."""
    ingest = ingest_for({"alice": {"n001"}, "bob": {"n003"}})
    source = "healthcheck" if attacker == HOOKS else "agent"
    assert post(ingest, attacker, batch("n003", seq=2**63 - 1, at=1e300, source=source))[0] in (403, 422)
    status, answer = post(ingest, "bob", batch("n003", seq=5, at=NOW - 1))
    assert (status, answer) == (200, {"accepted": 1, "duplicates": 0, "findings": 1})
    assert [f.rule for f in ingest.drain_findings()] == ["xid-79@1"]


@pytest.mark.parametrize("attacker", ["alice", HOOKS])
def test_a_report_within_the_skew_from_another_stream_silences_nothing(attacker):
    """Duplicates are told per (run, node): the hooks' or another run's reports for bob's node, even
    stamped a little ahead, never make bob's own reports duplicates."""
    ingest = ingest_for({"alice": {"n001"}, "bob": {"n003"}})
    source = "healthcheck" if attacker == HOOKS else "agent"
    post(ingest, attacker, batch("n003", seq=2**63 - 1, at=NOW + 30, xid=None, source=source))
    status, answer = post(ingest, "bob", batch("n003", seq=5, at=NOW - 1))
    assert (status, answer) == (200, {"accepted": 1, "duplicates": 0, "findings": 1})


def test_a_runs_own_poison_lasts_no_longer_than_the_skew():
    """The node's own run can only stamp its reports up to the skew ahead: its next real sample after
    that time is heard (a job can hide its own node's faults for at most ``max_skew_s``)."""
    ingest = ingest_for({"bob": {"n003"}})
    assert post(ingest, "bob", batch("n003", seq=2**63 - 1, at=NOW + 60, xid=None))[0] == 200
    ingest.clock.advance(61)  # type: ignore[attr-defined]
    assert post(ingest, "bob", batch("n003", seq=7, at=NOW + 61))[1] == {"accepted": 1, "duplicates": 0, "findings": 1}


def test_reports_from_beyond_the_clock_skew_are_refused_with_the_reason():
    ingest = ingest_for({"bob": {"n003"}})
    status, answer = post(ingest, "bob", batch("n003", at=NOW + 3600))
    assert status == 422 and "ahead of the daemon's clock" in str(answer["error"])
    assert post(ingest, "bob", batch("n003", at=NOW + 5))[0] == 200  # a little skew is normal


def test_an_ended_run_is_forgotten():
    ingest = ingest_for({"alice": {"n001", "n002"}, "bob": {"n003"}})
    for node in ("n001", "n002"):
        assert post(ingest, "alice", batch(node, xid=None))[0] == 200
    assert post(ingest, "bob", batch("n003", xid=None))[0] == 200
    ingest.publish_job_nodes({"bob": frozenset({"n003"})})  # alice ended
    assert set(ingest.heartbeat_ages(NOW)) == {"n003"}
    assert ingest.tracked() == {"nodes": 1, "streams": 1, "rules": 1}
    assert post(ingest, "alice", batch("n001", xid=None))[0] == 403


def test_a_node_that_left_the_job_is_forgotten():
    ingest = ingest_for({"alice": {"n001", "n002"}})
    for node in ("n001", "n002"):
        post(ingest, "alice", batch(node, xid=None))
    ingest.publish_job_nodes({"alice": frozenset({"n002", "n005"})})  # restarted without n001
    assert set(ingest.heartbeat_ages(NOW)) == {"n002"}
    assert post(ingest, "alice", batch("n001", seq=9, xid=None))[0] == 403


# ---------------------------------------------------------------- memory stays bounded


def _made_up(ingest: ReportIngest, run: str, n: int, source: str = "agent") -> int:
    accepted = 0
    for i in range(n):
        accepted += post(ingest, run, batch(f"fake{i:05d}", xid=None, source=source))[0] == 200
    return accepted


def test_made_up_node_names_under_a_run_token_keep_nothing():
    ingest = ingest_for({"alice": {"n001"}})
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        assert _made_up(ingest, "alice", 20_000) == 0
        grown = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert ingest.tracked() == {"nodes": 0, "streams": 0, "rules": 0}
    assert grown < 1_000_000, f"{grown} bytes kept for 20,000 refused node names"


def test_made_up_node_names_under_the_hook_token_are_capped():
    """The hook token may speak for any node: the per-node memory is a bounded LRU (second line)."""
    ingest = ingest_for({}, max_nodes=1_000)
    assert _made_up(ingest, HOOKS, 20_000, source="healthcheck") == 20_000
    assert ingest.tracked() == {"nodes": 1_000, "streams": 1_000, "rules": 1_000}
    assert "fake19999" in ingest.heartbeat_ages(NOW) and "fake00000" not in ingest.heartbeat_ages(NOW)


def test_the_health_rules_memory_is_an_lru_by_itself():
    rules = HealthRules(max_nodes=3)
    for i in range(10):
        rules.evaluate(NodeReport(v=SCHEMA_VERSION, node=f"n{i}", seq=1, at=NOW), NOW)
    assert rules.tracked == 3
