"""Goodput of in-allocation swaps (issue 16 item 3): a swap is an interruption like a restart —
detection, restart (from the fault to the step's first training step after the resume, no queue)
and lost work — and the hot spares' cost (idle node-hours) is set against what the swaps saved.
Figures worked out by hand in each scenario's docstring."""

from __future__ import annotations

import pytest

from supervisor.domain.goodput.account import goodput
from supervisor.domain.progress.series import ProgressPoint
from supervisor.domain.records import AttemptRecord, Event, EventKind
from supervisor.report.goodput import summary_rows

T0 = 1795910400.0
RUN = "llm"
NODES = ("n1", "n2", "n3")  # 2 run nodes + 1 hot spare


def _ev(kind: EventKind, at: float, attempt: int, key: str = "", **evidence: object) -> Event:
    return Event(
        RUN, kind, kind.value, key or f"{kind.value}:{at}:{attempt}", T0 + at, attempt, 500 + attempt, evidence=evidence
    )


def _swap_events() -> list[Event]:
    return [
        _ev(EventKind.SUBMITTED, 0, 0, resume_step=None),
        _ev(EventKind.STARTED, 100, 0),
        _ev(EventKind.FAULT, 5200, 0, node="n2", observed="slurmd probe failed", detection_s=2.0),
        _ev(EventKind.NODE_DRAINED, 5200, 0, node="n2"),
        _ev(
            EventKind.NOTE,
            5200,
            0,
            "swap",
            in_allocation="swap",
            generation=1,
            out=["n2"],
            into=["n3"],
            nodes=["n1", "n3"],
            resume_step=400,
        ),  # fmt: skip
        _ev(
            EventKind.NOTE,
            5201,
            0,
            "resumed",
            in_allocation="resumed",
            generation=1,
            nodes=["n1", "n3"],
            resume_step=400,
            swap_s=1.0,
        ),  # fmt: skip
    ]


def _series() -> list[ProgressPoint]:
    """10 s per step: steps 10..500 read at 200..5100 (computing from 100); after the swap the
    step resumes at 400 and step 410 is read at 5400 (so computing again from 5300)."""
    before = [ProgressPoint(RUN, 0, s, T0 + 100 + 10 * s, step_time_s=10.0) for s in range(10, 501, 10)]
    after = [ProgressPoint(RUN, 0, s, T0 + 5300 + 10 * (s - 400), step_time_s=10.0) for s in range(410, 871, 10)]
    return before + after


def test_a_swap_is_booked_as_an_interruption_with_its_restart_ending_at_the_first_step_after_the_resume() -> None:
    """One swap at 5200 (detected 2 s after the onset): the step resumed from 400 having reached
    500 (100 steps x 10 s = 1000 s lost), computing again at 5300: restart 100 s, no queue."""
    attempts = [AttemptRecord(RUN, 0, 500, 0, T0, NODES, (), T0 + 100)]
    g = goodput(RUN, attempts, _swap_events(), now=T0 + 10000, series=_series(), run_nodes=2)
    (swap,) = g.interruptions
    assert swap.in_allocation and swap.attempt == 0 and swap.at == T0 + 5200
    assert (swap.detection_s, swap.restart_s, swap.queue_s) == (2.0, 100.0, 0.0)
    assert (swap.resume_step, swap.lost_steps, swap.lost_work_s) == (400, 100, 1000.0)
    assert g.lost.restart_s == pytest.approx(100.0)  # not the rest of the run: the job never left
    assert g.lost.rework_s == pytest.approx(1000.0) and g.lost.detection_s == pytest.approx(2.0)
    spares = g.spares
    assert spares is not None and spares.idle_spare_node_s == pytest.approx(5100.0)  # 1 spare, 100 -> 5200
    assert spares.swaps == 1 and spares.resubmissions == 0 and spares.saved_s is None


