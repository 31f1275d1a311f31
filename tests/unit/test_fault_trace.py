"""Replaying a site's fault trace: the format, its validation, where faults strike, and the bad-node
memory (quarantine) judged on it."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
from click.testing import CliRunner

from supervisor.cli import main
from supervisor.domain.health.quarantine import QuarantineSettings
from supervisor.sim.faults import fault_trace
from supervisor.sim.faults.failures import Manifestation
from supervisor.sim.faults.quarantine_replay import judge
from supervisor.sim.runner import Simulation
from supervisor.sim.training.settings import Mode, SimSettings

H, DAY = 3600.0, 86400.0

#: A small site's trace, made here: node7 is a lemon (three GPU faults in four days), node10 has a
#: dead host once, node2 a bug (a job-level fault: it strikes the job wherever it runs).
TRACE = [
    {"node": "node7", "start": 2 * H, "end": 6 * H, "cause": "Faulty GPU"},
    {"node": "node10", "start": 10 * H, "end": 10.5 * H, "cause": "host_down"},
    {"node": "node7", "start": 1 * DAY, "end": 1 * DAY + 4 * H, "cause": "GPU HBM3 Memory"},
    {"node": "node2", "start": 1.5 * DAY, "cause": "Software Bug"},
    {"node": "node7", "start": 1.8 * DAY, "end": 1.8 * DAY + 4 * H, "cause": "xid"},
    {"node": "node7", "start": 3.5 * DAY, "end": 3.5 * DAY + 2 * H, "cause": "ecc"},
]
NODES = ["node1", "node2", "node3", "node4", "node5", "node6", "node7", "node8", "node9", "node10"]


def write_json(tmp_path, rows, name="trace.json"):
    path = tmp_path / name
    path.write_text(json.dumps({"faults": rows}))
    return path


def write_csv(tmp_path, rows, name="trace.csv"):
    lines = ["node,start,end,cause"] + [f"{r['node']},{r['start']},{r.get('end', '')},{r['cause']}" for r in rows]
    path = tmp_path / name
    path.write_text("\n".join(lines) + "\n")
    return path


def test_json_and_csv_give_the_same_trace_with_nodes_in_natural_order(tmp_path):
    from_json = fault_trace.load(write_json(tmp_path, TRACE))
    from_csv = fault_trace.load(write_csv(tmp_path, TRACE))
    assert from_json.faults == from_csv.faults
    assert from_json.nodes == ("node2", "node7", "node10")  # node10 after node7: natural order
    assert [f.start_s for f in from_json.faults] == sorted(r["start"] for r in TRACE)
    bug = next(f for f in from_json.faults if f.node == "node2")
    assert bug.end_s is None and bug.cause.shows is Manifestation.SOFTWARE
    assert from_json.faults[-1].cause.shows is Manifestation.ECC  # a manifestation as the cause


def test_timestamps_count_from_the_earliest_fault(tmp_path):
    rows = [
        {"node": "a1", "start": "2025-03-01T10:00:00Z", "end": "2025-03-01T14:00:00+00:00", "cause": "NIC"},
        {"node": "a2", "start": "2025-03-02T10:00:00Z", "cause": "Power Supply"},
    ]
    trace = fault_trace.load(write_json(tmp_path, rows))
    assert [(f.start_s, f.end_s) for f in trace.faults] == [(0.0, 4 * H), (DAY, None)]
    assert trace.origin.startswith("2025-03-01T10:00:00")


@pytest.mark.parametrize(
    ("row", "says"),
    [
        ({"node": "n1", "start": 5, "cause": "cosmic rays"}, "unknown cause 'cosmic rays'"),
        ({"node": "n1; rm -rf /", "start": 5, "cause": "xid"}, "is not a node name"),
        ({"node": "n1", "start": -5, "cause": "xid"}, "finite number ≥ 0"),
        ({"node": "n1", "start": 50, "end": 10, "cause": "xid"}, "ends before the fault starts"),
        ({"node": "n1", "start": "2025-03-01T10:00:00", "cause": "xid"}, "no time zone"),
        ({"node": "n1", "start": "yesterday", "cause": "xid"}, "neither seconds nor an ISO 8601 time"),
        (
            {"node": "n1", "start": 5, "end": "2025-03-01T10:00:00Z", "cause": "xid"},
            "both be seconds or both timestamps",
        ),
        ({"node": "n1", "cause": "xid"}, "start"),
    ],
)
def test_a_bad_row_is_refused_with_its_row_and_the_fix(tmp_path, row, says):
    path = write_json(tmp_path, [{"node": "n0", "start": 1, "cause": "xid"}, row])
    with pytest.raises(ValueError, match="fault trace") as err:
        fault_trace.load(path)
    message = str(err.value)
    assert says in message
    assert ", row 2" in message or "$.faults[1]" in message  # the row, numbered from 1 or as a JSON path


def test_a_csv_without_the_columns_or_an_empty_trace_is_refused(tmp_path):
    bad = tmp_path / "bad.csv"
    bad.write_text("host,when\nn1,5\n")
    with pytest.raises(ValueError, match="lacks cause, node, start"):
        fault_trace.load(bad)
    with pytest.raises(ValueError, match="no faults"):
        fault_trace.load(write_json(tmp_path, []))
    with pytest.raises(ValueError, match="cannot read"):
        fault_trace.load(tmp_path / "missing.json")
    huge = tmp_path / "huge.csv"
    huge.write_text("node,start,end,cause\n" + "n1,5,," + "x" * 200_000 + "\n")
    with pytest.raises(ValueError, match="field limit.*after line 1; fix or drop that line"):
        fault_trace.load(huge)


def test_the_trace_pins_node_faults_on_its_nodes_with_its_repair_times(tmp_path):
    trace = fault_trace.load(write_json(tmp_path, TRACE))
    failures = trace.failures(horizon_s=2 * DAY)
    assert len(failures) == 5  # the fault at 3.5 days is past the horizon
    first = failures[0]
    assert first.node_index == 1 and first.repair_s == 4 * H  # node7 is the trace's second node
    assert first.lands_on(["x1", "x2"], ["p1", "p2", "p3"]) == "p2"  # its own node, not the job's
    assert first.lands_on(["x1"], ["p1"]) is None  # a pool smaller than the trace
    bug = failures[3]
    assert bug.lands_on(["x1", "x2"], ["p1", "p2", "p3"]) in ("x1", "x2")  # a job-level fault: the job
    assert trace.failures(2 * DAY) == failures  # the same draw for every mode


def test_a_node_fault_strikes_the_job_only_when_its_node_is_in_the_allocation(tmp_path):
    # A 1-node job + 1 idle node: "a" (the trace's first node) carries the job, "b" is idle.
    rows = [
        {"node": "b", "start": 2 * H, "end": 2.5 * H, "cause": "host_down"},
        {"node": "a", "start": 3 * H, "end": 3.5 * H, "cause": "GPU System Processor"},
    ]
    trace = fault_trace.load(write_json(tmp_path, rows))
    settings = SimSettings(gpus=8, gpus_per_node=8, spares=1, baseline_spares=1, days=0.5)
    result = Simulation(settings, Mode.BASELINE).run(trace.failures(settings.seconds))
    on_idle, on_job = result.strikes
    assert (on_idle.node, on_idle.interrupted) == ("n002", False)
    assert (on_job.node, on_job.interrupted) == ("n001", True)
    assert result.interruptions == 1
    # With no idle node the cluster has no second node: the fault on it is not replayed.
    alone = Simulation(replace(settings, baseline_spares=0), Mode.BASELINE).run(trace.failures(settings.seconds))
    assert [s.node for s in alone.strikes] == ["n001"]


def test_quarantine_is_judged_on_the_trace_faults_avoided_against_healthy_node_days(tmp_path):
    trace = fault_trace.load(write_json(tmp_path, TRACE))
    j = judge(trace, horizon_s=5 * DAY, settings=QuarantineSettings(faults=2, window_s=7 * DAY, base_s=DAY))
    # node7: faults at 2 h, 1 d, 1.8 d, 3.5 d. After the 2nd (1 d) it is quarantined for 1 d, so the
    # 3rd (1.8 d) is avoided; the 3rd makes it 2 d (to 3.8 d), so the 4th (3.5 d) is avoided too.
    # The 4th makes it 4 d: quarantined from 1 d to the 5-day horizon.
    assert (j.node_faults, j.repeat_faults, j.faults_avoided, j.nodes_quarantined) == (5, 3, 2, 1)
    assert j.node_days_quarantined == pytest.approx(4.0)
    under_repair = (4 * H + 4 * H + 2 * H) / DAY  # the repairs inside the quarantine
    assert j.node_days_held_out_healthy == pytest.approx(4.0 - under_repair)
    never = judge(trace, 5 * DAY, QuarantineSettings(faults=5))
    assert (never.faults_avoided, never.node_days_quarantined) == (0, 0.0)


def test_simulate_replays_a_fault_trace_and_reports_the_quarantines_figures(tmp_path):
    path = write_csv(tmp_path, TRACE)
    args = ["simulate", "--fault-trace", str(path), "--nodes-per-job", "2", "--spares", "1", "--compare"]
    out = CliRunner().invoke(main, [*args, "--json", "--state-dir", str(tmp_path / "state")])
    assert out.exit_code == 0, out.output
    doc = json.loads(out.output)
    replay = doc["fault_trace"]
    assert replay["faults"] == 6 and replay["nodes"] == 3 and replay["faults_outside_pool"] == 0
    assert replay["days"] == pytest.approx(3.5 + 2 / 24, abs=0.01)
    assert replay["quarantine"]["faults_avoided"] == 2
    # probation (2 days after each return, issue 34): node7's 2nd, 3rd and 4th faults each come within
    # 2 days of its return from the one before; the shares are of the 5 node faults and of the fleet's
    # node-days (3 nodes over the trace's 3.58 days)
    p = replay["probation"]
    assert (p["faults_avoided"], p["avoided_share"], p["hold_h"], p["max_run_nodes"]) == (3, 0.6, 48.0, 8)
    assert p["cost_share"] == pytest.approx(p["node_days_held_out_healthy"] / (3 * replay["days"]), abs=1e-3)
    assert replay["quarantine"]["avoided_share"] == 0.4
    sup, base = doc["figures"]["supervisor"], doc["figures"]["baseline"]
    assert sup["failures_drawn"] == base["failures_drawn"] == 6  # both modes, the same faults
    # The engine's own bad-node memory: node7 is quarantined after its second fault, so its third
    # (an XID at 1.8 days) strikes Slurm alone's job but not the supervised one.
    assert base["by_cause"].get("trace: xid") == 1 and "trace: xid" not in sup["by_cause"]
    assert sup["interruptions"] < base["interruptions"]
    assert "fault trace trace.csv" in doc["assumptions"]["failure model"]
    table = CliRunner().invoke(main, args + ["--state-dir", str(tmp_path / "state2")])
    assert table.exit_code == 0, table.output
    assert "faults avoided by quarantine" in table.output
    assert "probation (48 h, runs over 8 nodes): 3 faults avoided, 60.0% of node faults" in table.output


def test_simulate_refuses_a_bad_trace_and_a_trace_with_the_titan_model(tmp_path):
    bad = write_json(tmp_path, [{"node": "n1", "start": 1, "cause": "gremlins"}])
    out = CliRunner().invoke(main, ["simulate", "--fault-trace", str(bad), "--nodes-per-job", "1"])
    assert out.exit_code == 2 and "unknown cause 'gremlins'" in out.output
    good = write_json(tmp_path, TRACE, "good.json")
    out = CliRunner().invoke(main, ["simulate", "--fault-trace", str(good), "--titan-trace", str(good)])
    assert out.exit_code == 2 and "not both" in out.output
    out = CliRunner().invoke(main, ["simulate", "--fault-trace", str(good), "--spares", "3"])
    assert out.exit_code == 2 and "--nodes-per-job" in out.output  # 3 trace nodes, 3 spares: no job
