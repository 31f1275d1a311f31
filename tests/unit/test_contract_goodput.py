"""Goodput's contract on small hand-worked runs: which seconds are productive, which are lost and to
what, the interruption's figures, the checkpoint advice and the measured save time."""

import dataclasses
import math

import pytest

from supervisor.domain.goodput.account import (
    CheckpointAdvice,
    Interruption,
    checkpoint_advice,
    goodput,
    interruptions,
    measured_save_s,
    windows,
)
from supervisor.domain.goodput.sweep import Lost
from supervisor.domain.records import AttemptRecord, Event, EventKind

RUN = "r"


def ev(kind, at, attempt, **evidence):
    return Event(RUN, kind, kind.value, f"{kind.value}:{at}", at, attempt, 7, evidence=evidence)


def attempt(seq, submitted, started=None, ended=None, **kw):
    return AttemptRecord(RUN, seq, 7 + seq, 0, submitted, ("n1",), (), started, ended, **kw)


def one_fault(**fault_evidence):
    """attempt 0: submitted 0, running 100..1000; a fault known at 900; attempt 1 submitted 960,
    running 1060.. (now 2000)."""
    attempts = [attempt(0, 0.0, 100.0, 1000.0), attempt(1, 960.0, 1060.0)]
    events = [ev(EventKind.FAULT, 900.0, 0, **fault_evidence), ev(EventKind.RESTARTED, 960.0, 1)]
    return attempts, events


def test_seconds_are_split_into_productive_and_each_kind_of_loss():
    attempts, events = one_fault(detection_s=50.0, lost_steps=10, step_time_s=20.0)
    g = goodput(RUN, attempts, events, now=2000.0)
    # rework 650..850 (200 s of running work before the onset at 850), detection 850..900,
    # restart 900..960, queue 0..100 (first start) + 960..1060
    assert g.lost == Lost(rework_s=200.0, detection_s=50.0, restart_s=60.0, queue_s=200.0)
    assert (g.start, g.end, g.wall_s) == (0.0, 2000.0, 2000.0)
    assert g.running_s == 900.0 + 940.0
    assert g.productive_s == 2000.0 - 510.0
    assert g.idle_s == 0.0
    assert g.ettr == pytest.approx(1490.0 / 2000.0)
    assert g.mtbi_s == 1840.0
    assert g.interruptions_per_day == pytest.approx(1 / (2000.0 / 86400.0))
    assert g.unknown_lost_work == 0 and g.notes == ()


def test_the_interruption_carries_its_figures():
    attempts, events = one_fault(detection_s=50.0, resume_step=80, last_step=95, step_time_s=2.0)
    (i,) = interruptions(attempts, events)
    assert (i.run, i.attempt, i.at) == (RUN, 0, 900.0)
    assert (i.detection_s, i.restart_s, i.queue_s) == (50.0, 60.0, 100.0)
    assert (i.lost_steps, i.resume_step, i.lost_work_s) == (15, 80, 30.0)
    assert i.recovery_s == 160.0 and i.onset == 850.0
    stale = interruptions(attempts, [ev(EventKind.FAULT, 900.0, 0, resume_step=99, last_step=95, step_time_s=2.0)])
    assert stale[0].lost_steps == 0 and stale[0].lost_work_s == 0.0


def test_explicit_lost_work_wins_and_a_hangs_silence_is_its_detection():
    attempts, _ = one_fault()
    (i,) = interruptions(attempts, [ev(EventKind.FAULT, 900.0, 0, lost_work_s=33.0, lost_steps=10, step_time_s=20.0)])
    assert i.lost_work_s == 33.0
    (h,) = interruptions(attempts, [ev(EventKind.FAULT, 900.0, 0, silent_s=400.0)])
    assert h.detection_s == 400.0 and h.onset == 500.0
    (both,) = interruptions(attempts, [ev(EventKind.FAULT, 900.0, 0, silent_s=400.0, detection_s=5.0)])
    assert both.detection_s == 5.0


def test_figures_that_are_not_numbers_or_negative_are_not_on_record():
    attempts, _ = one_fault()
    odd = dict(detection_s=-1.0, lost_steps=True, step_time_s=float("nan"), resume_step="80", last_step=90)
    (i,) = interruptions(attempts, [ev(EventKind.FAULT, 900.0, 0, **odd)])
    assert (i.detection_s, i.lost_steps, i.resume_step, i.lost_work_s) == (None, None, None, None)
    (j,) = interruptions(attempts, [ev(EventKind.FAULT, 900.0, 0, lost_steps=4, step_time_s=0.0)])
    assert j.lost_work_s == 0.0