def test_without_a_series_the_restart_ends_when_the_step_runs_again_and_swaps_are_set_against_resubmissions() -> None:
    """No progress series. Swap at 5200, step running again at 5201 (restart 1 s). At 8000 the
    allocation cannot go on (fallback): resubmitted at 8060, running at 8360 (restart 60 s + queue
    300 s = 360 s). Spares: attempt 0 holds 1 idle spare 100 -> 5200 (5100 s), attempt 1 one from
    8360 to 10000 (1640 s): 6740 node-s. One swap saved 360 - 1 = 359 s against a resubmission."""
    attempts = [
        AttemptRecord(RUN, 0, 500, 0, T0, NODES, (), T0 + 100, T0 + 8060, "CANCELLED"),
        AttemptRecord(RUN, 1, 501, 0, T0 + 8060, ("n1", "n3", "n4"), (), T0 + 8360),
    ]
    events = [
        *_swap_events(),
        _ev(EventKind.FAULT, 8000, 0, "fallback", in_allocation="fallback", reason="no hot spare left"),
        _ev(EventKind.RESTARTED, 8060, 1, exclude=["n3"]),
        _ev(EventKind.STARTED, 8360, 1),
    ]
    g = goodput(RUN, attempts, events, now=T0 + 10000, run_nodes=2)
    swap, resubmit = g.interruptions
    assert swap.in_allocation and (swap.restart_s, swap.queue_s) == (1.0, 0.0)
    assert not resubmit.in_allocation and resubmit.at == T0 + 8000 and resubmit.recovery_s == 360.0
    spares = g.spares
    assert spares is not None and spares.idle_spare_node_s == pytest.approx(6740.0)
    assert (spares.swaps, spares.resubmissions) == (1, 1)
    assert spares.swap_recovery_s == 1.0 and spares.resubmit_recovery_s == 360.0
    assert spares.saved_s == pytest.approx(359.0)
    rows = dict(summary_rows(g, g.advice(None)))
    assert rows["hot spares: idle node-hours"] == "1.87"
    assert "saved 359 s" in rows["hot spares: what the swaps saved"]


def test_the_spares_of_a_run_that_never_resubmitted_are_not_given_a_made_up_saving() -> None:
    attempts = [AttemptRecord(RUN, 0, 500, 0, T0, NODES, (), T0 + 100)]
    g = goodput(RUN, attempts, _swap_events(), now=T0 + 10000, run_nodes=2)
    rows = dict(summary_rows(g, g.advice(None)))
    assert "no resubmission" in rows["hot spares: what the swaps saved"]


def test_a_run_without_spares_or_swaps_reports_no_spare_rows() -> None:
    attempts = [AttemptRecord(RUN, 0, 500, 0, T0, ("n1", "n2"), (), T0 + 100)]
    g = goodput(RUN, attempts, [_ev(EventKind.SUBMITTED, 0, 0)], now=T0 + 1000, run_nodes=2)
    assert g.spares is None
    assert not any(label.startswith("hot spares") for label, _ in summary_rows(g, g.advice(None)))


def test_a_relaunch_that_restored_newer_peer_copies_from_memory_loses_only_the_steps_after_them() -> None:
    """The same swap, but the relaunched step restored step 480 from peer copies in memory (its
    note, domain.checkpoints.memory) rather than the checkpoint at 400 it was offered: 20 steps x
    10 s lost, not 100; computing again at 5300 (step 490 read at 5400)."""
    restored = _ev(EventKind.NOTE, 5290, 0, "memory-restored", in_allocation="memory_restored", generation=1,
                   resume_step=480)  # fmt: skip
    before = [p for p in _series() if p.at < T0 + 5200]
    after = [ProgressPoint(RUN, 0, s, T0 + 5300 + 10 * (s - 480), step_time_s=10.0) for s in range(490, 871, 10)]
    attempts = [AttemptRecord(RUN, 0, 500, 0, T0, NODES, (), T0 + 100)]
    g = goodput(RUN, attempts, [*_swap_events(), restored], now=T0 + 10000, series=before + after, run_nodes=2)
    (swap,) = g.interruptions
    assert (swap.resume_step, swap.lost_steps, swap.lost_work_s) == (480, 20, 200.0)
    assert swap.restart_s == 100.0 and g.lost.rework_s == pytest.approx(200.0)
