"""Restart pacing (issue 21, item 2): attempts that keep dying soon after they start are restarted
later and later, and a crash loop pauses the run and pages, instead of burning the restart budget
in seconds. Plain data for the rule; the simulated cluster with the real engine and store for the
loop."""

from __future__ import annotations

from dataclasses import replace

import pytest
from unit.sim_world import SimWorld

from supervisor.adapters.paging.webhook import Pager
from supervisor.domain.decide.backoff import fast_failures, restart_backoff
from supervisor.domain.records import AttemptRecord, EventKind
from supervisor.domain.run import RestartPacing, SparePolicy
from supervisor.engine.reconcile import EngineSettings
from supervisor.testing.kit.specs import spec

PACING = RestartPacing(fast_failure_s=600.0, base_s=30.0, max_s=1800.0, jitter=0.2, crash_loop_after=6)


def attempt(seq: int, ran_s: float, *, state: str = "FAILED", nodes: tuple[str, ...] = ("n1",)) -> AttemptRecord:
    start = 10_000.0 * seq
    return AttemptRecord("r", seq, 100 + seq, 0, start, nodes, (), start, start + ran_s, state)


def test_the_delay_doubles_with_each_fast_failure_in_a_row_within_the_jitter():
    delays = []
    for n in range(1, 6):
        history = [attempt(i, 20.0) for i in range(n)]
        backoff = restart_backoff("r", history, PACING)
        assert backoff is not None and not backoff.crash_loop and backoff.fast_failures == n
        expected = 30.0 * 2 ** (n - 1)
        assert 0.8 * expected <= backoff.delay_s <= 1.2 * expected
        assert backoff.until == history[-1].ended_at + backoff.delay_s
        delays.append(backoff.delay_s)
    assert delays == sorted(delays)
    assert restart_backoff("r", [attempt(0, 20.0)], PACING) == restart_backoff("r", [attempt(0, 20.0)], PACING)


def test_a_healthy_stretch_a_success_or_a_node_fault_ends_the_streak():
    assert restart_backoff("r", [attempt(0, 20.0), attempt(1, 3600.0)], PACING) is None
    assert len(fast_failures([attempt(0, 20.0), attempt(1, 3600.0), attempt(2, 20.0)], 600.0)) == 1
    assert restart_backoff("r", [attempt(0, 20.0, state="COMPLETED")], PACING) is None
    assert restart_backoff("r", [attempt(0, 20.0, nodes=("bad",))], PACING, faulty={"bad"}) is None


def test_a_crash_loop_pauses_before_each_restart():
    history = [attempt(i, 20.0) for i in range(6)]
    backoff = restart_backoff("r", history, PACING)
    assert backoff is not None and backoff.crash_loop and backoff.delay_s == PACING.crash_loop_pause_s
    assert "crash loop" in backoff.why


def test_bad_pacing_is_refused():
    with pytest.raises(ValueError, match="backoff_base_s"):
        RestartPacing(base_s=60.0, max_s=30.0)


SPEC = spec(spare_policy=SparePolicy.PARTITION_IDLE, max_restarts=20)


def _dies_20_s_after_start(w: SimWorld) -> None:
    job = w.cluster.inspect().jobs.get(w.run().attempt.job_id)  # an ended job is purged after a while
    if (
        job is not None
        and job.state.value == "RUNNING"
        and job.start_time is not None
        and w.clock.now() - job.start_time >= 20.0
    ):
        w.cluster.finish_job(job.job_id, exit_code=1)


def test_a_job_that_dies_at_start_is_not_restarted_again_and_again(tmp_path):
    w = SimWorld(tmp_path, SPEC, nodes=3, settings=EngineSettings(evidence_wait_s=0.0), interval=5.0)
    w.until(lambda: w.running(0))
    w.before_tick.append(lambda: _dies_20_s_after_start(w))
    start = w.clock.now()
    w.until(lambda: w.clock.now() - start >= 600.0, limit=1000)
    assert w.run().restarts_spent <= 5, "restarts in the first 10 minutes"
    backoffs = w.events(EventKind.BACKOFF)
    assert backoffs and "next restart in" in backoffs[0].message and "soon after starting" in backoffs[0].message
    w.until(lambda: w.clock.now() - start >= 3600.0, limit=2000)
    assert w.run().restarts_spent <= 10, "at least half the budget is left after an hour of crash loop"
    loops = w.events(EventKind.CRASH_LOOP)
    assert len(loops) == 1
    alerts = Pager().feed(w.store.events("llm"))
    assert [a.kind for a in alerts if a.action == "trigger"] == ["crash_loop"]
    assert w.run().state.value != "failed"


def test_restarts_after_a_node_fault_are_not_delayed(tmp_path):
    w = SimWorld(tmp_path, replace(SPEC, nodes=2), nodes=4, settings=EngineSettings(evidence_wait_s=0.0))
    w.until(lambda: w.running(0))
    w.cluster.crash_node(w.job().nodes[0])
    waited = w.until(lambda: w.running(1), limit=60)
    assert waited <= 20.0 and not w.events(EventKind.BACKOFF)


def test_a_submission_slurm_refuses_for_good_is_tried_twice_then_the_run_is_blocked_and_pages_once(tmp_path):
    """Issue 21 item 11: a spec Slurm refuses (here a partition it does not have) is not retried
    about twice a second forever: once more after a minute, then the run is blocked and pages."""
    w = SimWorld(tmp_path, replace(SPEC, partition="nosuch"), nodes=3, interval=0.5)
    w.ticks(600)  # five minutes of urgent ticks
    assert w.cluster.count_calls("submit", include_failed=True) == 2
    run = w.run()
    assert run.state.value == "failed" and "blocked: Slurm refuses" in run.end_reason and "nosuch" in run.end_reason
    alerts = Pager().feed(w.store.events("llm"))
    assert [a.kind for a in alerts if a.action == "trigger"] == ["gave_up"]
