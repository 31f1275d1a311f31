"""A run is never stuck behind nodes it no longer needs to avoid (issue 21, item 0).

On the simulated cluster with the real engine and store: a waiting restart's exclusions follow the
nodes' current state every tick — a node back in service rejoins whoever drained it (the
supervisor, Slurm's health check, an admin) — and a run that cannot be placed says so in the
logbook, pages past a threshold, and never waits on quarantine without a decision on record.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import pytest
from unit.sim_world import SimWorld

from supervisor.adapters.paging.webhook import Pager
from supervisor.domain.cluster import SubmitRequest
from supervisor.domain.health.findings import NodeFinding, Severity
from supervisor.domain.health.quarantine import QuarantineSettings
from supervisor.domain.records import EventKind, Verdict
from supervisor.domain.run import SparePolicy
from supervisor.engine.reconcile import EngineSettings
from supervisor.ports import PermanentError
from supervisor.sim.clock import VirtualClock
from supervisor.sim.slurm.cluster import SimCluster
from supervisor.testing.kit.specs import spec

SPEC = spec(spare_policy=SparePolicy.PARTITION_IDLE, max_restarts=20)


@dataclass
class Feed:
    """A stateful HealthFeed: findings reported by node agents, drained by the engine."""

    clock: VirtualClock
    queue: list[NodeFinding] = field(default_factory=list)

    def report(self, node: str, reason: str, rule: str = "xid-79@1") -> None:
        self.queue.append(NodeFinding(node, Severity.FATAL, reason, rule, self.clock.now(), evidence={"gpu": 0}))

    def drain_findings(self) -> list[NodeFinding]:
        out, self.queue = self.queue, []
        return out

    def heartbeat_ages(self, now: float) -> dict[str, float]:
        return {}


def world(tmp_path, spec=SPEC, nodes=2, settings=None) -> SimWorld:
    clock = VirtualClock()
    feed = Feed(clock)
    w = SimWorld(
        tmp_path, spec, nodes=nodes, clock=clock, health=feed, settings=settings or EngineSettings(evidence_wait_s=0.0)
    )
    w.feed = feed
    return w


def test_slurm_refuses_a_job_its_partition_can_never_hold():
    # Slurm 22.05: "Requested node configuration is not available" (checked on the harness's Slurm).
    cluster = SimCluster(VirtualClock(), 2, "main")
    with pytest.raises(PermanentError, match="node configuration is not available"):
        cluster.submit(SubmitRequest("r", "/s", "r", "main", 2, "c", exclude=("n001",)))
    cluster.submit(SubmitRequest("r", "/s", "r", "main", 1, "c", exclude=("n001",)))


def test_a_restart_without_spares_runs_again_as_soon_as_its_node_is_repaired(tmp_path):
    w = world(tmp_path)
    w.until(lambda: w.running(0))
    w.cluster.crash_node("n001")
    w.until(lambda: w.run().attempt.seq == 1)
    for _ in range(30):
        w.tick()
    assert w.job().state.value == "PENDING"  # n001 is drained: there is nowhere to go
    waiting = w.events(EventKind.WAITING_FOR_NODES)
    assert waiting and "n001" in waiting[-1].message and "needs 2 nodes" in waiting[-1].message
    w.cluster.repair_node("n001")  # the operator resumes it
    w.tick()
    w.tick()
    assert w.running(1) and set(w.job().nodes) == {"n001", "n002"}
    assert "n001" not in w.run().excluded
    assert [e for e in w.events(EventKind.NODE_RETURNED) if "n001" in e.message]


def test_a_node_slurms_health_check_drained_first_rejoins_after_repair(tmp_path):
    w = world(tmp_path, spec=replace(SPEC, nodes=2), nodes=3)
    w.until(lambda: w.running(0))
    victim = w.job().nodes[0]
    w.cluster.health_check_drain(victim, "NHC: GPU 0 fell off the bus")  # before the supervisor acts
    w.feed.report(victim, "XID 79: GPU has fallen off the bus")
    w.until(lambda: w.running(1))
    assert victim in w.run().excluded and victim not in w.job().nodes
    assert [e for e in w.events(EventKind.NODE_EXCLUDED) if "already drained" in e.message]
    w.cluster.repair_node(victim)
    w.tick()
    w.tick()
    assert victim not in w.run().excluded, "a node Slurm drained first must rejoin once it is back"
    assert [e for e in w.events(EventKind.NODE_RETURNED) if victim in e.message]
    # the next restart may use it again, and no stale "drained" action is left on the node
    w.cluster.crash_node(w.job().nodes[0])
    w.until(lambda: w.running(2))
    assert victim in w.job().nodes
    assert {v.node: v.verdict for v in w.store.verdicts()}[victim] is Verdict.HEALTHY


def test_a_run_that_cannot_be_placed_says_why_and_pages_once_past_the_threshold(tmp_path):
    w = world(tmp_path, settings=EngineSettings(evidence_wait_s=0.0, stuck_page_s=600.0))
    w.until(lambda: w.running(0))
    w.cluster.crash_node("n002")
    w.until(lambda: w.run().attempt.seq == 1)
    w.tick()
    first = w.events(EventKind.WAITING_FOR_NODES)
    assert len(first) == 1
    assert "n002" in first[0].message and "DOWN+DRAIN" in first[0].message and "1 usable" in first[0].message
    assert not w.events(EventKind.STUCK)
    assert w.engine.next_deadline() is not None  # the page is a timer: the simulator must not skip it
    for _ in range(70):
        w.tick(10.0)
    stuck = w.events(EventKind.STUCK)
    assert len(stuck) == 1 and "n002" in stuck[0].message
    assert len(w.events(EventKind.WAITING_FOR_NODES)) == 1  # one entry per wait, not one per tick
    alerts = Pager().feed(w.store.events("llm"))
    assert [a.kind for a in alerts if a.action == "trigger"] == ["stuck"]
    w.cluster.repair_node("n002")
    w.until(lambda: w.running(1))
    resolved = Pager()
    resolved.feed(stuck)
    assert [a.action for a in resolved.feed(w.events(EventKind.STARTED))] == ["resolve"]


def _lemon_then_short(w: SimWorld) -> str:
    """n001 faults once (quarantined: ``faults = 1``) and is repaired: Slurm has it back in service.
    Then two more nodes crash, and only the lemon can make up the run's second node."""
    w.until(lambda: w.running(0))
    w.feed.report("n001", "XID 48: double-bit ECC error", "xid-48@1")
    w.until(lambda: w.running(1))
    w.cluster.repair_node("n001")
    w.tick()
    w.tick()
    w.cluster.crash_node(w.job().nodes[0])
    w.until(lambda: w.running(2))
    assert "n001" not in w.job().nodes and "n001" in w.job().excluded_nodes  # enough other nodes
    w.cluster.crash_node(w.job().nodes[0])
    return "n001"


