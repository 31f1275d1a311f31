"""Issue 31, item 3: preemption. A job Slurm preempts (PREEMPTED: a higher-priority job took its
nodes) after the trainer saved on the grace signal (GraceTime's SIGTERM) is continued: no restart
spent, no fault, goodput books the gap as 'preempted', not as a failure. One preempted without such
a save is one fault whose lost work is booked and whose line says how to make the next one a
continuation; its cause in goodput is 'Preempted' too, not a failure's.

The engine on the simulated cluster and virtual time (as tests/unit/test_continuation.py)."""

from __future__ import annotations

from dataclasses import replace

from test_continuation import SPEC, kinds, train, world

from supervisor.domain.goodput.account import goodput
from supervisor.domain.records import EventKind
from supervisor.domain.run import RestartMode


def preempted(w) -> int:
    job_id = w.run().attempt.job_id
    w.cluster.preempt(job_id)
    return job_id


def report(w):
    return goodput("llm", w.store.attempts("llm"), w.store.events("llm"), now=w.clock.now())


def test_a_job_preempted_after_its_grace_save_is_continued_and_booked_as_preempted(tmp_path):
    w = world(tmp_path)
    train(w, 1, 200)
    w.ckpt.save(200)  # the trainer saved on GraceTime's SIGTERM
    preempted(w)
    w.clock.wait(5.0)  # the daemon's next poll
    w.until(lambda: w.running(seq=1))
    assert w.run().restarts_spent == 0  # today: a fault, one restart spent
    assert "fault" not in kinds(w) and kinds(w).count("continued") == 1
    (line,) = w.events(EventKind.CONTINUED)
    assert "preempted" in line.message
    assert w.submitted_env()["SSV_RESUME_STEP"] == "200"
    booked = report(w)
    assert booked.interruptions == () and booked.lost.rework_s == 0.0
    assert booked.by_cause["preempted"].restart_s == 5.0 and "continuation" not in booked.by_cause


def test_a_job_preempted_without_a_save_is_one_fault_with_its_lost_work_under_preempted(tmp_path):
    w = world(tmp_path)
    train(w, 1, 300)
    w.ckpt.save(200)  # no save on the grace signal: 100 steps since the newest checkpoint
    preempted(w)
    w.until(lambda: w.running(seq=1))
    faults = w.events(EventKind.FAULT)
    assert len(faults) == 1 and "continued" not in kinds(w)
    assert "GraceTime" in faults[0].message and "SIGTERM" in faults[0].message
    booked = report(w)
    (hit,) = booked.interruptions
    assert hit.lost_steps == 100 and hit.cause.category == "Preempted" and not hit.cause.table5
    assert "Preempted" in booked.by_cause and "Job failure (cause not seen)" not in booked.by_cause


def test_a_preempted_job_that_exits_with_the_continue_code_is_continued_as_preempted(tmp_path):
    w = world(tmp_path, SPEC)
    train(w, 1, 50)
    w.ckpt.save(50)
    w.cluster.preempt(w.run().attempt.job_id, exit_code=75)  # saved within GraceTime, then exited 75
    w.until(lambda: w.running(seq=1))
    assert w.run().restarts_spent == 0 and "preempted" in w.events(EventKind.CONTINUED)[0].message


# -- PreemptMode=REQUEUE: a requeueable job (restart mode "requeue") comes back under its own id ------

REQUEUE = replace(SPEC, restart_mode=RestartMode.REQUEUE)


def requeued_by_preemption(w, save: int | None) -> int:
    """Slurm begins preempting the running job (PreemptTime, GraceTime), the daemon sees it, the
    trainer saves ``save`` (None: it does not), and Slurm requeues the job."""
    job_id = w.run().attempt.job_id
    w.cluster.begin_preemption(job_id)
    w.until(lambda: w.run().attempt.preempted_at is not None)
    if save is not None:
        w.ckpt.save(save)
    w.cluster.preempt(job_id, requeue=True)
    w.until(lambda: w.running(seq=1))
    return job_id


def test_a_run_requeued_after_its_grace_save_spends_no_restart_and_books_preempted(tmp_path):
    w = world(tmp_path, REQUEUE)
    train(w, 1, 200)
    job_id = requeued_by_preemption(w, save=200)
    assert w.run().attempt.job_id == job_id and w.run().attempt.restart_count == 1  # Slurm's own requeue
    assert w.run().restarts_spent == 0  # before: every requeue spent one
    assert w.run().attempt.preempted_at is None  # the preemption was its predecessor's
    assert "fault" not in kinds(w) and "requeued" not in kinds(w) and kinds(w).count("continued") == 1, kinds(w)
    (line,) = w.events(EventKind.CONTINUED)
    assert "preempted" in line.message and "step 200" in line.message
    booked = report(w)
    assert booked.interruptions == () and booked.lost.rework_s == 0.0
    assert "preempted" in booked.by_cause and "continuation" not in booked.by_cause


def test_a_run_requeued_after_a_preemption_without_a_save_spends_one_restart_under_preempted(tmp_path):
    w = world(tmp_path, REQUEUE)
    train(w, 1, 300)
    w.ckpt.save(200)  # no save on the grace signal: 100 steps since the newest checkpoint
    requeued_by_preemption(w, save=None)
    assert w.run().restarts_spent == 1 and "continued" not in kinds(w)
    (requeued,) = w.events(EventKind.REQUEUED)
    assert "GraceTime" in requeued.message and "SIGTERM" in requeued.message
    (hit,) = report(w).interruptions
    assert hit.lost_steps == 100 and hit.cause.category == "Preempted"


def test_a_preempted_job_requeued_again_before_it_was_seen_running_spends_no_restart(tmp_path):
    """Slurm 24.11 requeues a job it preempts twice (restart 0 -> 1 -> 2, the real-Slurm test's
    logbook): the requeued incarnation ends again before the daemon sees it run. Still the one
    preemption continued from the grace save: no restart spent, no 'requeued' line."""
    w = world(tmp_path, REQUEUE)
    train(w, 1, 200)
    job_id = w.run().attempt.job_id
    w.cluster.begin_preemption(job_id)
    w.until(lambda: w.run().attempt.preempted_at is not None)
    w.ckpt.save(200)
    w.cluster.preempt(job_id, requeue=True)
    w.until(lambda: w.run().attempt.seq == 1)  # continued: attempt 1 is Slurm's restart 1
    w.clock.wait(60.0)  # the sim starts restart 1 between two polls ...
    w.cluster.preempt(job_id, requeue=True)  # ... and Slurm requeues it again: restart 2
    w.until(lambda: w.running(seq=2))
    assert w.run().attempt.restart_count == 2 and w.run().restarts_spent == 0  # before: one spent
    assert "requeued" not in kinds(w) and "fault" not in kinds(w) and kinds(w).count("continued") == 1, kinds(w)
