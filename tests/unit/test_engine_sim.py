"""The engine and store on the simulated cluster: recovery, crash safety, degraded modes.

Everything runs on virtual time: no sleeps.
"""

from __future__ import annotations

import re
from dataclasses import replace

import pytest
from unit.sim_world import SimWorld

from supervisor.domain.cluster import JobState, NodeChange
from supervisor.domain.records import EventKind
from supervisor.domain.run import RestartMode, RunState, SparePolicy
from supervisor.engine.loop.daemon import Pacing, run_loop
from supervisor.sim.slurm.fence import SimFencer
from supervisor.testing.kit.specs import spec

SPEC = spec(spare_policy=SparePolicy.NAMED, spare_nodes=("n004",), max_restarts=5)


def crash_and_restart(w: SimWorld, node: str, limit: int = 300) -> None:
    """The run's first job runs, ``node`` crashes, the run runs again in its second attempt."""
    w.until(w.running)
    w.cluster.crash_node(node)
    w.until(lambda: w.running() and w.run().attempt.seq == 1, limit=limit)


def crash_under_the_loop(w: SimWorld, after_s: float, urgent_interval_s: float) -> float:
    """The daemon's loop (5 s polls) runs the run; n001 crashes ``after_s`` in, the loop stops 30 s
    after that. Returns when it crashed."""
    w.until(w.running)
    crash_at = w.clock.now() + after_s
    w.clock.call_at(crash_at, w.cluster.crash_node, "n001")
    w.clock.call_at(crash_at + 30.0, w.clock.stop)
    run_loop(w.engine, Pacing(poll_interval_s=5.0, urgent_interval_s=urgent_interval_s))
    return crash_at


def event_keys(w):
    return sorted(e.key for e in w.events() if e.kind is not EventKind.ADOPTED)


def test_node_crash_is_recovered_on_healthy_nodes(tmp_path):
    w = SimWorld(tmp_path, SPEC)
    w.until(w.running)
    first = w.job()
    assert set(first.nodes) == {"n001", "n002"} and "n004" in first.excluded_nodes  # spare kept out
    crashed_at = w.clock.now()
    w.cluster.crash_node("n001")
    w.until(lambda: w.running() and w.run().attempt.seq == 1)
    job = w.job()
    assert "n001" not in job.nodes and set(job.nodes) == {"n002", "n003"}
    assert w.clock.now() - crashed_at < 10.0  # before Slurm's own SlurmdTimeout would even notice
    node = w.cluster.node_info("n001")
    assert node.down and node.drained and node.reason.startswith("slurm-supervisor: run llm:")
    kinds = [e.kind for e in w.store.events("llm")]
    for k in (EventKind.FAULT, EventKind.NODE_DRAINED, EventKind.STOPPED, EventKind.RESTARTED):
        assert k in kinds
    assert w.run().restarts_spent == 1 and w.run().excluded.keys() == {"n001"}
    assert w.run_overlaps() == []


def test_hung_slurmd_is_caught_by_slurm_and_fenced_when_a_fence_is_configured(tmp_path):
    w = SimWorld(tmp_path, SPEC)
    fencer = w.fencer = SimFencer(w.cluster)
    w.new_engine()
    w.until(w.running)
    w.cluster.freeze_node("n001")  # slurmd hangs, the job's processes keep running
    w.until(lambda: w.running() and w.run().attempt.seq == 1, limit=100)
    assert fencer.fenced == ["n001"]
    assert w.run_overlaps() == []  # the stale copy was killed before the next incarnation started
    assert EventKind.FENCED in [e.kind for e in w.store.events("llm")]


def test_without_a_fence_the_logbook_says_what_could_not_be_confirmed(tmp_path):
    w = SimWorld(tmp_path, SPEC)
    w.until(w.running)
    w.cluster.freeze_node("n001")
    w.until(lambda: w.running() and w.run().attempt.seq == 1, limit=100)
    warnings = [e.message for e in w.store.events("llm") if e.kind is EventKind.WARNING]
    assert any("cannot confirm that nothing of attempt 0" in m and "n001" in m for m in warnings)
    assert w.run_overlaps()  # honest: the frozen copy still exists ...
    w.cluster.restore_node("n001")  # ... until the node's slurmd returns and Slurm kills it
    assert all(inc.end is not None for inc in w.cluster.incarnation_log[:1])


def test_spare_stands_in_when_no_other_node_is_idle(tmp_path):
    w = SimWorld(tmp_path, SPEC)
    crash_and_restart(w, "n001")
    w.cluster.crash_node("n003")
    w.until(lambda: w.running() and w.run().attempt.seq == 2)
    assert set(w.job().nodes) == {"n002", "n004"}


