"""What Slurm 24.11 and 26.05 print where 22.05 printed something else, read into the same values
(../shared/SLURM-RELEASES.md; docs/slurm-releases.md). The shapes are those of real captures
(tests/data/slurm/*_2411_*, *_2605_*); the real-Slurm tier runs the same reads on each release."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from supervisor.adapters.slurm import squeue_format as fmt
from supervisor.adapters.slurm.json_parsers import decode_exit_code, parse_job, parse_sinfo, parse_squeue
from supervisor.adapters.slurm.reads import sinfo_json_argv, squeue_json_argv
from supervisor.adapters.slurm.sacct import FIELDS, parse_record, parse_sacct
from supervisor.domain.cluster import JobHold, JobState

SEPS = fmt.Separators("\x1fF\x1f", "\x1eR\x1e")


def formatted_job(**values: str) -> str:
    row = {key: "" for _, key in fmt.JOB_FIELDS}
    row.update(job_id="7", user_id="1017", job_state="FAILED", state_reason="NonZeroExitCode", priority="0")
    row.update(restart_cnt="0", submit_time="1796129386", start_time="1796129387", end_time="1796129390")
    row.update(partition="main", nodes="n1", name="train", comment="(null)")
    row.update(values)
    return SEPS.field.join(row[key] for _, key in fmt.JOB_FIELDS) + SEPS.record + "\n"


def by_id(**values: str):
    return fmt.parse_jobs(formatted_job(**values), SEPS)[7]


@pytest.mark.parametrize(
    ("printed", "exit_code", "term_signal"),
    [
        ("93:0", 93, None),  # 24.11+: code:signal
        ("3:0", 3, None),
        ("0:9", None, 9),  # SIGKILL
        ("0:15", None, 15),
        ("0:0", 0, None),
        ("23808", 93, None),  # 22.05: the raw wait status (93 << 8)
        ("9", None, 9),
    ],
)
def test_a_job_read_by_id_keeps_its_exit_code_or_signal_on_every_release(printed, exit_code, term_signal):
    """24.11 and 26.05 print squeue -O exit_code as code:signal: read as a number it was None, so a
    job exiting 93 (do not restart) was restarted."""
    job = by_id(exit_code=printed, job_state="COMPLETED" if printed in ("0:0",) else "FAILED")
    assert (job.exit_code, job.term_signal) == (exit_code, term_signal)


def test_code_signal_text_that_is_not_two_numbers_is_no_exit_code():
    assert decode_exit_code("3:x") == (None, None)
    assert decode_exit_code(":") == (None, None)
    assert decode_exit_code("3:0:1") == (None, None)


def test_the_unscoped_job_read_asks_for_finished_jobs_too():
    """From 24.05 on --json honours squeue's default state filter: without --states=all a tool's or
    the guard's read lost every finished job (22.05 ignores the option)."""
    assert "--states=all" in squeue_json_argv()
    assert "--states=all" in squeue_json_argv("alice")


def test_the_node_reads_ask_for_node_addresses():
    """23.11+ sinfo --json fills nodes.addresses only when the format names NodeAddr."""
    for argv in (sinfo_json_argv(), sinfo_json_argv("n[1-4]")):
        assert any(a.startswith("--Format=") and "NodeAddr" in a for a in argv), argv


def _sinfo_entry(state: list[str], reason: str, addresses: list[str], nodes: str = "n1") -> dict:
    return {
        "node": {"state": state},
        "nodes": {"nodes": [nodes], "addresses": addresses, "hostnames": []},
        "partition": {"name": "main"},
        "port": 6818,
        "reason": {"description": reason},
    }


def test_a_resumed_node_keeps_no_stale_reason():
    """24.11 keeps a node's Reason after ``scontrol update state=resume``; 22.05 and 26.05 clear it.
    The adapter keeps a reason only on a node that is out of service (down, drained, failing)."""
    doc = {
        "sinfo": [
            _sinfo_entry(["IDLE"], "probe drain [root@host]", ["127.0.0.1"], "n1"),
            _sinfo_entry(["IDLE", "DRAIN"], "xid 79", ["127.0.0.1"], "n2"),
            _sinfo_entry(["DOWN", "NOT_RESPONDING"], "Not responding", ["127.0.0.1"], "n3"),
        ]
    }
    nodes = parse_sinfo(doc)
    assert nodes["n1"].reason == ""
    assert nodes["n2"].reason == "xid 79"
    assert nodes["n3"].reason == "Not responding"


