"""Jobs that end while the daemon is stopped and that squeue forgets (MinJobAge, 300 s here) before
it comes back: the engine reads their outcomes from accounting (the simulated cluster's
``job_records``, as sacct) and continues each run as it would have had it seen the job end.
Without accounting the run stops as before, and its logbook says why the outcome is unknown.

Virtual time: the daemon is "stopped" by not ticking, and restarted with ``new_engine()``.
"""

from __future__ import annotations

from dataclasses import replace

from unit.sim_world import SimWorld

from supervisor.domain.records import EventKind
from supervisor.domain.run import RestartMode, RunState
from supervisor.engine.facts.forgotten import NO_ACCOUNTING
from supervisor.testing.kit.specs import spec

SPEC = spec(max_restarts=5)
PAST_MIN_JOB_AGE = 400.0


def stopped_daemon_misses_the_end(w: SimWorld, exit_code: int, *, accounting: bool = True) -> int:
    """The run's job ends while the daemon is stopped; squeue forgets it; the daemon starts again."""
    w.until(w.running)
    job_id = w.job().job_id
    w.cluster.finish_job(job_id, exit_code=exit_code)
    w.clock.advance(PAST_MIN_JOB_AGE)
    assert job_id not in w.cluster.inspect().jobs  # squeue no longer lists it
    w.accounting = w.cluster if accounting else None
    w.new_engine()
    w.engine.adopt()
    return job_id


def sacct_notes(w: SimWorld) -> list[str]:
    return [e.message for e in w.events(EventKind.NOTE) if e.evidence.get("source") == "sacct"]


def test_a_job_that_completed_unseen_completes_the_run(tmp_path):
    w = SimWorld(tmp_path, SPEC)
    job_id = stopped_daemon_misses_the_end(w, 0)
    w.until(lambda: w.run().state.terminal, limit=5)
    assert w.run().state is RunState.COMPLETED
    assert len(sacct_notes(w)) == 1 and "sacct" in sacct_notes(w)[0] and "COMPLETED" in sacct_notes(w)[0]
    ended = w.store.attempts("llm")[-1]
    assert ended.end_state == "COMPLETED" and ended.ended_at < w.clock.now() - PAST_MIN_JOB_AGE + 1
    assert w.cluster.count_calls("job_records") == 1  # one sacct call
    assert ended.job_id == job_id


def test_a_job_that_failed_unseen_is_restarted_as_it_would_have_been(tmp_path):
    w = SimWorld(tmp_path, SPEC)
    stopped_daemon_misses_the_end(w, 3)
    w.until(lambda: w.running(seq=1), limit=20)
    assert w.run().restarts_spent == 1
    fault = w.events(EventKind.FAULT)[0]
    assert fault.evidence["exit_code"] == 3 and "exit code 3" in fault.message
    assert len(sacct_notes(w)) == 1
    assert not w.events(EventKind.GAVE_UP)


def test_a_do_not_restart_exit_code_read_from_accounting_stops_the_run(tmp_path):
    w = SimWorld(tmp_path, replace(SPEC, do_not_restart_exit_codes=(93,)))
    stopped_daemon_misses_the_end(w, 93)
    w.until(lambda: w.run().state.terminal, limit=5)
    assert w.run().state is RunState.FAILED and "do-not-restart code 93" in w.events(EventKind.GAVE_UP)[0].message


def test_without_accounting_the_outcome_is_unknown_and_the_logbook_says_why(tmp_path):
    w = SimWorld(tmp_path, SPEC)
    stopped_daemon_misses_the_end(w, 0, accounting=False)
    w.until(lambda: w.run().state.terminal, limit=5)
    assert w.run().state is RunState.FAILED  # not restarted blindly: it may have completed
    gave_up = w.events(EventKind.GAVE_UP)[0].message
    assert "outcome is unknown" in gave_up and NO_ACCOUNTING in gave_up and "slurmdbd" in gave_up
    assert w.cluster.count_calls("job_records") == 0


def test_while_accounting_cannot_answer_the_run_waits_and_says_so(tmp_path):
    w = SimWorld(tmp_path, SPEC)
    w.cluster.slurmdbd_down()
    stopped_daemon_misses_the_end(w, 0)
    w.ticks(5)
    assert not w.run().state.terminal and w.store.attempts("llm")[-1].ended_at is None
    waits = [e.message for e in w.events(EventKind.WARNING) if "waiting for its outcome" in e.message]
    assert len(waits) == 1 and "accounting did not answer" in waits[0]  # said once, not every tick
    w.cluster.slurmdbd_down(False)
    w.until(lambda: w.run().state.terminal, limit=5)
    assert w.run().state is RunState.COMPLETED


def test_a_job_accounting_has_no_record_of_stops_the_run(tmp_path):
    w = SimWorld(tmp_path, SPEC)
    w.until(w.running)
    job_id = w.job().job_id
    w.cluster.finish_job(job_id, exit_code=0)
    w.clock.advance(PAST_MIN_JOB_AGE)
    w.accounting = NoRecords()
    w.new_engine()
    w.until(lambda: w.run().state.terminal, limit=5)
    assert "has no record of it" in w.events(EventKind.GAVE_UP)[0].message


class NoRecords:
    """Accounting that knows no job (enabled after the job ran, or its records purged)."""

    def job_records(self, job_ids):
        return {}


def test_a_requeue_missed_while_stopped_counts_as_a_restart(tmp_path):
    w = SimWorld(tmp_path, replace(SPEC, restart_mode=RestartMode.REQUEUE))
    w.until(w.running)
    job_id = w.job().job_id
    w.cluster.requeue(job_id)  # requeued while the daemon was stopped (here by hand; a node fault alike)
    w.clock.advance(60.0)
    w.cluster.finish_job(job_id, exit_code=0)  # ... ran again, and completed
    w.clock.advance(PAST_MIN_JOB_AGE)
    w.accounting = w.cluster
    w.new_engine()
    w.until(lambda: w.run().state.terminal, limit=10)
    assert w.run().state is RunState.COMPLETED
    assert [e.kind for e in w.events()].count(EventKind.REQUEUED) == 1
    assert [(a.job_id, a.restart_count) for a in w.store.attempts("llm")] == [(job_id, 0), (job_id, 1)]