def test_without_probe_slurm_signals_are_enough(tmp_path):
    w = SimWorld(tmp_path, SPEC, probe=False)
    crash_and_restart(w, "n002", limit=100)
    assert "n002" not in w.job().nodes


def test_without_node_rights_the_node_is_excluded_not_drained(tmp_path):
    w = SimWorld(tmp_path, SPEC, node_rights=False)
    crash_and_restart(w, "n001", limit=100)
    assert "n001" not in w.job().nodes
    assert not w.cluster.node_info("n001").reason.startswith("slurm-supervisor")
    msgs = [e.message for e in w.store.events("llm") if e.kind is EventKind.NODE_EXCLUDED]
    assert msgs and "could not set it DOWN" in msgs[0]
    assert w.cluster.count_calls("set_node_state", include_failed=True) == 1  # learned, not retried


def test_budget_spent_gives_up(tmp_path):
    w = SimWorld(tmp_path, replace(SPEC, max_restarts=1), nodes=6)
    w.until(w.running)
    w.cluster.crash_node(w.job().nodes[0])
    w.until(lambda: w.running() and w.run().attempt.seq == 1)
    w.cluster.crash_node(w.job().nodes[0])
    w.until(lambda: w.run().state is RunState.FAILED)
    assert "restart budget spent" in w.run().end_reason
    assert w.cluster.count_calls("submit") == 2


def test_do_not_restart_exit_code_stops_the_run(tmp_path):
    w = SimWorld(tmp_path, SPEC)
    w.until(w.running)
    w.cluster.finish_job(w.run().attempt.job_id, exit_code=93)
    w.until(lambda: w.run().state is RunState.FAILED)
    assert w.cluster.count_calls("submit") == 1
    assert "do-not-restart code 93" in w.run().end_reason


def test_failed_job_is_restarted_and_completion_ends_the_run(tmp_path):
    w = SimWorld(tmp_path, SPEC)
    w.until(w.running)
    w.cluster.finish_job(w.run().attempt.job_id, exit_code=1)
    w.until(lambda: w.running() and w.run().attempt.seq == 1)
    w.cluster.finish_job(w.run().attempt.job_id, exit_code=0)
    w.until(lambda: w.run().state is RunState.COMPLETED)
    assert w.run().excluded == {}  # a script failure is no node's fault


def test_requeue_mode_follows_slurms_requeue_and_excludes_the_node(tmp_path):
    w = SimWorld(tmp_path, replace(SPEC, restart_mode=RestartMode.REQUEUE))
    w.until(w.running)
    job_id = w.run().attempt.job_id
    w.cluster.crash_node("n001")
    w.until(lambda: w.running() and w.run().attempt.seq == 1)
    job = w.job()
    assert job.job_id == job_id and job.restart_count == 1 and "n001" not in job.nodes
    assert w.cluster.count_calls("submit") == 1 and w.cluster.count_calls("cancel") == 0


def test_controller_down_means_no_action_and_catch_up_after(tmp_path):
    w = SimWorld(tmp_path, SPEC, probe=False)
    w.until(w.running)
    w.cluster.controller_down(True)
    w.cluster.crash_node("n001")
    before = len(w.cluster.calls) - w.cluster.count_calls("snapshot", include_failed=True)
    w.ticks(60)
    after = len(w.cluster.calls) - w.cluster.count_calls("snapshot", include_failed=True)
    assert before == after  # nothing but failed snapshots while Slurm was away
    assert w.run().state is RunState.RUNNING
    w.cluster.controller_down(False)
    w.until(lambda: w.running() and w.run().attempt.seq == 1)


def test_cancel_request(tmp_path):
    w = SimWorld(tmp_path, SPEC)
    w.until(w.running)
    w.store.request_cancel("llm", w.clock.now())
    w.until(lambda: w.run().state is RunState.CANCELLED)
    assert w.cluster.job_info(w.run().attempt.job_id).state is JobState.CANCELLED


def test_daemon_loop_stops_cleanly_and_leaves_the_job_running(tmp_path):
    w = SimWorld(tmp_path, SPEC)
    w.clock.call_at(w.clock.now() + 120, w.clock.stop)
    ticks = run_loop(w.engine, Pacing(poll_interval_s=5.0))
    assert 20 <= ticks <= 30
    assert w.job().state is JobState.RUNNING
    assert w.cluster.count_calls("cancel") == 0


