"""Goodput (ETTR) on scripted runs whose figures were worked out by hand (see each test's comments)."""

import math

import pytest

from supervisor.domain.goodput.account import checkpoint_advice, goodput, measured_save_s, windows
from supervisor.domain.goodput.causes import classify
from supervisor.domain.records import AttemptRecord, Event, EventKind

T0 = 1795910400.0  # 2026-11-29 00:00:00 UTC
RUN = "llama-70b"


def _ev(kind: EventKind, at: float, attempt: int | None, message: str = "", **evidence) -> Event:
    return Event(
        RUN,
        kind,
        message or kind.value,
        f"{kind.value}:{at}:{attempt}",
        T0 + at,
        attempt,
        500 + (attempt or 0),
        evidence=evidence,
    )


def scenario() -> tuple[list[AttemptRecord], list[Event]]:
    """Three attempts over 30,000 s.

    attempt 0: submitted 0, running 600..10060; hangs: last step 900 at 9600, detected at 10000
               (silent 400 s, step interval 10 s); stopped at 10060.
    attempt 1: submitted 10100 resuming from step 800 (100 steps x 10 s = 1000 s of work lost);
               running 10400..20430; XID 79 on gpu-2 detected at 20400 (no resume step on record).
    attempt 2: submitted 20460, running 21060..30000, completed at 30000.
    """
    attempts = [
        AttemptRecord(RUN, 0, 500, 0, T0, ("gpu-1", "gpu-2"), (), T0 + 600, T0 + 10060, "CANCELLED"),
        AttemptRecord(RUN, 1, 501, 0, T0 + 10100, ("gpu-1", "gpu-2"), (), T0 + 10400, T0 + 20430, "NODE_FAIL"),
        AttemptRecord(RUN, 2, 502, 0, T0 + 20460, ("gpu-1", "gpu-3"), (), T0 + 21060, T0 + 30000, "COMPLETED"),
    ]
    events = [
        _ev(EventKind.SUBMITTED, 0, 0),
        _ev(EventKind.STARTED, 600, 0),
        _ev(
            EventKind.FAULT,
            10000,
            0,
            "attempt 0 (job 500, restart 0): hang: no training step for 400 s",
            last_step=900,
            silent_s=400.0,
            step_interval_s=10.0,
            step_time_s=10.0,
            nodes=["gpu-1", "gpu-2"],
        ),
        _ev(EventKind.STOPPED, 10060, 0),
        _ev(EventKind.RESTARTED, 10100, 1, resume_step=800, exclude=[]),
        _ev(EventKind.STARTED, 10400, 1),
        _ev(
            EventKind.FAULT,
            20400,
            1,
            "attempt 1 (job 501, restart 0): fault on gpu-2: XID 79",
            node="gpu-2",
            observed="XID 79: GPU has fallen off the bus",
        ),
        _ev(EventKind.NODE_DRAINED, 20400, 1, node="gpu-2"),
        _ev(EventKind.RESTARTED, 20460, 2, exclude=["gpu-2"]),
        _ev(EventKind.STARTED, 21060, 2),
        _ev(EventKind.NOTE, 25000, 2, "checkpoint at step 2000 saved", save_s=120.0),
        _ev(EventKind.COMPLETED, 30000, 2),
    ]
    return attempts, events


def test_ettr_of_the_scripted_run_equals_the_hand_computed_value():
    attempts, events = scenario()
    g = goodput(RUN, attempts, events, now=T0 + 99999)
    # wall 30000; lost: first queue 600; hang: detection 400 + rework 1000 + restart 100 + queue 300;
    # XID: restart 60 + queue 600 -> 3060 lost; productive 26940.
    assert g.wall_s == 30000
    assert g.lost.queue_s == 600 + 300 + 600
    assert g.lost.restart_s == 100 + 60
    assert g.lost.detection_s == 400
    assert g.lost.rework_s == 1000
    assert g.productive_s == pytest.approx(26940)
    assert g.ettr == pytest.approx(26940 / 30000)  # 0.898
    assert g.running_s == pytest.approx(9460 + 10030 + 8940)
    assert g.idle_s == 0
    assert g.productive_s + g.lost.total_s + g.idle_s == pytest.approx(g.wall_s)


def test_interruptions_their_causes_and_costs():
    attempts, events = scenario()
    g = goodput(RUN, attempts, events, now=T0 + 99999)
    hang, xid = g.interruptions
    assert (hang.detection_s, hang.lost_steps, hang.lost_work_s, hang.resume_step) == (400, 100, 1000, 800)
    assert (hang.restart_s, hang.queue_s, hang.recovery_s) == (100, 300, 400)
    assert hang.cause.category == "Hang (no progress)" and not hang.cause.table5
    assert (xid.cause.category, xid.cause.component, xid.cause.table5) == ("GPU", "Faulty GPU", True)
    assert xid.lost_work_s is None and xid.detection_s is None
    assert g.by_cause["GPU"].total_s == 660
    assert g.by_cause["Hang (no progress)"].total_s == 1800
    assert g.by_cause["First start"].queue_s == 600
    assert g.unknown_lost_work == 1
    assert any("upper bound" in n for n in g.notes)
    assert g.interruptions_per_day == pytest.approx(2 / (30000 / 86400))
    assert g.mtbi_s == pytest.approx(28430 / 2)


