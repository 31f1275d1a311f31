"""Probation on a fault trace, and the InfiniteHBD converter (hostile input refused)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from supervisor.domain.health.quarantine import ProbationSettings, kept_out_of, on_probation
from supervisor.sim.faults import fault_trace
from supervisor.sim.faults.infinitehbd import convert, to_csv
from supervisor.sim.faults.probation_replay import judge_probation

DAY = 86400.0
A = "067eb1e2-ea0b-4069-b64e-5df892642f88"
B = "6f24e2b2-5b9b-4f8a-82ec-d7d57d7c6758"


def _event(node: str, days: float, kind: str, cls: str = "GPU", desc: str = "GPU xid Error") -> dict[str, object]:
    return {
        "node_id": node,
        "event_time": days,
        "event_type": kind,
        "fault_type": {"Level": "Hardware Failure", "Class": cls, "Desc": desc},
    }


def test_probation_keeps_a_returned_node_out_of_big_runs_only() -> None:
    settings = ProbationSettings(hold_s=2 * DAY, max_run_nodes=8)
    returned = {"n1": 10 * DAY, "n2": 1 * DAY}
    assert on_probation(returned, 11 * DAY, settings) == {"n1"}
    assert kept_out_of(64, returned, 11 * DAY, settings) == {"n1"}
    assert kept_out_of(8, returned, 11 * DAY, settings) == set()
    assert kept_out_of(64, returned, 12 * DAY, settings) == set()


def test_converter_pairs_starts_and_ends_and_maps_classes() -> None:
    events = [
        _event(A, 1.0, "fault_start", desc="GPU DBE(Double Bit ECC) > Threshold"),
        _event(A, 1.5, "fault_end"),
        _event(B, 2.0, "fault_start", "NIC", "NIC Lost"),
        _event(B, 2.0, "fault_start", "Fan", "Fan"),
        _event(B, 3.0, "fault_end", "NIC", "NIC Lost"),
        _event(A, 3.2, "fault_start", "Fan", "Fan"),
        _event(A, 3.4, "fault_end"),
    ]
    got = convert(json.dumps(events).encode())
    assert [(r[0], r[1] / DAY, r[3]) for r in got.rows] == [(A, 1.0, "ecc"), (B, 2.0, "nic"), (A, 3.2, "host_down")]
    assert got.skipped == 1  # B's second start while it was down


@pytest.mark.parametrize(
    "bad",
    [
        {"node_id": "../../etc", "event_time": 1.0, "event_type": "fault_start"},
        {"node_id": A, "event_time": -1.0, "event_type": "fault_start"},
        {"node_id": A, "event_time": 1e9, "event_type": "fault_start"},
        {"node_id": A, "event_time": 1.0, "event_type": "reboot"},
    ],
)
def test_converter_refuses_hostile_events(bad: dict[str, object]) -> None:
    with pytest.raises(ValueError, match="InfiniteHBD trace"):
        convert(json.dumps([bad]).encode())


def test_probation_avoids_a_repeat_fault_soon_after_return(tmp_path: Path) -> None:
    events = [
        _event(A, 1.0, "fault_start"),
        _event(A, 1.5, "fault_end"),
        _event(A, 2.5, "fault_start"),
        _event(A, 2.6, "fault_end"),  # 1 d after return: avoided
        _event(A, 9.0, "fault_start"),
        _event(A, 9.1, "fault_end"),
    ]  # 6.4 d after: not
    path = tmp_path / "t.csv"
    path.write_text(to_csv(convert(json.dumps(events).encode())))
    trace = fault_trace.load(path)
    got = judge_probation(trace, 10 * DAY, ProbationSettings(hold_s=2 * DAY))
    assert (got.node_faults, got.faults_avoided) == (3, 1)
    # on probation 1.5-2.5 (then under repair to 2.6), 2.6-4.6 and 9.1-10: 3.9 node-days
    assert got.node_days_held_out_healthy == pytest.approx(3.9, abs=0.01)
