"""Node health in the engine, on the simulated cluster: fatal findings drain and restart at once,
degraded ones wait for the checkpoint boundary, silent agents are caught before Slurm notices,
the blast radius holds under a mass fault, and lemon nodes stay out of every run.

The health feed is a stateful fake of the HealthFeed port (the real ingest runs the same port in
tests/unit/test_ingest.py and the agent tests)."""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import pytest
from unit.sim_world import SimWorld

from supervisor.adapters.paging.webhook import Pager
from supervisor.domain.cluster import NodeChange
from supervisor.domain.health.findings import HeartbeatSettings, NodeFinding, Severity
from supervisor.domain.health.quarantine import QuarantineSettings, quarantined
from supervisor.domain.records import EventKind, Verdict
from supervisor.domain.run import RestartMode, SparePolicy
from supervisor.engine.reconcile import EngineSettings
from supervisor.sim.clock import VirtualClock
from supervisor.testing.kit.specs import spec


@dataclass
class FakeFeed:
    clock: VirtualClock
    queue: list[NodeFinding] = field(default_factory=list)
    last_report: dict[str, float] = field(default_factory=dict)
    silent: set[str] = field(default_factory=set)

    def report(self, node: str, severity: Severity, reason: str, rule: str) -> None:
        self.queue.append(NodeFinding(node, severity, reason, rule, self.clock.now(), evidence={"gpu": 3}))

    def beat(self, nodes) -> None:
        for n in nodes:
            if n not in self.silent:
                self.last_report[n] = self.clock.now()

    def drain_findings(self) -> list[NodeFinding]:
        out, self.queue = self.queue, []
        return out

    def heartbeat_ages(self, now: float) -> dict[str, float]:
        return {n: now - t for n, t in self.last_report.items()}


SPEC = spec(nodes=4, spare_policy=SparePolicy.NAMED, spare_nodes=("n007", "n008"), max_restarts=5)


def world(tmp_path, specs=(SPEC,), nodes=8, settings=EngineSettings(), **cluster) -> SimWorld:
    """The cluster, with a health feed whose agents beat for every running job's nodes."""
    clock = VirtualClock()
    w = SimWorld(tmp_path, *specs, nodes=nodes, clock=clock, settings=settings, health=FakeFeed(clock), **cluster)
    w.before_tick.append(lambda: heartbeats(w))
    return w


def heartbeats(w: SimWorld) -> None:
    for r in w.store.runs(active_only=True):
        if r.attempt is not None and r.attempt.job_id in w.cluster.inspect().jobs:
            job = w.cluster.inspect().jobs[r.attempt.job_id]
            if not job.state.finished:
                w.health.beat(job.nodes)


def test_a_fatal_xid_drains_the_node_without_downing_it_and_restarts_without_it(tmp_path):
    w = world(tmp_path)
    w.until(w.running)
    victim = w.run().attempt.nodes[1]
    w.health.report(victim, Severity.FATAL, "XID 79: GPU has fallen off the bus (gpu 3)", "xid-79@1")
    latency = w.until(lambda: w.running(1))
    assert latency <= 5.0
    job = w.cluster.inspect().jobs[w.run().attempt.job_id]
    assert victim not in job.nodes and victim in job.excluded_nodes
    node = w.cluster.node_info(victim)
    assert node.drained and not node.down and "XID 79" in node.reason  # alive: drained, not downed
    fault = [e for e in w.events(EventKind.FAULT) if e.evidence.get("node") == victim][0]
    assert "rule xid-79@1" in fault.message


def test_a_degraded_node_is_kept_out_at_the_next_checkpoint_boundary_not_at_once(tmp_path):
    w = world(tmp_path)
    w.until(w.running)
    slow = w.run().attempt.nodes[2]
    w.health.report(slow, Severity.DEGRADED, "HW slowdown sustained (gpu 3)", "clocks-hw-slowdown@1")
    for _ in range(30):
        w.tick()
    assert w.running(0)  # no restart for a degraded node by itself
    assert slow in w.run().deferred and w.events(EventKind.NODE_DEGRADED)
    assert w.store.verdicts()[0].verdict is Verdict.SUSPECT
    # a crash elsewhere: the restart leaves the degraded node out too
    other = w.run().attempt.nodes[0]
    w.cluster.crash_node(other)
    w.until(lambda: w.running(1))
    job = w.cluster.inspect().jobs[w.run().attempt.job_id]
    assert slow not in job.nodes and other not in job.nodes