def _json_job(state: list[str], exit_code: dict, nodes: str = "n1") -> dict:
    return {"job_id": 9, "job_state": state, "exit_code": exit_code, "nodes": nodes, "name": "train"}


def test_a_requeued_job_still_completing_reads_as_22_05_names_it():
    """24.11+: a requeued job cleaning up is PENDING+COMPLETING on its old node; 22.05 says
    COMPLETING. The adapter gives the policy one shape: COMPLETING, on the nodes it is leaving."""
    job = parse_job(_json_job(["PENDING", "COMPLETING"], {"status": ["PENDING"]}))
    assert job.state is JobState.COMPLETING and job.completing
    assert job.nodes == ("n1",)
    pending = parse_job(_json_job(["PENDING"], {"status": ["PENDING"]}, nodes=""))
    assert pending.state is JobState.PENDING and not pending.completing


def test_a_node_failure_is_not_read_as_the_jobs_own_exit_code_or_signal():
    """24.11+: NODE_FAIL comes as SIGHUP in JSON and as ExitCode 1:0 in sacct; a spec listing 1 as
    do-not-restart would have given up on a node failure."""
    hup = {"status": ["SIGNALED"], "return_code": {"set": True, "number": 0}, "signal": {"id": 1, "name": "HUP"}}
    job = parse_job(_json_job(["NODE_FAIL", "COMPLETING"], hup))
    assert job.state is JobState.NODE_FAIL
    assert (job.exit_code, job.term_signal) == (None, None)
    fields = dict.fromkeys(FIELDS, "")
    fields.update(JobIDRaw="9", JobName="train", State="NODE_FAIL", ExitCode="1:0", NodeList="n1")
    fields.update(Submit="1796129386", Start="1796129387", End="1796129390", Reason="None", Restarts="0")
    record = parse_record("|".join(fields[f] for f in FIELDS))
    assert record.state is JobState.NODE_FAIL
    assert (record.exit_code, record.term_signal) == (None, None)


# ------------------------------------------------------------------ real captures, every release

DATA = Path(__file__).resolve().parents[1] / "data" / "slurm"
RELEASES = ("2205", "2411", "2605")  # every release of the matrix (tests/data/slurm/capture.py)
CAPTURE_SEPARATORS = fmt.Separators("\x1fCAPTURE\x1f", "\x1eCAPTURE\x1e")
CAPTURED_JOB_FIELDS = fmt.JOB_FIELDS[:-1]  # the captures were taken before PreemptTime was read


def by_name(jobs) -> dict:
    return {job.name: job for job in jobs}


@pytest.mark.parametrize("release", RELEASES)
def test_every_release_gives_the_same_outcomes_read_by_id_and_as_json(release):
    captured = (DATA / f"squeue_{release}_mixed_by_id.txt").read_text()
    formatted = fmt.parse_jobs(captured, CAPTURE_SEPARATORS, CAPTURED_JOB_FIELDS)
    as_json = parse_squeue(json.loads((DATA / f"squeue_{release}_mixed_states_all.json").read_text()))
    for jobs in (by_name(formatted.values()), by_name(as_json.values())):
        outcomes = {name: (jobs[name].state, jobs[name].exit_code, jobs[name].term_signal) for name in OUTCOMES}
        assert outcomes == OUTCOMES


OUTCOMES = {
    "completed": (JobState.COMPLETED, 0, None),
    "failed_exit3": (JobState.FAILED, 3, None),
    "killed_sig9": (JobState.FAILED, None, 9),
}


@pytest.mark.parametrize("release", RELEASES)
def test_every_release_gives_node_addresses_to_the_daemons_node_read(release):
    nodes = parse_sinfo(json.loads((DATA / f"sinfo_{release}_mixed_nodeaddr.json").read_text()))
    assert set(nodes) == {"n1", "n2", "n3", "n4"}
    assert {n.address for n in nodes.values()} == {"127.0.0.1"} and all(n.port for n in nodes.values())


def capture(name: str) -> dict:
    return by_name(parse_squeue(json.loads((DATA / name).read_text())).values())