BOUNDARIES = ["before_intent", "after_intent", "after_execute", "after_complete"]
KINDS = ["node_state", "cancel", "submit"]


def _recover_with_crash(tmp_path, boundary=None, kind=None):
    w = SimWorld(tmp_path, SPEC)
    w.until(w.running)
    w.new_engine()
    fired = w.crash_once(boundary, kind) if boundary else []  # armed after the first job runs
    w.cluster.crash_node("n001")
    w.survive_crash(lambda: w.until(lambda: w.running() and w.run().attempt.seq == 1))
    w.ticks(5)
    return w, fired


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("boundary", BOUNDARIES)
def test_crash_at_every_action_boundary(tmp_path, boundary, kind):
    base, _ = _recover_with_crash(tmp_path / "base")
    w, fired = _recover_with_crash(tmp_path / "crash", boundary, kind)
    assert fired == [(boundary, kind)]
    assert w.cluster.count_calls("submit") == 2  # the first job and exactly one restart
    changes = [c[2] for c in w.cluster.calls if c[0] == "set_node_state"]
    assert changes == [NodeChange.DOWN, NodeChange.DRAIN]  # one down, one drain
    assert w.cluster.count_calls("cancel") <= 1
    assert w.cluster.count_calls("requeue") == 0
    assert event_keys(w) == event_keys(base)  # no logbook event lost, none doubled
    assert w.run().restarts_spent == 1
    assert w.store.open_actions() == []
    assert w.run_overlaps() == []


def test_node_info_is_read_every_third_quiet_tick_and_every_tick_in_motion(tmp_path):
    w = SimWorld(tmp_path, SPEC)
    w.until(w.running)
    w.ticks(3)
    start = len(w.cluster.calls)
    w.ticks(30)
    snaps = [c for c in w.cluster.calls[start:] if c[0] == "snapshot"]
    assert len(snaps) == 30 and sum(1 for c in snaps if c[1]) == 10  # 1 + 2/3 RPCs per quiet tick
    w.cluster.crash_node("n001")
    start = len(w.cluster.calls)
    w.until(lambda: w.running() and w.run().attempt.seq == 1)
    snaps = [c for c in w.cluster.calls[start:] if c[0] == "snapshot"]
    in_motion = snaps[2:]  # from the first failed probe on, every tick reads the nodes
    assert in_motion and all(c[1] for c in in_motion)


def test_daemon_ticks_fast_while_recovering(tmp_path):
    w = SimWorld(tmp_path, SPEC)
    crash_at = crash_under_the_loop(w, after_s=12.0, urgent_interval_s=0.5)
    events = w.store.events("llm")
    restarted = next(e for e in events if e.kind is EventKind.RESTARTED)
    assert restarted.at - crash_at <= 5.0 + 1.0 + 0.5  # one regular tick to notice, then fast ticks


def test_a_suspect_node_is_confirmed_dead_when_its_failures_span_the_confirmation_time(tmp_path):
    """The probe that confirms a death runs when the failures span ``probe_confirm_s`` (1 s), not at
    the next urgent tick after it (failures at 0, 0.5 and 1.0 s, not 0, 0.5, 1.0+0.5)."""
    w = SimWorld(tmp_path, SPEC)
    crash_under_the_loop(w, after_s=2.0, urgent_interval_s=0.4)
    fault = next(e for e in w.store.events("llm") if e.kind is EventKind.FAULT)
    spans = [float(x) for x in re.findall(r"failed \d+ times over ([0-9.]+) s", fault.message)]
    assert spans and all(1.0 <= span <= 1.05 for span in spans), fault.message


def test_one_runs_inconsistency_is_logged_and_does_not_stop_the_daemon(tmp_path):
    w = SimWorld(tmp_path, SPEC)
    w.until(w.running)
    stale = w.run()  # what a decision was based on: RUNNING ...
    w.store._db.execute("UPDATE runs SET state = 'completed' WHERE name = 'llm'")  # ... but the store moved on
    w.cluster.crash_node("n001")
    w.clock.wait(12.0)
    from supervisor.domain.decide.policy import Observation
    from supervisor.engine.reconcile import TickResult

    obs = Observation(w.cluster.inspect(), {"n001": "dead"})
    w.engine._reconcile_run(stale, obs, TickResult(ok=True))  # COMPLETED -> RECOVERING is illegal
    warnings = [e.message for e in w.store.events("llm") if e.kind is EventKind.WARNING]
    assert any("could not act on this run" in m and "completed -> recovering" in m for m in warnings)
    assert w.engine.tick().ok  # the loop goes on