def test_agent_silence_with_fresh_peers_is_a_dead_node_before_slurm_notices(tmp_path):
    w = world(
        tmp_path,
        settings=EngineSettings(heartbeat=HeartbeatSettings(timeout_s=15.0, startup_grace_s=10.0)),
        slurmd_timeout=300.0,
        down_after=600.0,
    )  # Slurm's defaults: SlurmdTimeout=300
    w.until(w.running)
    for _ in range(15):
        w.tick()
    frozen = w.run().attempt.nodes[3]
    w.cluster.freeze_node(frozen)  # slurmd hangs; its TCP port still accepts
    w.health.silent.add(frozen)
    latency = w.until(lambda: w.running(1), limit=60)
    assert latency < 30.0  # Slurm's SlurmdTimeout (300 s by default) would take far longer
    fault = [e for e in w.events(EventKind.FAULT) if e.evidence.get("node") == frozen][0]
    assert "agent silent" in fault.message


def test_every_agent_silent_is_not_a_node_fault(tmp_path):
    w = world(tmp_path, settings=EngineSettings(heartbeat=HeartbeatSettings(timeout_s=15.0, startup_grace_s=10.0)))
    w.until(w.running)
    for _ in range(15):
        w.tick()
    w.health.silent.update(w.cluster.node_names)  # the daemon's ingest or the network broke, not the nodes
    for _ in range(60):
        w.tick()
    assert w.running(0) and not w.events(EventKind.FAULT)


def mass_fault_world(tmp_path, nodes=12, **settings) -> SimWorld:
    """An 8-node run on a 12-node partition (4 idle nodes to restart on), 2 drains per run per hour."""
    spec = replace(SPEC, nodes=8, spare_nodes=(), spare_policy=SparePolicy.PARTITION_IDLE, max_restarts=10)
    caps = EngineSettings(max_drains_per_run_per_hour=2, **settings)
    return world(tmp_path, specs=(spec,), nodes=nodes, settings=caps)


def fault_half(w: SimWorld) -> list[str]:
    faulted = list(w.run().attempt.nodes[:4])
    for n in faulted:
        w.health.report(n, Severity.FATAL, "XID 79: GPU has fallen off the bus", "xid-79@1")
    return faulted


def test_half_the_nodes_faulting_at_once_drains_the_cap_excludes_the_rest_and_restarts_once(tmp_path):
    w = mass_fault_world(tmp_path)
    w.until(w.running)
    faulted = fault_half(w)
    start = w.clock.now()
    while w.clock.now() < start + 600:  # the first 10 minutes
        w.tick(2.0)
    drained = [n for n in w.cluster.node_names if w.cluster.node_info(n).drained]
    assert len(drained) == 2 and set(drained) <= set(faulted)
    over_cap = set(faulted) - set(drained)
    r = w.run()
    assert w.running(1) and r.restarts_spent == 1  # one restart, not the whole budget in seconds
    assert over_cap <= set(r.excluded) and not over_cap & set(w.job().nodes)
    assert all(not w.cluster.node_info(n).drained for n in over_cap)  # kept out, not drained
    verdicts = {v.node: v for v in w.store.verdicts()}
    assert {verdicts[n].action for n in over_cap} == {"blast-radius"}
    assert all(verdicts[n].verdict is Verdict.BAD and "not drained" in verdicts[n].reason for n in over_cap)
    mass = w.events(EventKind.MASS_FAULT)
    assert len(mass) == 1 and set(mass[0].evidence["excluded"]) == over_cap
    alerts = Pager().feed(w.store.events("llm"))
    assert [(a.kind, a.action) for a in alerts if a.kind == "mass_fault"] == [
        ("mass_fault", "trigger"),
        ("mass_fault", "resolve"),  # the restarted attempt runs
    ]


def test_a_second_wave_right_after_the_restart_is_the_same_incident_and_pages_once(tmp_path):
    w = mass_fault_world(tmp_path, nodes=20)
    w.until(w.running)
    fault_half(w)
    w.until(lambda: w.running(1))
    fault_half(w)  # half of the new attempt's nodes, a minute later: the same incident
    w.until(lambda: w.running(2))
    for _ in range(60):
        w.tick(2.0)
    assert w.running(2) and w.run().restarts_spent == 2
    assert len(w.events(EventKind.MASS_FAULT)) == 1
    pages = [a for a in Pager().feed(w.store.events("llm")) if a.kind == "mass_fault" and a.action == "trigger"]
    assert len(pages) == 1
    # ... and a mass fault after the restarted attempt has run for a while is a new incident
    for _ in range(400):
        w.tick(2.0)
    fault_half(w)
    w.until(lambda: w.running(3))
    assert len(w.events(EventKind.MASS_FAULT)) == 2