def test_without_a_next_attempt_recovery_is_open_and_counted_to_now():
    attempts = [attempt(0, 0.0, 100.0, 1000.0)]
    events = [ev(EventKind.FAULT, 900.0, 0)]
    (i,) = interruptions(attempts, events)
    assert (i.restart_s, i.queue_s, i.recovery_s) == (None, None, None)
    g = goodput(RUN, attempts, events, now=1500.0)
    assert g.lost.restart_s == 600.0 and g.productive_s == 800.0 and g.idle_s == 0.0
    assert g.unknown_lost_work == 1 and len(g.notes) == 2
    assert g.notes[0].startswith("work lost since the checkpoint is not on record for 1 of 1 interruption(s)")
    assert g.notes[1].startswith("detection time is not on record for 1 of 1 interruption(s)")


def test_a_next_attempt_not_started_yet_has_no_queue_time_and_queues_to_now():
    attempts = [attempt(0, 0.0, 100.0, 1000.0), attempt(1, 960.0)]
    events = [ev(EventKind.FAULT, 900.0, 0)]
    (i,) = interruptions(attempts, events)
    assert (i.restart_s, i.queue_s, i.recovery_s) == (60.0, None, None)
    g = goodput(RUN, attempts, events, now=1500.0)
    assert g.lost.queue_s == 100.0 + 540.0


def test_only_opening_events_make_interruptions_and_they_come_oldest_first():
    attempts = [attempt(0, 0.0, 10.0, 50.0), attempt(1, 60.0, 70.0, 90.0), attempt(2, 95.0, 99.0)]
    events = [
        ev(EventKind.NOTE, 20.0, 0),
        ev(EventKind.FAULT, 85.0, 1),
        ev(EventKind.FAULT, 80.0, 1),
        ev(EventKind.REQUEUED, 45.0, 0),
    ]
    found = interruptions(attempts, events)
    assert [(i.attempt, i.at) for i in found] == [(0, 45.0), (1, 80.0)]
    assert found[1].restart_s == 15.0  # from the first opening event to the next submission


def test_a_finished_run_ends_at_its_terminal_event_and_windows_cover_it():
    attempts = [attempt(0, 0.0, 100.0, 1000.0)]
    events = [ev(EventKind.COMPLETED, 1000.0, 0)]
    g = goodput(RUN, attempts, events, now=5000.0)
    assert (g.start, g.end, g.productive_s, g.lost.queue_s) == (0.0, 1000.0, 900.0, 100.0)
    assert goodput(RUN, attempts, events, now=700.0).end == 700.0
    parts = windows(RUN, attempts, events, now=5000.0, width_s=400.0)
    assert [(w.start, w.end) for w in parts] == [(0.0, 400.0), (400.0, 800.0), (800.0, 1000.0)]
    assert sum(w.productive_s for w in parts) == 900.0
    for width in (0.0, -400.0):
        with pytest.raises(ValueError, match="positive"):
            windows(RUN, attempts, events, now=5000.0, width_s=width)


def test_an_empty_window_has_no_ettr_and_other_runs_do_not_count():
    g = goodput(RUN, [], [], now=100.0)
    assert (g.wall_s, g.ettr, g.interruptions_per_day, g.mtbi_s) == (0.0, None, None, None)
    for name in ("other", "s-later-name", "a"):
        other = AttemptRecord(name, 0, 9, 0, 0.0, ("n1",), (), 10.0, 90.0)
        assert goodput(RUN, [other], [], now=100.0).running_s == 0.0


def test_checkpoint_advice_is_youngs_interval():
    a = checkpoint_advice(20000.0, 100.0)
    assert a.interval_s == pytest.approx(math.sqrt(2 * 100.0 * 20000.0)) and a.interval_s == 2000.0
    assert a.reason == "Young: sqrt(2 x 100 s x 20000 s)"
    assert a.expected_waste == pytest.approx(100.0 / 2000.0 + 2000.0 / 40000.0)
    assert checkpoint_advice(None, 100.0) == CheckpointAdvice(
        None, 100.0, None, "no interruption observed yet: no rate to plan for"
    )
    assert checkpoint_advice(20000.0, 0.0).interval_s is None and checkpoint_advice(20000.0, None).mtbi_s == 20000.0
    assert CheckpointAdvice(None, 1.0, 1.0, "").expected_waste is None
    assert CheckpointAdvice(1.0, 1.0, None, "").expected_waste is None
    assert CheckpointAdvice(1.0, None, 1.0, "").expected_waste is None