def test_young_daly_interval_from_the_observed_rate_and_measured_save_cost():
    attempts, events = scenario()
    g = goodput(RUN, attempts, events, now=T0 + 99999)
    save = measured_save_s(events)
    assert save == 120.0
    advice = g.advice(save)
    assert advice.interval_s == pytest.approx(math.sqrt(2 * 120 * 14215))  # 1847 s
    assert advice.expected_waste == pytest.approx(120 / advice.interval_s + advice.interval_s / (2 * 14215))
    assert checkpoint_advice(None, 120).interval_s is None
    unknown = checkpoint_advice(14215, None)
    assert unknown.interval_s is None and "save_s" in unknown.reason


def test_a_window_counts_only_its_own_seconds():
    attempts, events = scenario()
    g = goodput(RUN, attempts, events, now=T0 + 99999, start=T0, end=T0 + 15000)
    # running 9460 + 4600; lost 600 + 400 + 1000 + 100 + 300 = 2400 -> productive 12600
    assert g.productive_s == pytest.approx(12600)
    assert g.ettr == pytest.approx(0.84)
    assert len(g.interruptions) == 1
    days = windows(RUN, attempts, events, now=T0 + 99999, width_s=10000)
    assert [round(d.wall_s) for d in days] == [10000, 10000, 10000]
    assert sum(d.productive_s for d in days) == pytest.approx(26940)
    with pytest.raises(ValueError, match="positive"):
        windows(RUN, attempts, events, now=T0, width_s=0)


def test_a_running_run_is_counted_up_to_now_and_an_open_recovery_is_lost_time():
    attempts, events = scenario()
    attempts = attempts[:2]
    attempts[1] = AttemptRecord(RUN, 1, 501, 0, T0 + 10100, (), (), T0 + 10400, T0 + 20430, "NODE_FAIL")
    events = [e for e in events if e.at <= T0 + 20400]
    g = goodput(RUN, attempts, events, now=T0 + 21000)
    assert g.end == T0 + 21000
    assert g.lost.restart_s == 100 + 600  # the XID recovery is still under way at "now"
    assert g.interruptions[-1].restart_s is None and g.interruptions[-1].recovery_s is None


@pytest.mark.parametrize(
    ("message", "evidence", "category", "component"),
    [
        ("fault on gpu-117: slurmd probe failed 3 times", {"node": "gpu-117"}, "Node lost (cause not seen)", None),
        ("fault on n1: XID 48 double-bit ECC error", {"node": "n1"}, "GPU", "GPU HBM3 Memory"),
        ("fault on n1: mlx5_0 port down", {"node": "n1"}, "Host", "NIC"),
        ("fault on n1: InfiniBand switch link flapping", {"node": "n1"}, "Network", "Network Switch/Cable"),
        ("hang: NCCL watchdog timeout", {"last_step": 5}, "Unknown", "NCCL Watchdog Timeouts"),
        (
            "job 7 ended FAILED with exit code 1",
            {"state": "FAILED", "exit_code": 1},
            "Job failure (cause not seen)",
            None,
        ),
    ],
)
def test_causes_map_onto_llama3_table5_where_they_can(message, evidence, category, component):
    cause = classify([Event(RUN, EventKind.FAULT, message, "k", T0, 0, 1, evidence=evidence)])
    assert (cause.category, cause.component) == (category, component)
    assert cause.table5 == (component is not None)


def test_a_trainer_that_saves_on_failure_plans_its_saves_for_the_interruptions_that_lose_work():
    """Young's M is the time between interruptions that throw work away; an interruption whose
    restart resumed at the step it had reached (the survivors' save on failure) lost none."""
    from dataclasses import replace

    attempts, events = scenario()
    g = goodput(RUN, attempts, events, now=T0 + 99999)
    lost = [i for i in g.interruptions if i.lost_steps is None or i.lost_steps > 0]
    assert len(lost) == 2 and g.advice(120.0, saves_on_failure=True) == g.advice(120.0)
    saved = replace(g, interruptions=(replace(g.interruptions[0], lost_steps=0, lost_work_s=0.0), *g.interruptions[1:]))
    advice = saved.advice(120.0, saves_on_failure=True)
    assert advice.mtbi_s == pytest.approx(g.running_s) and advice.interval_s == pytest.approx(
        math.sqrt(2 * 120 * 28430)
    )
    none_lost = replace(g, interruptions=tuple(replace(i, lost_steps=0) for i in g.interruptions))
    nothing = none_lost.advice(120.0, saves_on_failure=True)
    assert nothing.interval_s is None and "lost no work" in nothing.reason