def test_too_few_nodes_left_after_a_mass_fault_the_run_waits_and_says_why(tmp_path):
    w = mass_fault_world(tmp_path, nodes=8)
    w.until(w.running)
    faulted = fault_half(w)
    for _ in range(300):
        w.tick(2.0)
    r = w.run()
    assert r.restarts_spent <= 1 and not w.running()
    waits = w.events(EventKind.WAITING_FOR_NODES)
    assert waits and all(n in waits[-1].evidence["waiting_for"] for n in faulted)
    assert len(w.events(EventKind.MASS_FAULT)) == 1


def test_nodes_a_healthcheck_hook_drained_count_toward_the_cap(tmp_path):
    w = mass_fault_world(tmp_path, max_drains_per_hour=2)
    w.until(w.running)
    spare = [n for n in w.cluster.node_names if n not in w.run().attempt.nodes][0]
    w.cluster.set_node_state(spare, NodeChange.DRAIN, "slurm-supervisor healthcheck: XID 79 [rule xid-79@1]")
    w.tick()
    victims = list(w.run().attempt.nodes[:2])
    for n in victims:
        w.health.report(n, Severity.FATAL, "XID 48: double-bit ECC error", "xid-48@1")
    w.until(lambda: w.running(1))
    ours = [n for n in w.cluster.node_names if "run llm" in w.cluster.node_info(n).reason]
    assert len(ours) == 1  # the cluster-wide cap (2 per hour here) had one drain left
    assert len(w.events(EventKind.MASS_FAULT)) == 1


def test_a_node_that_faults_in_two_runs_is_quarantined_for_every_run_until_cleared(tmp_path):
    a = replace(SPEC, name="a", nodes=2, spare_nodes=(), spare_policy=SparePolicy.PARTITION_IDLE)
    b, c = replace(a, name="b"), replace(a, name="c")
    w = world(tmp_path, specs=(a, b), nodes=8, settings=EngineSettings(quarantine=QuarantineSettings(faults=2)))
    w.until(lambda: w.running(0, "a") and w.running(0, "b"))
    assert w.run("a").attempt.nodes == ("n001", "n002") and w.run("b").attempt.nodes == ("n003", "n004")
    w.health.report("n001", Severity.FATAL, "XID 48: double-bit ECC error", "xid-48@1")
    w.until(lambda: w.running(1, "a"))
    w.cluster.set_node_state("n001", NodeChange.RESUME, "admin: reseated the GPU")
    w.health.report("n003", Severity.FATAL, "XID 79: GPU has fallen off the bus", "xid-79@1")
    w.until(lambda: w.running(1, "b"))
    assert "n001" in w.run("b").attempt.nodes  # back in service, and b landed on it
    w.health.report("n001", Severity.FATAL, "XID 48: double-bit ECC error", "xid-48@1")
    w.until(lambda: w.running(2, "b"))
    w.cluster.set_node_state("n001", NodeChange.RESUME, "admin: looks fine to me")
    w.store.add_run(c, w.clock.now())  # a new run must not get the lemon, though Slurm offers it
    w.until(lambda: w.running(0, "c"))
    c_job = w.cluster.inspect().jobs[w.run("c").attempt.job_id]
    assert "n001" in c_job.excluded_nodes and "n001" not in c_job.nodes
    w.store.clear_quarantine("n001", w.clock.now(), "ops", "GPU replaced")
    w.cluster.finish_job(c_job.job_id, exit_code=1)
    w.until(lambda: w.running(1, "c"))
    assert "n001" not in w.cluster.inspect().jobs[w.run("c").attempt.job_id].excluded_nodes


def test_a_drained_node_an_operator_returns_to_service_may_serve_the_run_again(tmp_path):
    spec = replace(SPEC, nodes=4, spare_nodes=(), spare_policy=SparePolicy.PARTITION_IDLE)
    w = world(tmp_path, specs=(spec,), nodes=5)
    w.until(w.running)
    victim = w.run().attempt.nodes[0]
    w.health.report(victim, Severity.FATAL, "XID 79: GPU has fallen off the bus", "xid-79@1")
    w.until(lambda: w.running(1))
    assert victim in w.run().excluded
    w.cluster.set_node_state(victim, NodeChange.RESUME, "GPU reseated")
    for _ in range(3):
        w.tick()
    assert victim not in w.run().excluded
    returned = w.events(EventKind.NODE_RETURNED)
    assert len(returned) == 1 and victim in returned[0].message
    w.cluster.crash_node(w.run().attempt.nodes[1])  # the only other node left is the returned one
    w.until(lambda: w.running(2))
    assert victim in w.run().attempt.nodes


