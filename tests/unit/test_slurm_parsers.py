"""Parsers, argv builders and error mapping of the Slurm CLI adapter. No Slurm needed: real 22.05
captures and hand-written 23.02+/24.x documents in tests/data/slurm."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from supervisor.adapters.slurm.cli import (
    classify,
    client_env,
    exclude_argv,
    node_state_argv,
    parse_sbatch_output,
    requeue_argv,
    sbatch_argv,
)
from supervisor.adapters.slurm.json_parsers import (
    decode_exit_code,
    decode_wait_status,
    document_errors,
    expand_nodes,
    number,
    parse_sinfo,
    parse_squeue,
    split_job_state,
    split_node_state,
)
from supervisor.domain.cluster import JobHold, JobInfo, JobState, NodeChange, NodeInfo, NodeState, SubmitRequest
from supervisor.ports import PermanentError, PermissionDenied, TransientError

DATA = Path(__file__).resolve().parents[1] / "data" / "slurm"


def load(name: str) -> dict:
    return json.loads((DATA / name).read_text())


def jobs_by_name(name: str) -> dict[str, JobInfo]:
    return {j.name: j for j in parse_squeue(load(name)).values()}


# ---------------------------------------------------------------------------- scalars


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (5, 5),
        (0, 0),
        (None, None),
        ({"set": True, "infinite": False, "number": 7}, 7),
        ({"set": False, "infinite": False, "number": 0}, None),
        ({"set": True, "infinite": True, "number": 0}, None),
        (4294967294, None),  # NO_VAL
        ("12", 12),
        (True, None),
    ],
)
def test_number(value: object, expected: int | None) -> None:
    assert number(value) == expected


def test_expand_nodes() -> None:
    assert expand_nodes("n[1-3],m2") == ("n1", "n2", "n3", "m2")
    assert expand_nodes(["gpu[01-02]", "gpu02"]) == ("gpu01", "gpu02")
    assert expand_nodes("") == ()
    assert expand_nodes(None) == ()
    assert expand_nodes("bad[1-") == ("bad[1-",)


# ---------------------------------------------------------------------------- exit codes


@pytest.mark.parametrize(
    ("status", "expected"),
    [
        (0, (0, None)),
        (768, (3, None)),  # exit 3 as 22.05's squeue shows it
        (256 * 255, (255, None)),
        (9, (None, 9)),  # SIGKILL
        (15, (None, 15)),  # SIGTERM (scancel)
        (0x80 | 11, (None, 11)),  # SIGSEGV with core dump
        (None, (None, None)),
    ],
)
def test_decode_wait_status(status: int | None, expected: tuple) -> None:
    assert decode_wait_status(status) == expected


def _verbose(status: list[str], rc: int | None, sig: int | None) -> dict:
    def num(n: int | None) -> dict:
        return {"set": n is not None, "infinite": False, "number": n or 0}

    return {"status": status, "return_code": num(rc), "signal": {"id": num(sig), "name": ""}}


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (768, (3, None)),
        (_verbose(["SUCCESS"], 0, None), (0, None)),
        (_verbose(["ERROR"], 3, None), (3, None)),
        (_verbose(["SIGNALED"], None, 9), (None, 9)),
        (_verbose(["CORE_DUMPED", "SIGNALED"], None, 11), (None, 11)),
        (_verbose(["PENDING"], None, None), (None, None)),
        ({"status": "ERROR", "return_code": 2, "signal": {"signal_id": 0, "name": ""}}, (2, None)),
    ],
)
def test_decode_exit_code(value: object, expected: tuple) -> None:
    assert decode_exit_code(value) == expected


# ---------------------------------------------------------------------------- states


@pytest.mark.parametrize(
    ("value", "state", "flags"),
    [
        ("RUNNING", JobState.RUNNING, set()),
        ("COMPLETING", JobState.COMPLETING, {"COMPLETING"}),
        ("REQUEUE_HOLD", JobState.PENDING, {"REQUEUE_HOLD"}),
        (["PENDING", "REQUEUED"], JobState.PENDING, {"REQUEUED"}),
        (["CANCELLED", "COMPLETING"], JobState.CANCELLED, {"COMPLETING"}),
        (["node_fail"], JobState.NODE_FAIL, set()),
        ("WHATEVER", JobState.UNKNOWN, {"WHATEVER"}),
        (None, JobState.UNKNOWN, set()),
    ],
)
def test_split_job_state(value: object, state: JobState, flags: set[str]) -> None:
    assert split_job_state(value) == (state, frozenset(flags))


@pytest.mark.parametrize(
    ("state", "flags", "base", "expected_flags"),
    [
        ("idle", [], NodeState.IDLE, set()),
        ("down", ["DRAIN", "NOT_RESPONDING"], NodeState.DOWN, {"DRAIN", "NOT_RESPONDING"}),
        (["IDLE", "DRAIN"], None, NodeState.IDLE, {"DRAIN"}),
        ("IDLE+DRAIN", None, NodeState.IDLE, {"DRAIN"}),
        (["PLANNED"], None, NodeState.UNKNOWN, {"PLANNED"}),
    ],
)
def test_split_node_state(state: object, flags: object, base: NodeState, expected_flags: set[str]) -> None:
    assert split_node_state(state, flags) == (base, frozenset(expected_flags))


# ---------------------------------------------------------------------------- 22.05 captures


def test_2205_mixed_jobs() -> None:
    jobs = jobs_by_name("squeue_2205_mixed.json")
    assert jobs["completed"].state is JobState.COMPLETED and jobs["completed"].exit_code == 0
    failed = jobs["failed_exit3"]
    assert (failed.state, failed.exit_code, failed.term_signal) == (JobState.FAILED, 3, None)
    assert failed.state_reason == "NonZeroExitCode"
    killed = jobs["killed_sig9"]
    assert (killed.exit_code, killed.term_signal) == (None, 9)
    assert jobs["cancelled_running"].state is JobState.CANCELLED
    assert jobs["cancelled_running"].term_signal == 15


def test_2205_running_job_fields() -> None:
    job = jobs_by_name("squeue_2205_mixed.json")["running"]
    assert job.state is JobState.RUNNING and not job.held and not job.completing
    assert job.comment == "run=r1,intent=7 tag:x"
    assert job.excluded_nodes == ("n4",)
    assert len(job.nodes) == 1 and job.partition == "main"
    assert job.exit_code is None and job.end_time is None  # 22.05 shows start + time limit
    assert job.start_time is not None and job.submit_time is not None
    assert job.state_reason == ""  # Slurm's "None"


def test_2205_pending_held_and_requeued() -> None:
    jobs = jobs_by_name("squeue_2205_mixed.json")
    requeued = jobs["requeued"]
    assert (requeued.state, requeued.restart_count, requeued.state_reason) == (JobState.PENDING, 1, "BeginTime")
    assert not requeued.held and requeued.start_time is None and requeued.nodes == ()
    assert jobs["held_user"].held and jobs["held_user"].state_reason == "JobHeldUser"
    assert jobs["held_admin"].held and jobs["held_admin"].state_reason == "JobHeldAdmin"
    assert not jobs["pending_resources"].held


def test_2205_prolog_failure_is_held_with_description() -> None:
    job = jobs_by_name("squeue_2205_prolog_held.json")["prolog_failed"]
    assert job.state is JobState.PENDING and job.held and job.restart_count == 1
    assert job.state_reason == "JobHeldUser"
    assert job.state_description == "launch failed requeued held"


def test_2205_completing_then_node_fail() -> None:
    completing = jobs_by_name("squeue_2205_completing.json")["two_node_no_requeue"]
    assert completing.completing and completing.state is JobState.COMPLETING
    assert completing.state_reason == "NodeDown" and len(completing.nodes) == 1
    failed = jobs_by_name("squeue_2205_node_fail.json")["two_node_no_requeue"]
    assert failed.state is JobState.NODE_FAIL and failed.state.finished and not failed.completing
    # 22.05 fills in SIGTERM (24.11+ SIGHUP): Slurm's, not the job's own, so neither is read as its outcome
    assert len(failed.nodes) == 2 and (failed.exit_code, failed.term_signal) == (None, None)


def test_2205_nodes_down_drain() -> None:
    nodes = parse_sinfo(load("sinfo_2205_down_drain.json"))
    assert nodes["n1"].idle and nodes["n1"].address == "127.0.0.1" and nodes["n1"].port
    crashed = nodes["n2"]
    assert crashed.down and crashed.drained and not crashed.responding
    assert crashed.reason == "supervisor: crashed, drained"
    assert nodes["n3"].drained and nodes["n3"].state is NodeState.IDLE and not nodes["n3"].schedulable
    assert not nodes["n4"].responding and nodes["n4"].state is NodeState.IDLE
    assert all(n.partitions == ("main",) for n in nodes.values())


def test_2205_mixed_and_prolog_nodes() -> None:
    nodes = parse_sinfo(load("sinfo_2205_mixed.json"))
    assert sorted(n.state.value for n in nodes.values()) == ["ALLOCATED", "IDLE", "IDLE", "IDLE"]
    prolog = parse_sinfo(load("sinfo_2205_prolog_drain.json"))
    assert [n.reason for n in prolog.values() if n.drained] == ["Prolog error"]


# ---------------------------------------------------------------------------- Slurm's wording into flags
# Decisions read JobInfo.hold and NodeInfo.prolog_failed; only the parser reads Slurm's texts.


def test_2205_holds_are_told_apart_by_who_holds() -> None:
    jobs = jobs_by_name("squeue_2205_mixed.json")
    assert jobs["held_user"].hold is JobHold.USER  # sbatch --hold: JobHeldUser
    assert jobs["held_admin"].hold is JobHold.ADMIN  # root's scontrol hold: JobHeldAdmin
    for name in ("requeued", "pending_resources", "running", "completed"):
        assert jobs[name].hold is JobHold.NONE, name


def test_2205_prolog_failure_hold_is_a_launch_failure_not_the_users() -> None:
    # 22.05 says JobHeldUser, like a person's hold; only the description tells them apart.
    job = jobs_by_name("squeue_2205_prolog_held.json")["prolog_failed"]
    assert job.state_reason == "JobHeldUser"
    assert job.hold is JobHold.LAUNCH_FAILED


def job_doc(state: object, reason: str = "None", description: str = "", **extra: object) -> dict:
    return {
        "job_id": 9,
        "name": "j",
        "job_state": state,
        "state_reason": reason,
        "state_description": description,
    } | extra


@pytest.mark.parametrize(
    ("doc", "hold"),
    [
        (job_doc("PENDING", "launch_failed_requeued_held"), JobHold.LAUNCH_FAILED),  # in the reason itself
        (job_doc("PENDING", "JobHeldAdmin", "launch failed requeued held"), JobHold.LAUNCH_FAILED),
        (job_doc("PENDING", "JobHeldAdmin"), JobHold.ADMIN),
        (job_doc("PENDING", "JobHeldUser"), JobHold.USER),
        (job_doc("REQUEUE_HOLD"), JobHold.OTHER),  # 22.05 shows the flag instead of PENDING
        (job_doc("SPECIAL_EXIT"), JobHold.OTHER),
        (job_doc(["PENDING"], "Priority", priority=0), JobHold.OTHER),
        (job_doc(["PENDING"], "Resources", priority=100), JobHold.NONE),
        (job_doc("RUNNING", "JobHeldAdmin"), JobHold.NONE),  # only a pending job is held
        (job_doc("FAILED", "JobHeldUser", "launch failed requeued held"), JobHold.NONE),
    ],
)
def test_hold_from_slurms_wording(doc: dict, hold: JobHold) -> None:
    job = parse_squeue({"jobs": [doc]})[9]
    assert job.hold is hold and job.held is (hold is not JobHold.NONE)


def test_2205_prolog_drain_is_flagged_on_the_node() -> None:
    nodes = parse_sinfo(load("sinfo_2205_prolog_drain.json"))
    assert [n.name for n in nodes.values() if n.prolog_failed] == [n.name for n in nodes.values() if n.drained]
    assert sum(n.prolog_failed for n in nodes.values()) == 1
    others = parse_sinfo(load("sinfo_2205_down_drain.json"))
    assert not any(n.prolog_failed for n in others.values())  # drained by a person, us, or not at all


@pytest.mark.parametrize(
    ("doc", "flagged"),
    [
        ({"nodes": [{"name": "n1", "state": "idle", "state_flags": ["DRAIN"], "reason": "Prolog error"}]}, True),
        ({"nodes": [{"name": "n1", "state": ["IDLE", "DRAIN"], "reason": "prolog error"}]}, True),
        ({"nodes": [{"name": "n1", "state": "idle", "state_flags": ["DRAIN"], "reason": "Epilog error"}]}, False),
        ({"nodes": [{"name": "n1", "state": "idle", "state_flags": ["DRAIN"], "reason": "checking prolog"}]}, False),
        (
            {
                "sinfo": [
                    {
                        "nodes": {"nodes": ["n1"]},
                        "node": {"state": ["IDLE", "DRAIN"]},
                        "reason": {"description": "Prolog error"},
                    }
                ]
            },
            True,
        ),
    ],
)
def test_prolog_failed_from_slurms_node_reason(doc: dict, flagged: bool) -> None:
    assert parse_sinfo(doc)["n1"].prolog_failed is flagged


@pytest.mark.parametrize("name", ["squeue_2205_controller_down.json", "sinfo_2205_controller_down.json"])
def test_2205_controller_down_documents_carry_errors(name: str) -> None:
    assert document_errors(load(name))


# ---------------------------------------------------------------------------- newer shapes


def test_2302_node_list() -> None:
    nodes = parse_sinfo(load("sinfo_2302_handwritten.json"))
    assert nodes["a1"].partitions == ("main", "long") and nodes["a1"].idle
    assert nodes["a2"].down and not nodes["a2"].responding and nodes["a2"].reason == "Not responding"
    assert nodes["a3"].state is NodeState.ALLOCATED and nodes["a3"].drained
    assert nodes["a3"].address == "10.3.0.3" and nodes["a3"].port == 6818


# ---------------------------------------------------------------------------- error mapping


@pytest.mark.parametrize(
    ("rc", "stderr", "kind"),
    [
        (0, "", None),
        (
            1,
            "sbatch: error: Batch job submission failed: Unable to contact slurm controller (connect failure)",
            TransientError,
        ),
        (1, "slurm_load_jobs error: Socket timed out on send/recv operation", TransientError),
        (1, "Unexpected message received for job 1\nslurm_suspend error: Unexpected message received", TransientError),
        (1, 'error: Munge encode failed: Failed to connect to "/run/munge/munge.socket.2"', TransientError),
        (-9, "", TransientError),
        (1, "Invalid job id specified for job 99999\nslurm_suspend error: Invalid job id specified", PermanentError),
        (1, "slurm_update error: Invalid node name specified", PermanentError),
        (255, "sbatch: unrecognized option '--bogus'", PermanentError),
        (1, "sbatch: error: Batch job submission failed: Invalid partition name specified", PermanentError),
        (1, "slurm_update error: Access/permission denied", PermissionDenied),
        (1, "scancel: error: Kill job error on job id 5: Access/permission denied", PermissionDenied),
        # Slurm 22.05 to an ordinary user's `scontrol update nodename=...` (measured on the harness)
        (1, "slurm_update error: Invalid user id", PermissionDenied),
    ],
)
def test_classify(rc: int, stderr: str, kind: type | None) -> None:
    error = classify(rc, stderr, "scontrol")
    if kind is None:
        assert error is None
    else:
        assert type(error) is kind
        assert "scontrol" in str(error)


# ---------------------------------------------------------------------------- argv builders


def _request(**overrides: object) -> SubmitRequest:
    fields: dict = dict(run="r1", script="/srv/run.sh", job_name="train", partition="gpu", nodes=4, comment="sup:r1:i7")
    fields.update(overrides)
    return SubmitRequest(**fields)


def test_sbatch_argv_minimal() -> None:
    argv = sbatch_argv(_request())
    assert argv[:2] == ["sbatch", "--parsable"]
    assert {
        "--job-name=train",
        "--partition=gpu",
        "--nodes=4",
        "--comment=sup:r1:i7",
        "--no-requeue",
        "--export=ALL",
    } <= set(argv)
    assert argv[-1] == "/srv/run.sh"
    assert not any(a.startswith(("--exclude", "--output", "--chdir")) for a in argv)


def test_sbatch_argv_full() -> None:
    argv = sbatch_argv(
        _request(
            exclude=("n3", "n1", "n2", "n7"),
            output="/logs/%j.out",
            workdir="/srv",
            requeue=True,
            extra_args=("--time=10", "--gres=gpu:8"),
        )
    )
    assert "--exclude=n[1-3,7]" in argv and "--requeue" in argv
    assert "--output=/logs/%j.out" in argv and "--open-mode=append" in argv and "--chdir=/srv" in argv
    assert argv[-3:] == ["--time=10", "--gres=gpu:8", "/srv/run.sh"]


def test_other_argv() -> None:
    assert requeue_argv(5) == ["scontrol", "requeue", "5"]
    assert requeue_argv(5, hold=True) == ["scontrol", "requeuehold", "5"]
    assert exclude_argv(5, ["n2", "n1"]) == ["scontrol", "update", "jobid=5", "excnodelist=n[1-2]"]
    assert exclude_argv(5, []) == ["scontrol", "update", "jobid=5", "excnodelist="]
    assert node_state_argv("n1", NodeChange.DRAIN, "bad gpu,\nsee log") == [
        "scontrol",
        "update",
        "nodename=n1",
        "state=DRAIN",
        "reason=bad gpu, see log",
    ]
    assert node_state_argv("n1", NodeChange.DOWN, "")[-1] == "reason=slurm-supervisor"
    assert node_state_argv("n1", NodeChange.RESUME, "x") == ["scontrol", "update", "nodename=n1", "state=RESUME"]


@pytest.mark.parametrize(("out", "job_id"), [("123\n", 123), ("124;cluster\n", 124), ("warn\n125\n", 125)])
def test_parse_sbatch_output(out: str, job_id: int) -> None:
    assert parse_sbatch_output(out) == job_id


def test_parse_sbatch_output_garbage() -> None:
    with pytest.raises(PermanentError):
        parse_sbatch_output("Submitted batch job\n")


def test_client_env_drops_inherited_job_variables() -> None:
    env = client_env({"PATH": "/bin", "SLURM_JOB_ID": "7", "SLURM_CONF": "/a"}, {"FOO": "1"}, "/b")
    assert env == {"PATH": "/bin", "FOO": "1", "SLURM_CONF": "/b"}


def test_client_env_keeps_the_daemons_secrets_out_of_submitted_jobs() -> None:
    base = {
        "PATH": "/bin",
        "AWS_SECRET_ACCESS_KEY": "s3cr3t",
        "AWS_ACCESS_KEY_ID": "AK",
        "BOTO_CONFIG": "/x",
        "SLURM_SUPERVISOR_CONFIG": "/etc/x.toml",
    }
    env = client_env(base, {"SLURM_SUPERVISOR_TOKEN": "run-token", "AWS_REGION": "from-the-run-spec"})
    assert env == {"PATH": "/bin", "SLURM_SUPERVISOR_TOKEN": "run-token", "AWS_REGION": "from-the-run-spec"}


# ---------------------------------------------------------------------------- formatted reads (issue 14)

from supervisor.adapters.slurm import squeue_format as fmt  # noqa: E402
from supervisor.adapters.slurm.json_parsers import ParseError  # noqa: E402
from supervisor.adapters.slurm.reads import SnapshotReader  # noqa: E402
from supervisor.adapters.slurm.release import parse_version  # noqa: E402

SEPS = fmt.Separators("\x1fF00D\x1f", "\x1eF00D\x1e")


def formatted(rows: list[dict[str, str]], fields: tuple[tuple[str, str], ...]) -> str:
    """Output the way squeue/sinfo -O print it with SEPS: field, separator, ..., record end, newline."""
    lines = [SEPS.field.join(row[key] for _, key in fields) + SEPS.record + "\n" for row in rows]
    return "".join(lines)


def job_row(**values: str) -> dict[str, str]:
    row = {
        "job_id": "7", "user_id": "1017", "job_state": "RUNNING", "state_reason": "None", "priority": "4294901759",
        "restart_cnt": "0", "exit_code": "0", "submit_time": "1796129386", "start_time": "1796129387",
        "end_time": "1827665387", "partition": "main", "nodes": "n[1-2]", "excluded_nodes": "", "name": "train",
        "comment": "(null)", "standard_output": "/tmp/out-%j.txt", "preempt_time": "N/A",
    }  # fmt: skip
    row.update(values)
    return row


def node_row(**values: str) -> dict[str, str]:
    row = {
        "name": "n1",
        "state": "idle",
        "partitions": "main",
        "address": "127.0.0.1",
        "port": "6818",
        "reason": "none",
    }
    row.update(values)
    return row


def test_format_asks_for_every_field_unpadded_with_the_separators():
    spec = SEPS.format(fmt.JOB_FIELDS)
    assert spec.startswith("JobID:0\x1fF00D\x1f,UserID:0") and spec.endswith("PreemptTime:0\x1eF00D\x1e")
    assert spec.count(",") == len(fmt.JOB_FIELDS) - 1  # no separator holds -O's comma
    fresh = fmt.Separators.fresh()
    assert fresh != fmt.Separators.fresh() and "," not in fresh.field + fresh.record


def test_formatted_jobs_read_like_the_json_ones():
    hostile = "a|b,c\n;d\te\x1fF00 \\ (null)"
    out = formatted(
        [
            job_row(),
            job_row(job_id="8", job_state="FAILED", exit_code="768", state_reason="NonZeroExitCode", nodes="n3"),
            job_row(job_id="9", job_state="PENDING", priority="0", state_reason="JobHeldUser", name=hostile,
                    comment=hostile, start_time="N/A", end_time="N/A", nodes=""),
            job_row(job_id="10", job_state="PENDING", priority="0", state_reason="launch failed requeued held"),
        ],
        fmt.JOB_FIELDS,
    )  # fmt: skip
    jobs = fmt.parse_jobs(out, SEPS)
    assert jobs[7].nodes == ("n1", "n2") and jobs[7].state is JobState.RUNNING and jobs[7].comment == ""
    assert jobs[7].start_time == 1796129387.0 and jobs[7].user_id == 1017 and not jobs[7].held
    assert jobs[8].exit_code == 3 and jobs[8].state is JobState.FAILED
    assert jobs[9].name == hostile and jobs[9].comment == hostile and jobs[9].hold is JobHold.USER
    assert jobs[9].start_time is None and jobs[9].nodes == ()
    assert jobs[10].hold is JobHold.LAUNCH_FAILED


@pytest.mark.parametrize(
    "out",
    [
        "7\x1fF00D\x1f1017\x1eF00D\x1e\n",  # too few fields
        formatted([job_row()], fmt.JOB_FIELDS) + "8\x1fF00D\x1f",  # cut short inside a record
        formatted([job_row(comment="x\x1fF00D\x1fy")], fmt.JOB_FIELDS),  # the separator inside a value
    ],
)
def test_a_formatted_answer_that_does_not_split_exactly_is_refused(out):
    with pytest.raises(ParseError):
        fmt.parse_jobs(out, SEPS)


def test_formatted_nodes_merge_partitions_and_unchanged_lines_are_not_rebuilt():
    parser = fmt.NodeParser()
    rows = [
        node_row(),
        node_row(partitions="gpu"),
        node_row(name="n2", state="idle+drain", reason="Prolog error"),
        node_row(name="n3", state="down+not_responding", reason="Not responding"),
    ]
    first = parser.parse(formatted(rows, fmt.NODE_FIELDS), SEPS)
    assert first["n1"].partitions == ("main", "gpu") and first["n1"].reason == "" and first["n1"].port == 6818
    assert first["n2"].drained and first["n2"].prolog_failed
    assert first["n3"].down and not first["n3"].responding
    rows[3] = node_row(name="n3", state="idle", reason="none")
    second = parser.parse(formatted(rows, fmt.NODE_FIELDS), SEPS)
    assert second["n2"] is first["n2"]  # the same line: the same value, not a new one
    assert second["n3"].idle and second["n3"] is not first["n3"]


def test_version_string():
    assert parse_version("slurm-wlm 22.05.8\n") == (22, 5)
    assert parse_version("slurm 24.05.2") == (24, 5)
    assert parse_version("garbage") is None


class ScriptedSlurm:
    """Answers each client by its argv (the runner the reader is given), and remembers the calls."""

    def __init__(self, version: str, json_jobs: list[dict]) -> None:
        self.version, self.json_jobs, self.calls = version, json_jobs, []

    def __call__(self, argv, *, extra_env=None):
        self.calls.append(list(argv))
        if argv[:2] == ["squeue", "--version"]:
            return self.version
        if argv[0] == "squeue" and any(a.startswith("--json") for a in argv):
            return json.dumps({"meta": {}, "errors": [], "jobs": self.json_jobs})
        if argv[0] == "sinfo" and any(a.startswith("--json") for a in argv):
            return json.dumps({"meta": {}, "errors": [], "sinfo": []})
        if argv[0] == "squeue":
            assert extra_env == fmt.TIME_FORMAT_ENV
            seps = fmt.Separators(*_separators(argv[-1]))
            return (
                formatted([job_row()], fmt.JOB_FIELDS).replace(SEPS.field, seps.field).replace(SEPS.record, seps.record)
            )
        seps = fmt.Separators(*_separators(argv[-1]))
        return (
            formatted([node_row()], fmt.NODE_FIELDS).replace(SEPS.field, seps.field).replace(SEPS.record, seps.record)
        )


def _separators(format_arg: str) -> tuple[str, str]:
    spec = format_arg.split("=", 1)[1]
    first = spec.split(",")[0]
    return first[first.index(":0") + 2 :], spec[spec.rindex(":0") + 2 :]


def json_job(job_id: int, user: str) -> dict:
    return {"job_id": job_id, "user_name": user, "job_state": "RUNNING", "nodes": "n1"}


def test_reader_without_a_user_reads_everything_as_json():
    slurm = ScriptedSlurm("slurm-wlm 22.05.8", [json_job(1, "alice"), json_job(2, "bob")])
    assert set(SnapshotReader(slurm, None).jobs()) == {1, 2}
    assert slurm.calls == [["squeue", "--version"], ["squeue", "--all", "--local", "--json", "--states=all"]]


def test_reader_for_a_user_on_2205_reads_formatted_and_filtered():
    slurm = ScriptedSlurm("slurm-wlm 22.05.8", [json_job(1, "alice"), json_job(2, "bob")])
    reader = SnapshotReader(slurm, "alice")
    assert set(reader.jobs()) == {7}
    assert set(reader.nodes(frozenset({"n1", "n2", "n3"}))) == {"n1"}
    assert reader.nodes(frozenset()) == {} and reader.nodes(False) == {}
    squeue, sinfo = slurm.calls[1], slurm.calls[2]
    assert "--user=alice" in squeue and "--states=all" in squeue and "--json" not in squeue
    assert "--nodes=n[1-3]" in sinfo and "--json" not in sinfo
    reader.jobs()
    assert sum(c == ["squeue", "--version"] for c in slurm.calls) == 1  # asked once


def test_reader_uses_filtered_json_where_slurm_honours_it_and_falls_back_when_it_does_not():
    honest = ScriptedSlurm("slurm 24.05.2", [json_job(1, "alice")])
    assert set(SnapshotReader(honest, "alice").jobs()) == {1}
    assert honest.calls[1] == ["squeue", "--all", "--local", "--json", "--states=all", "--user=alice"]
    liar = ScriptedSlurm("slurm 24.05.2", [json_job(1, "alice"), json_job(2, "bob")])
    reader = SnapshotReader(liar, "alice")
    assert set(reader.jobs()) == {7}  # bob's job seen: the formatted read, and from now on only it
    reader.jobs()
    assert sum("--json" in c for c in liar.calls) == 1


def test_from_24_11_the_json_reads_pin_one_data_parser():
    """v0.0.42 is in 24.11, 25.05, 25.11 and 26.05: one layout across them (docs/slurm-releases.md)."""
    slurm = ScriptedSlurm("slurm 24.11.5", [json_job(1, "alice")])
    reader = SnapshotReader(slurm, "alice")
    reader.jobs()
    reader.nodes(True)
    assert "--json=v0.0.42" in slurm.calls[1] and "--json=v0.0.42" in slurm.calls[2]
    older = ScriptedSlurm("slurm 24.05.2", [json_job(1, "alice")])
    SnapshotReader(older, "alice").jobs()
    assert "--json" in older.calls[1]


def test_a_slurm_without_the_pinned_data_parser_is_read_with_its_default_from_then_on():
    class Dropped(ScriptedSlurm):
        def __call__(self, argv, *, extra_env=None):
            if "--json=v0.0.42" in argv:
                self.calls.append(list(argv))
                raise PermanentError("squeue exited 1: unable to find plugin: data_parser/v0.0.42")
            return super().__call__(argv, extra_env=extra_env)

    slurm = Dropped("slurm 27.11.1", [json_job(1, "alice")])
    reader = SnapshotReader(slurm, "alice")
    assert set(reader.jobs()) == {1}
    assert set(reader.jobs()) == {1}
    assert [c for c in slurm.calls if "--json=v0.0.42" in c] == [slurm.calls[1]]  # asked once


def test_the_whole_table_is_read_grouped_and_known_addresses_are_kept():
    from supervisor.engine.facts.observe import with_addresses

    rows = [{"name": "x[1-3]", "state": "down+not_responding", "partitions": "main", "reason": "gone"}]
    rows.append({"name": "n1", "state": "idle", "partitions": "main", "reason": "none"})
    out = formatted(rows, fmt.GROUP_FIELDS)
    nodes = fmt.NodeParser().parse(out, SEPS, grouped=True)
    assert set(nodes) == {"x1", "x2", "x3", "n1"} and nodes["x2"].down and nodes["x2"].reason == "gone"
    assert nodes["n1"].address == "" and nodes["n1"].port is None
    before = fmt.NodeParser().parse(formatted([node_row()], fmt.NODE_FIELDS), SEPS)
    merged = with_addresses(nodes, before)
    assert merged["n1"].address == "127.0.0.1" and merged["n1"].port == 6818 and merged["x1"] is nodes["x1"]
    assert fmt.sinfo_argv(None, SEPS)[:3] == ["sinfo", "--noheader", "--all"] and "--Node" not in fmt.sinfo_argv(
        None, SEPS
    )


def test_a_grouped_read_with_addresses_but_no_port_keeps_the_port_of_the_focused_read():
    """24.11/26.05 JSON of a group names every address but no port (one port for many nodes): the
    port read for the node on its own last time is kept, so the probe does not fall back to 6818."""
    from supervisor.engine.facts.observe import with_addresses

    grouped = {"n1": NodeInfo("n1", NodeState.IDLE, address="10.0.0.1", port=None)}
    before = {"n1": NodeInfo("n1", NodeState.ALLOCATED, address="10.0.0.1", port=20117)}
    merged = with_addresses(grouped, before)
    assert merged["n1"].port == 20117 and merged["n1"].state is NodeState.IDLE
    moved = {"n1": NodeInfo("n1", NodeState.IDLE, address="10.0.0.9", port=None)}
    assert with_addresses(moved, before)["n1"].port is None  # another host: its port is not known