def test_quarantine_never_holds_a_run_hostage_without_a_decision_on_record(tmp_path):
    settings = EngineSettings(evidence_wait_s=0.0, quarantine=QuarantineSettings(faults=1))
    w = world(tmp_path, nodes=4, settings=settings)
    lemon = _lemon_then_short(w)
    w.until(lambda: w.running(3))
    assert lemon in w.job().nodes  # the least-bad quarantined node, used ...
    overrides = w.events(EventKind.QUARANTINE_OVERRIDE)
    assert len(overrides) == 1 and lemon in overrides[0].message  # ... with the decision on record


def test_quarantine_policy_wait_waits_and_says_so(tmp_path):
    quarantine = QuarantineSettings(faults=1, when_short="wait")
    w = world(tmp_path, nodes=4, settings=EngineSettings(evidence_wait_s=0.0, quarantine=quarantine))
    lemon = _lemon_then_short(w)
    for _ in range(20):
        w.tick()
    assert not w.running(3)
    waiting = w.events(EventKind.WAITING_FOR_NODES)[-1].message
    assert lemon in waiting and "quarantined" in waiting and "when_short" in waiting
    assert not w.events(EventKind.QUARANTINE_OVERRIDE)


def test_a_pending_restart_drops_a_returned_node_from_its_exclude_list(tmp_path):
    # With a named spare the exclusion is satisfiable, so the job is submitted excluding the
    # broken node; while it waits for the busy nodes, the node comes back: Slurm must hear of it.
    spec = replace(SPEC, nodes=2, spare_policy=SparePolicy.NAMED, spare_nodes=("n004",))
    w = world(tmp_path, spec=spec, nodes=4)
    w.until(lambda: w.running(0))
    other = w.cluster.submit(SubmitRequest("x", "/s", "other", "main", 2, "other", exclude=("n001", "n002")))
    w.cluster.crash_node("n001")
    w.until(lambda: w.run().attempt.seq == 1)
    w.tick()
    assert "n001" in w.job().excluded_nodes and w.job().state.value == "PENDING"
    w.cluster.repair_node("n001")
    w.until(lambda: w.running(1), limit=6)  # quiet ticks read nodes every third tick
    assert "n001" in w.job().nodes and "n001" not in w.job().excluded_nodes
    assert w.cluster.inspect().jobs[other].state.value == "RUNNING"


def test_the_daemon_config_sets_the_page_threshold_and_the_quarantine_policy(tmp_path):
    from supervisor.cli.wiring import engine_settings
    from supervisor.config import ConfigError, load_daemon_config

    path = tmp_path / "supervisor.toml"
    path.write_text('[daemon]\nstuck_page_after_s = 600\n[quarantine]\nwhen_short = "wait"\n')
    settings = engine_settings(load_daemon_config(path))
    assert settings.stuck_page_s == 600.0 and settings.quarantine.when_short == "wait"
    path.write_text('[quarantine]\nwhen_short = "never"\n')
    with pytest.raises(ConfigError, match="when_short"):
        load_daemon_config(path)
