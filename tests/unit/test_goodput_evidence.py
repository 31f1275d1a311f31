"""Goodput from the evidence on record, on a hand-worked run with a progress series.

attempt 0: submitted and started at 0; starts up 60 s; steps 0..100 at 1 s per step (the log reads
           step 10 at 70, ..., step 100 at 160); the job ends FAILED at 170 by itself; the
           supervisor knows at 175 and resubmits at 175, resuming from step 80.
attempt 1: starts at 175, loads for 65 s (first step read: 90 at 250, so it computed from 240);
           steps to 140 at 300; the record ends at 300.
Kept steps: 0..80 (attempt 0) and 80..140 (attempt 1) = 140 s of the 300 s wall: ETTR 46.7 %.
"""

import pytest

from supervisor.adapters.sqlite import SqliteStore
from supervisor.domain.goodput.account import goodput
from supervisor.domain.goodput.steps import OVERHEAD
from supervisor.domain.progress.series import ProgressPoint, decimate
from supervisor.domain.records import AttemptRecord, Event, EventKind
from supervisor.report.goodput import cause_rows, summary_rows

RUN = "r"


def ev(kind, at, attempt, message="", **evidence):
    return Event(RUN, kind, message or kind.value, f"{kind.value}:{at}", at, attempt, 7, evidence=evidence)


def run():
    attempts = [
        AttemptRecord(RUN, 0, 7, 0, 0.0, ("n1",), (), 0.0, 170.0, "FAILED"),
        AttemptRecord(RUN, 1, 8, 0, 175.0, ("n1",), (), 175.0),
    ]
    events = [
        ev(EventKind.SUBMITTED, 0.0, 0, resume_step=None, resume={"checkpoint": None}),
        ev(EventKind.FAULT, 175.0, 0, "job 7 ended FAILED with exit code 1"),
        ev(EventKind.RESTARTED, 175.0, 1, resume_step=80, last_step=None),
    ]
    series = [ProgressPoint(RUN, 0, s, 60.0 + s, 2.0, 1.0) for s in range(10, 101, 10)]
    series += [ProgressPoint(RUN, 1, s, 160.0 + s, 2.0, 1.0) for s in range(90, 141, 10)]
    return attempts, events, series


def test_productive_time_is_the_kept_steps_and_restart_includes_start_up():
    attempts, events, series = run()
    g = goodput(RUN, attempts, events, now=300.0, series=series)
    assert g.ettr == pytest.approx(140 / 300)
    (i,) = g.interruptions
    assert i.restart_s == pytest.approx(65.0)  # resubmitted at once; 65 s from start to computing
    assert i.lost_steps == 20 and i.lost_work_s == pytest.approx(20.0)
    assert i.detection_s == pytest.approx(5.0)  # Slurm ended the job at 170, the supervisor knew at 175
    assert g.lost.total_s + g.productive_s + g.idle_s == pytest.approx(g.wall_s)
    assert not g.upper_bound and "upper bound" not in dict(summary_rows(g, g.advice(None)))["ETTR (productive / wall)"]


def test_without_the_series_the_old_account_stands_and_with_steps_missing_it_says_upper_bound():
    attempts, events, series = run()
    assert goodput(RUN, attempts, events, now=300.0).measured is None
    unknown = [e for e in events if e.kind is not EventKind.RESTARTED]
    g = goodput(RUN, attempts, unknown, now=300.0, series=series)
    assert g.measured is False and g.upper_bound
    assert any("not measured" in n for n in g.notes)


def test_every_interruption_has_a_cause_row_even_one_that_cost_nothing():
    attempts, events, series = run()
    g = goodput(RUN, attempts, events, now=300.0, series=series)
    rows = {cause: n for cause, n, _, _ in cause_rows(g)}
    assert rows["Job failure (cause not seen)"] == "1"
    assert OVERHEAD in g.by_cause or g.lost.overhead_s == 0
    import dataclasses

    free = dataclasses.replace(g, by_cause={})
    assert [n for _, n, _, _ in cause_rows(free)] == ["1"]


def test_an_xid_is_a_gpu_fault_in_table_5():
    attempts, events, series = run()
    events[1] = ev(EventKind.FAULT, 175.0, 0, "fault on n013: XID 79: GPU fault (Faulty GPU)", node="n013")
    (i,) = goodput(RUN, attempts, events, now=300.0, series=series).interruptions
    assert (i.cause.category, i.cause.component, i.cause.table5) == ("GPU", "Faulty GPU", True)


def test_decimation_keeps_each_attempts_ends_and_the_loss_extremes_within_the_bound():
    points = [ProgressPoint(RUN, s // 1000, s, float(s), 2.0 + (5.0 if s == 1234 else 0.0)) for s in range(3000)]
    kept = decimate(points, 100)
    assert len(kept) <= 100
    assert {(p.attempt, p.step) for p in kept} >= {(0, 0), (0, 999), (1, 1000), (1, 1999), (2, 2000), (2, 2999)}
    assert any(p.step == 1234 for p in kept)  # the spike


def test_the_store_keeps_the_series_bounded_per_run(tmp_path):
    store = SqliteStore(tmp_path)
    store.progress_limit = 50
    try:
        for chunk in range(10):
            store.record_progress([ProgressPoint(RUN, 0, s, float(s), 1.0) for s in range(chunk * 30, chunk * 30 + 30)])
        store.record_progress([ProgressPoint("other", 0, 1, 1.0, 1.0)])
        kept = store.progress(RUN)
        assert len(kept) <= 100 and kept[0].step == 0 and kept[-1].step == 299
        assert [p.step for p in store.progress("other")] == [1]
    finally:
        store.close()