@pytest.mark.parametrize("release", RELEASES)
def test_every_release_tells_holds_requeues_and_running_jobs_apart_alike(release):
    jobs = capture(f"squeue_{release}_mixed_states_all.json")
    assert jobs["held_user"].hold is JobHold.USER and jobs["held_admin"].hold is JobHold.ADMIN
    requeued = jobs["requeued"]
    assert (requeued.state, requeued.restart_count, requeued.nodes, requeued.held) == (JobState.PENDING, 1, (), False)
    running = jobs["running"]
    assert (running.state, running.comment, running.excluded_nodes) == (
        JobState.RUNNING,
        "run=r1,intent=7 tag:x",
        ("n4",),
    )
    assert running.exit_code is None and running.end_time is None and running.state_reason == ""
    assert jobs["cancelled_running"].state is JobState.CANCELLED
    prolog = capture(f"squeue_{release}_prolog_held_states_all.json")["prolog_failed"]
    assert prolog.hold is JobHold.LAUNCH_FAILED and prolog.restart_count == 1


@pytest.mark.parametrize("release", RELEASES)
def test_every_release_reads_a_node_failure_alike(release):
    """A 2-node --no-requeue job, one node crashed and set DOWN. While the other node cleans up,
    22.05 says COMPLETING and 24.11+ NODE_FAIL+COMPLETING: completing either way."""
    completing = capture(f"squeue_{release}_completing_states_all.json")["two_node_no_requeue"]
    assert completing.completing and len(completing.nodes) == 1
    failed = capture(f"squeue_{release}_node_fail_states_all.json")["two_node_no_requeue"]
    assert failed.state is JobState.NODE_FAIL and not failed.completing and len(failed.nodes) == 2
    assert (failed.exit_code, failed.term_signal) == (None, None)


@pytest.mark.parametrize("release", RELEASES)
def test_every_release_reads_down_drained_and_silent_nodes_alike(release):
    nodes = parse_sinfo(json.loads((DATA / f"sinfo_{release}_down_drain_nodeaddr.json").read_text()))
    assert nodes["n1"].idle and nodes["n1"].reason == ""
    crashed = nodes["n2"]
    assert crashed.down and crashed.drained and crashed.reason == "supervisor: crashed, drained"
    assert nodes["n3"].drained and not nodes["n3"].schedulable and nodes["n3"].reason == "supervisor: test drain"
    assert not nodes["n4"].responding
    assert {n.address for n in nodes.values()} == {"127.0.0.1"}
    prolog = parse_sinfo(json.loads((DATA / f"sinfo_{release}_prolog_drain_nodeaddr.json").read_text()))
    assert [n.reason for n in prolog.values() if n.prolog_failed] == ["Prolog error"]


def test_a_node_in_two_partitions_and_a_grouped_entry():
    """What the captures do not hold (one partition, --Node): a node listed once per partition gets
    both; an entry without --Node names a group, whose addresses are kept only when they match."""
    doc = {
        "sinfo": [
            _sinfo_entry(["IDLE"], "", ["10.1.0.1"], "gpu01"),
            {**_sinfo_entry(["IDLE"], "", ["10.1.0.1"], "gpu01"), "partition": {"name": "debug"}},
            _sinfo_entry(["MIXED"], "", ["10.2.0.1", "10.2.0.2"], "cpu[01-02]"),
            _sinfo_entry(["IDLE"], "", [], "cpu03"),
        ]
    }
    nodes = parse_sinfo(doc)
    assert nodes["gpu01"].partitions == ("main", "debug") and nodes["gpu01"].address == "10.1.0.1"
    assert (nodes["cpu02"].address, nodes["cpu02"].port) == ("10.2.0.2", None)
    assert nodes["cpu03"].address == "" and nodes["cpu03"].port == 6818


@pytest.mark.parametrize("release", RELEASES)
def test_every_release_gives_the_same_outcomes_from_accounting(release):
    """sacct on each release (tests/data/slurm/capture_sacct.py): 24.11+ writes NODE_FAIL's ExitCode
    as 1:0, which is not the job's own."""
    jobs = by_name(parse_sacct((DATA / f"sacct_{release}.txt").read_text()).values())
    outcomes = {name: (jobs[name].state, jobs[name].exit_code, jobs[name].term_signal) for name in OUTCOMES}
    assert outcomes == OUTCOMES
    assert (jobs["node_fail"].state, jobs["node_fail"].exit_code, jobs["node_fail"].term_signal) == (
        JobState.NODE_FAIL,
        None,
        None,
    )
    assert jobs["requeued_then_completed"].restart_count == 1
