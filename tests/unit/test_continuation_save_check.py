"""Issue 31: the save check at a planned end waits. "Unverifiable is not corrupt": when the checkpoint
the trainer saved at the signal cannot be checked (a transient S3 error), the end is neither a
continuation nor a fault yet — the decision is held and the save checked again each tick; only when
storage stays unreachable past a bound is it a fault, whose line says so.

The engine on the simulated cluster and virtual time (tests/unit/test_continuation.py's world)."""

from __future__ import annotations

from unit.test_continuation import ends_at_its_limit, kinds, train, world

from supervisor.domain.decide.continuation import SAVE_CHECK_WAIT_S
from supervisor.domain.goodput.account import goodput
from supervisor.domain.records import EventKind


def test_an_unverifiable_save_at_the_limit_waits_then_continues(tmp_path):
    w = world(tmp_path)
    train(w, 1, 200)
    w.ckpt.save(100)
    saved = w.ckpt.save(200)  # the save at the signal ...
    saved.storage_down = True  # ... cannot be read back: 503 SlowDown
    ends_at_its_limit(w)
    w.ticks(30, interval=5.0)  # two and a half minutes of storage trouble
    assert "fault" not in kinds(w)  # today: the planned end is a fault at once (100 steps "lost")
    assert w.run().restarts_spent == 0 and w.run().attempt.seq == 0
    saved.storage_down = False
    w.until(lambda: w.running(seq=1))
    assert w.run().restarts_spent == 0 and "fault" not in kinds(w)
    assert kinds(w).count("continued") == 1
    assert w.submitted_env()["SSV_RESUME_STEP"] == "200"  # not the older 100
    report = goodput("llm", w.store.attempts("llm"), w.store.events("llm"), now=w.clock.now())
    assert report.interruptions == ()


def test_a_save_unverifiable_past_the_bound_is_one_fault_that_says_so(tmp_path):
    w = world(tmp_path)
    train(w, 1, 200)
    w.ckpt.save(100)
    w.ckpt.save(200).storage_down = True  # storage stays down
    ends_at_its_limit(w)
    w.until(lambda: w.running(seq=1), limit=400, interval=5.0)
    assert w.run().restarts_spent == 1
    faults = w.events(EventKind.FAULT)
    assert len(faults) == 1 and "continued" not in kinds(w)
    assert "could not be verified" in faults[0].message and f"{SAVE_CHECK_WAIT_S:.0f} s" in faults[0].message
    ended = w.store.attempts("llm")[0].ended_at
    assert faults[0].at >= ended + SAVE_CHECK_WAIT_S  # waited the bound, not a tick
    waits = [e for e in w.events(EventKind.WARNING) if "unverifiable" in e.message]
    assert len(waits) == 1  # one line that the decision waits, not one per tick


def test_an_unlistable_root_at_the_limit_waits_too(tmp_path):
    w = world(tmp_path)
    train(w, 1, 200)
    w.ckpt.save(200)
    w.ckpt.listing_down = True  # the save was made, but the root cannot be listed
    ends_at_its_limit(w)
    w.ticks(20, interval=5.0)
    assert "fault" not in kinds(w)
    w.ckpt.listing_down = False
    w.until(lambda: w.running(seq=1))
    assert w.run().restarts_spent == 0 and kinds(w).count("continued") == 1
