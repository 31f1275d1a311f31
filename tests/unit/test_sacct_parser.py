"""The sacct adapter: its argv, its parser against a capture from a real Slurm 22.05.8 with
slurmdbd (tests/data/slurm/sacct_2205.txt, capture_sacct.py), and its runner against small
fake ``sacct`` executables (real subprocesses, nothing patched)."""

from __future__ import annotations

import json
import stat
from pathlib import Path

import pytest

from supervisor.adapters.slurm.json_parsers import ParseError
from supervisor.adapters.slurm.sacct import FIELDS, SacctCli, parse_record, parse_sacct, sacct_argv
from supervisor.domain.cluster import JobState
from supervisor.ports import PermanentError, TransientError

DATA = Path(__file__).resolve().parents[1] / "data" / "slurm"
CAPTURE = DATA / "sacct_2205.txt"


def by_name():
    return {job.name: job for job in parse_sacct(CAPTURE.read_text()).values()}


def test_argv_asks_once_for_every_job_and_its_incarnations():
    argv = sacct_argv([12, 7, 12])
    assert argv[0] == "sacct" and "--jobs=7,12" in argv
    for option in ("--allocations", "--duplicates", "--parsable2", "--noheader"):
        assert option in argv
    assert f"--format={','.join(FIELDS)}" in argv and FIELDS[-1] == "Comment"


def test_outcomes_from_the_capture():
    jobs = by_name()
    done, failed, killed = jobs["completed"], jobs["failed_exit3"], jobs["killed_sig9"]
    assert (done.state, done.exit_code, done.term_signal) == (JobState.COMPLETED, 0, None)
    assert (failed.state, failed.exit_code, failed.term_signal) == (JobState.FAILED, 3, None)
    assert (killed.state, killed.exit_code, killed.term_signal) == (JobState.FAILED, None, 9)
    assert jobs["cancelled_running"].state is JobState.CANCELLED  # "CANCELLED by 0"
    node_fail = jobs["node_fail"]
    assert node_fail.state is JobState.NODE_FAIL and node_fail.nodes == ("n2", "n3")
    for job in (done, failed, killed, node_fail):
        assert job.start_time is not None and job.end_time is not None and job.end_time >= job.start_time
        assert job.partition == "main" and job.user_id == 0 and job.restart_count == 0


def test_a_requeued_job_is_its_last_incarnation_with_its_restart_count():
    job = by_name()["requeued_then_completed"]
    assert job.state is JobState.COMPLETED and job.restart_count == 1
    assert job.nodes == ("n4",)  # the second incarnation's node (the first ran on n1)


def test_a_job_cancelled_while_pending_never_started():
    job = by_name()["cancelled_pending"]
    assert job.state is JobState.CANCELLED and job.nodes == () and job.start_time is None
    assert job.state_reason == "JobHeldUser"


def test_a_running_job_has_no_end_and_no_exit_code():
    job = by_name()["running"]
    assert job.state is JobState.RUNNING and job.end_time is None and job.exit_code is None


def test_why_the_adapter_does_not_read_sacct_json_in_2205():
    doc = json.loads((DATA / "sacct_2205.json").read_text())
    failed = next(j for j in doc["jobs"] if j["name"] == "failed_exit3")
    assert failed["state"]["current"] == "FAILED" and failed["exit_code"]["return_code"] == 0  # it exited 3
    assert by_name()["failed_exit3"].exit_code == 3


def test_a_comment_may_hold_the_separator():
    line = "5|train|COMPLETED|0:0|None|n1|main|100|110|120|1000|slurm-supervisor:llm:ab|c:3"
    assert parse_record(line).comment == "slurm-supervisor:llm:ab|c:3"


@pytest.mark.parametrize(
    "line",
    [
        "5|train|COMPLETED|0:0",  # fields missing
        "x|train|COMPLETED|0:0|None|n1|main|100|110|120|1000|",  # no job id
        "5|train|COMPLETED|0:0|None|n1|main|2026-12-01T09:56:36|110|120|1000|",  # SLURM_TIME_FORMAT not applied
    ],
)
def test_unexpected_lines_are_parse_errors(line):
    with pytest.raises(ParseError):
        parse_record(line)


DELIMITER = 'for a in "$@"; do case "$a" in --delimiter=*) d="${a#--delimiter=}";; esac; done\n'


def test_a_pipe_in_a_job_name_does_not_shift_the_fields(tmp_path):
    """Issue 32, finding 13: a job that renames itself ``x|CANCELLED by 0|0:0`` read, with sacct's
    default ``|``, as CANCELLED by root with exit 0; the separator is random per call now."""
    fields = ["5", "x|CANCELLED by 0|0:0", "FAILED", "3:0", "None", "n[1-2]", "gpu", "100", "110", "120", "1000", "tag"]
    printf = " ".join(f'"{f}"' for f in fields)
    sacct = fake_sacct(tmp_path, DELIMITER + f'printf \'%s\'"$d" {printf} | sed "s/$d\\$//"; echo')
    job = sacct.job_records([5])[5]
    assert (job.state, job.exit_code, job.nodes, job.name) == (JobState.FAILED, 3, ("n1", "n2"), fields[1])


def fake_sacct(tmp_path: Path, body: str) -> SacctCli:
    path = tmp_path / "sacct"
    path.write_text("#!/bin/sh\n" + body + "\n")
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return SacctCli(bin_dir=str(tmp_path))


def test_runner_passes_epoch_times_and_keeps_only_the_jobs_asked_for(tmp_path):
    sacct = fake_sacct(tmp_path, f'[ "$SLURM_TIME_FORMAT" = "%s" ] || exit 9\n{DELIMITER}sed "s/|/$d/g" {CAPTURE}')
    found = sacct.job_records([1, 2, 999])
    assert sorted(found) == [1, 2] and found[2].exit_code == 3
    assert sacct.job_records([]) == {}


def test_runner_maps_sacct_failures(tmp_path):
    down = fake_sacct(tmp_path, "echo 'sacct: error: Problem talking to the database: Connection refused' >&2; exit 1")
    with pytest.raises(TransientError):
        down.job_records([1])
    none = fake_sacct(tmp_path, "echo 'Slurm accounting storage is disabled' >&2; exit 1")
    with pytest.raises(PermanentError, match="no job accounting"):
        none.job_records([1])
    garbled = fake_sacct(tmp_path, "echo 'not|sacct'")
    with pytest.raises(PermanentError, match="unexpected sacct output"):
        garbled.job_records([1])


@pytest.mark.parametrize(
    ("scontrol", "reads_sacct"),
    [
        ("echo 'AccountingStorageType   = accounting_storage/slurmdbd'", True),
        ("echo 'AccountingStorageType   = accounting_storage/none'", False),
        ("echo 'slurm_load_ctl_conf error: Unable to contact slurm controller' >&2; exit 1", True),
    ],
)
def test_the_daemon_reads_sacct_where_the_cluster_keeps_accounting(tmp_path, scontrol, reads_sacct):
    from supervisor.adapters.slurm.cli import SlurmCli
    from supervisor.cli.wiring import accounting

    fake_sacct(tmp_path, "true")
    path = tmp_path / "scontrol"
    path.write_text("#!/bin/sh\n" + scontrol + "\n")
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    found = accounting(SlurmCli(bin_dir=str(tmp_path), timeout=5.0))
    assert isinstance(found, SacctCli) is reads_sacct  # unknown (controller down at start): sacct says later
    if found is not None:
        assert found.bin_dir == str(tmp_path) and found.env["SLURM_TIME_FORMAT"] == "%s"