def test_measured_save_time_is_the_median_of_the_evidence_else_of_the_attempts():
    saves = [ev(EventKind.NOTE, float(i), 0, save_s=s) for i, s in enumerate((30.0, 10.0, 20.0))]
    assert measured_save_s(saves) == 20.0
    assert measured_save_s([*saves, ev(EventKind.NOTE, 9.0, 0, write_s=40.0)]) == 25.0
    assert measured_save_s([ev(EventKind.NOTE, 1.0, 0, save_s=True), ev(EventKind.NOTE, 2.0, 0, save_s="9")]) is None
    attempts = [attempt(0, 0.0, save_s=8.0), attempt(1, 0.0), attempt(2, 0.0, save_s=4.0)]
    assert measured_save_s([], attempts) == 6.0
    assert measured_save_s(saves, attempts) == 20.0
    assert measured_save_s([]) is None


def test_interruption_defaults():
    i = Interruption(RUN, 0, 10.0, interruptions(*one_fault())[0].cause, None, None, 5.0, None)
    assert (i.lost_steps, i.resume_step, i.recovery_s, i.onset) == (None, None, None, 10.0)


def test_the_figures_are_immutable_values():
    g = goodput(RUN, *one_fault(), now=2000.0)
    for value in (g, g.interruptions[0], g.advice(10.0)):
        with pytest.raises(dataclasses.FrozenInstanceError):
            value.run = "other"  # type: ignore[misc]


def test_interruptions_at_one_time_order_a_runs_own_event_first_and_a_restart_never_goes_negative():
    attempts = [attempt(0, 0.0, 10.0, 50.0), attempt(1, 40.0, 60.0)]  # resubmitted before the fault was booked
    events = [ev(EventKind.FAULT, 45.0, 0), ev(EventKind.FAULT, 45.0, None)]
    found = interruptions(attempts, events)
    assert [i.attempt for i in found] == [None, 0]
    assert found[1].restart_s == 0.0


def test_windows_may_be_shorter_than_a_second():
    attempts = [attempt(0, 0.0, 0.0, 1.0)]
    parts = windows(RUN, attempts, [ev(EventKind.COMPLETED, 1.0, 0)], now=5.0, width_s=0.5)
    assert [(w.start, w.end) for w in parts] == [(0.0, 0.5), (0.5, 1.0)]


def test_a_run_name_is_matched_by_value():
    name = "-".join(["llama", "70b"])  # built at run time: equal to the literal, not the same object
    attempts = [AttemptRecord("llama-70b", 0, 9, 0, 0.0, ("n1",), (), 10.0, 90.0)]
    assert goodput(name, attempts, [], now=100.0).running_s == 80.0


def test_interruptions_in_a_window_are_those_that_began_in_it():
    attempts = [attempt(0, 0.0, 10.0, 400.0), attempt(1, 450.0, 500.0)]
    events = [ev(EventKind.FAULT, 400.0, 0), ev(EventKind.COMPLETED, 1000.0, 1)]
    assert len(goodput(RUN, attempts, events, now=1000.0, start=400.0, end=600.0).interruptions) == 1
    assert len(goodput(RUN, attempts, events, now=1000.0, start=0.0, end=400.0).interruptions) == 0
    assert len(goodput(RUN, attempts, events, now=1000.0, start=401.0, end=600.0).interruptions) == 0


def test_an_incident_gathers_the_attempts_events_from_its_opening_on():
    attempts = [attempt(0, 0.0, 100.0, 1000.0), attempt(1, 960.0, 1060.0)]
    events = [ev(EventKind.FAULT, 900.0, 0), ev(EventKind.NOTE, 950.0, 0, lost_steps=5, step_time_s=2.0)]
    (i,) = interruptions(attempts, events)
    assert (i.lost_steps, i.lost_work_s) == (5, 10.0)