@pytest.mark.parametrize("restart_daemon", [False, True])
def test_a_finding_on_an_idle_node_is_held_across_a_daemon_restart(tmp_path, restart_daemon):
    """An agent's XID on a node no job uses is reported once (its rule latches). The run's next
    restart may land there: the engine must still hold the finding — also after a daemon restart
    in between — and keep the run off that node."""
    spec = replace(SPEC, nodes=2, spare_nodes=(), spare_policy=SparePolicy.PARTITION_IDLE)
    w = world(tmp_path, specs=(spec,), nodes=3)
    w.until(w.running)
    idle = next(n for n in w.cluster.node_names if n not in w.run().attempt.nodes)
    w.health.report(idle, Severity.FATAL, "XID 79: GPU has fallen off the bus", "xid-79@1")
    w.ticks(2)
    if restart_daemon:
        w.new_engine()
    w.cluster.crash_node(w.run().attempt.nodes[0])  # the restart can only go to the idle node
    w.ticks(30)
    assert idle in w.run().excluded, "the held finding keeps the run off the broken node"


def test_requeue_mode_without_node_rights_stops_the_job_and_restarts_without_the_node(tmp_path):
    """Requeue mode relies on Slurm requeueing a job whose node is DOWN. Without node rights the
    supervisor cannot down the node: it cancels the job instead and resubmits without the node
    (before, the run stayed RECOVERING while the job kept running on the broken node)."""
    spec = replace(SPEC, restart_mode=RestartMode.REQUEUE)
    w = world(tmp_path, specs=(spec,), node_rights=False)
    w.until(w.running)
    victim = w.run().attempt.nodes[1]
    w.health.report(victim, Severity.FATAL, "XID 79: GPU has fallen off the bus", "xid-79@1")
    w.until(lambda: w.running(1), limit=60)
    assert victim in w.run().excluded and victim not in w.job().nodes
    assert w.cluster.count_calls("cancel") == 1


def test_quarantine_counts_findings_on_idle_nodes_and_degraded_nodes_dropped(tmp_path):
    """Every node-level fault counts: a fatal finding on a node no run uses (an idle node's health
    check, prolog or agent), and a degraded node dropped at a checkpoint boundary."""
    spec = replace(SPEC, nodes=2, spare_nodes=(), spare_policy=SparePolicy.PARTITION_IDLE)
    w = world(tmp_path, specs=(spec,), nodes=4, settings=EngineSettings(quarantine=QuarantineSettings(faults=1)))
    w.until(w.running)
    idle = next(n for n in w.cluster.node_names if n not in w.run().attempt.nodes)
    w.health.report(idle, Severity.FATAL, "healthcheck: GPU 0 missing", "gpu-missing@1")
    w.ticks(2)
    faults = w.store.node_faults(0.0)
    assert [f.node for f in faults] == [idle] and faults[0].source != "fault"
    assert idle in quarantined(faults, {}, w.clock.now(), QuarantineSettings(faults=1))


def test_a_storm_that_trickles_in_is_waited_out_not_restarted_into(tmp_path):
    """Faults arriving in waves over a minute (a storm): once the blast radius is spent the restart
    waits a little for the rest of the storm to show, and nodes found faulty after their job ended
    are kept out before the next placement — a couple of restarts, not one per wave."""
    w = mass_fault_world(tmp_path, nodes=20)
    w.until(w.running)
    first = list(w.run().attempt.nodes)
    start = w.clock.now()
    waves = {0: first[:4], 20: first[4:6], 40: first[6:7]}
    while w.clock.now() < start + 600:
        for offset in [o for o in waves if w.clock.now() >= start + o]:
            for n in waves.pop(offset):
                w.health.report(n, Severity.FATAL, "XID 79: GPU has fallen off the bus", "xid-79@1")
        w.tick(2.0)
    assert w.run().restarts_spent <= 2
    assert w.running() and not set(first[:7]) & set(w.job().nodes)
    assert [e for e in w.events(EventKind.BACKOFF) if e.evidence.get("storm")]
