"""The bad-node memory's contract on plain data (``lemon.quarantined``): when a node is quarantined,
for how long, which faults count, and what an operator's clear forgets."""

import dataclasses

import pytest

from supervisor.domain.health.quarantine import Fault, Quarantine, QuarantineSettings, quarantined

DAY = 86400.0


def faults(*days, node="n1", run="r"):
    return [Fault(node, d * DAY, run, f"fault {i}", key=f"k{i}") for i, d in enumerate(days)]


def test_defaults_are_two_faults_in_seven_days_for_one_day_up_to_thirty():
    s = QuarantineSettings()
    assert (s.faults, s.window_s, s.base_s, s.max_s, s.when_short) == (2, 7 * DAY, DAY, 30 * DAY, "use-least-bad")


def test_when_short_is_validated():
    assert QuarantineSettings(when_short="wait").when_short == "wait"
    with pytest.raises(ValueError, match="when_short"):
        QuarantineSettings(when_short="panic")


def test_one_fault_is_not_a_quarantine():
    assert quarantined(faults(0), {}, now=1.0) == {}


def test_second_fault_quarantines_for_base_s_from_the_last_fault():
    history = faults(0, 1)
    last = 1 * DAY
    q = quarantined(history, {}, now=last)["n1"]
    assert (q.node, q.since, q.until) == ("n1", last, last + DAY)
    assert [f.at for f in q.faults] == [0.0, last]
    assert "n1" in quarantined(history, {}, now=last + DAY - 1)
    assert "n1" not in quarantined(history, {}, now=last + DAY)  # expires exactly at until
    assert quarantined(history, {}, now=last + DAY + 1) == {}


@pytest.mark.parametrize(("count", "days"), [(2, 1), (3, 2), (4, 4), (5, 8), (6, 16), (7, 30), (8, 30)])
def test_each_further_fault_in_the_window_doubles_the_quarantine_up_to_max_s(count, days):
    # faults every 0.5 h so all of them fall inside the window
    history = [Fault("n1", i * 1800.0, "r", "x") for i in range(count)]
    last = (count - 1) * 1800.0
    q = quarantined(history, {}, now=last)["n1"]
    assert q.until - last == days * DAY
    assert len(q.faults) == count


def test_settings_are_honoured():
    s = QuarantineSettings(faults=3, window_s=DAY, base_s=100.0, max_s=250.0)
    assert quarantined(faults(0, 0.1), {}, now=0.1 * DAY, settings=s) == {}
    history = [Fault("n1", t, "r", "x") for t in (0.0, 10.0, 20.0, 30.0, 40.0)]
    assert quarantined(history[:3], {}, now=20.0, settings=s)["n1"].until == 120.0
    assert quarantined(history[:4], {}, now=30.0, settings=s)["n1"].until == 230.0
    assert quarantined(history, {}, now=40.0, settings=s)["n1"].until == 290.0  # 400 capped at 250


def test_window_is_anchored_on_the_newest_fault():
    assert quarantined(faults(0, 10), {}, now=10 * DAY) == {}
    q = quarantined(faults(0, 10, 11), {}, now=11 * DAY)["n1"]
    assert [f.at for f in q.faults] == [10 * DAY, 11 * DAY]
    assert q.until == 12 * DAY  # two faults in the window: base_s, whatever came before it


def test_window_includes_a_fault_exactly_window_s_before_the_newest():
    q = quarantined(faults(0, 7), {}, now=7 * DAY)
    assert q["n1"].until == 8 * DAY
    assert quarantined(faults(0, 7.001), {}, now=7.001 * DAY) == {}


def test_fault_at_now_counts_and_a_later_one_does_not_yet():
    assert "n1" in quarantined(faults(0, 1), {}, now=1 * DAY)
    assert quarantined(faults(0, 1), {}, now=1 * DAY - 1) == {}


def test_faults_are_sorted_by_time_whatever_the_history_order():
    history = list(reversed(faults(0, 1, 2)))
    q = quarantined(history, {}, now=2 * DAY)["n1"]
    assert [f.at for f in q.faults] == [0.0, DAY, 2 * DAY]
    assert q.since == 2 * DAY and q.until == 4 * DAY


def test_a_clear_forgets_faults_at_or_before_it():
    history = faults(0, 1)
    assert quarantined(history, {"n1": 1 * DAY}, now=1 * DAY) == {}
    assert quarantined(history, {"n1": 0.0}, now=1 * DAY) == {}
    assert "n1" in quarantined(history, {"n1": -1.0}, now=1 * DAY)
    assert "n1" in quarantined(history, {"n2": 5 * DAY}, now=1 * DAY)  # another node's clear
    again = [*history, *faults(2, 2.5)]
    q = quarantined(again, {"n1": 1 * DAY}, now=2.5 * DAY)["n1"]
    assert len(q.faults) == 2 and q.until == 3.5 * DAY


def test_nodes_are_judged_apart():
    history = faults(0, 1, node="a") + faults(0, node="b") + faults(1, node="c")
    assert set(quarantined(history, {}, now=DAY)) == {"a"}
    # a node with too few faults listed first does not hide the ones after it
    history = faults(0, node="b") + faults(0, 1, node="a") + faults(1, node="c") + faults(0, 1, node="d")
    assert set(quarantined(history, {}, now=DAY)) == {"a", "d"}


def test_badness_orders_by_fault_count_then_last_fault():
    q2 = Quarantine("a", since=50.0, until=99.0, faults=tuple(faults(0, 1)))
    q3 = Quarantine("b", since=10.0, until=99.0, faults=tuple(faults(0, 1, 2)))
    assert q2.badness == (2, 50.0)
    assert sorted([q3, q2], key=lambda q: q.badness) == [q2, q3]


def test_reason_names_counts_runs_and_the_last_three_faults():
    fs = tuple(Fault("n1", float(i), run=f"r{i % 2}", reason=f"xid {i}") for i in range(4))
    q = Quarantine("n1", 3.0, 9.0, fs)
    assert q.reason == "quarantined: 4 faults in 2 run(s) (xid 1; xid 2; xid 3)"
    long = Quarantine("n1", 0.0, 1.0, (Fault("n1", 0.0, "r", "y" * 500),) * 2)
    assert len(long.reason) == 300


def test_fault_json_round_trip_and_defaults():
    f = Fault("n1", 12.5, "r", "xid 79", key="r:0:n1", source="prolog")
    assert f.to_json() == {
        "node": "n1",
        "at": 12.5,
        "run": "r",
        "reason": "xid 79",
        "key": "r:0:n1",
        "source": "prolog",
    }
    assert Fault.from_json(f.to_json()) == f
    old = Fault.from_json({"node": "n1", "at": "3", "run": "r", "reason": "x", "key": None, "source": None})
    assert (old.at, old.key, old.source) == (3.0, "", "fault")
    assert Fault("n1", 0.0, "r", "x").source == "fault" and Fault("n1", 0.0, "r", "x").key == ""


def test_settings_faults_and_quarantines_are_immutable_values():
    q = quarantined(faults(0, 1), {}, now=DAY)["n1"]
    for value in (QuarantineSettings(), q.faults[0], q):
        with pytest.raises(dataclasses.FrozenInstanceError):
            value.node = "other"  # type: ignore[misc]
