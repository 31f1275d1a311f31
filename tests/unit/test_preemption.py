"""Issue 31, item 3: preemption. A job Slurm preempts (PREEMPTED: a higher-priority job took its
nodes) after the trainer saved on the grace signal (GraceTime's SIGTERM) is continued: no restart
spent, no fault, goodput books the gap as 'preempted', not as a failure. One preempted without such
a save is one fault whose lost work is booked and whose line says how to make the next one a
continuation; its cause in goodput is 'Preempted' too, not a failure's.

The engine on the simulated cluster and virtual time (as tests/unit/test_continuation.py)."""

from __future__ import annotations

from test_continuation import SPEC, kinds, train, world

from supervisor.domain.goodput.account import goodput
from supervisor.domain.records import EventKind


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
