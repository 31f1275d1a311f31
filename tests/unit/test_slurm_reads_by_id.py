"""Jobs read by id (issue 14), the cheapest way that holds them (measured: bench/README.md): from the
account's list when slurmctld filters it (one call), else one ``squeue --jobs=ID`` per job — 22.05
sends REQUEST_JOB_INFO_SINGLE for a single id and loads every job in the cluster for two or more;
a job Slurm no longer knows is absent, not an error."""

from __future__ import annotations

import threading

import pytest

from supervisor.adapters.slurm import squeue_format as fmt
from supervisor.adapters.slurm.reads import LARGE_ACCOUNT, SnapshotReader, squeue_by_id_argv
from supervisor.ports import PermanentError, TransientError


def _separators(format_arg: str) -> fmt.Separators:
    spec = format_arg.split("=", 1)[1]
    first = spec.split(",")[0]
    return fmt.Separators(first[first.index(":0") + 2 :], spec[spec.rindex(":0") + 2 :])


def job_line(job_id: int, seps: fmt.Separators, comment: str = "(null)") -> str:
    values = {key: "" for _, key in fmt.JOB_FIELDS}
    values.update(job_id=str(job_id), user_id="1017", job_state="RUNNING", state_reason="None", priority="1")
    values.update(restart_cnt="0", exit_code="0", submit_time="1796129386", start_time="1796129387")
    values.update(end_time="N/A", partition="main", nodes="n1", name="train", comment=comment)
    return seps.field.join(values[key] for _, key in fmt.JOB_FIELDS) + seps.record + "\n"


class SlurmById:
    """squeue as 22.05 answers it: a known id prints its job; an unknown one exits 1."""

    def __init__(self, known: set[int], failing: int | None = None) -> None:
        self.known, self.failing = known, failing
        self.calls: list[list[str]] = []
        self._lock = threading.Lock()

    def __call__(self, argv, *, extra_env=None):
        with self._lock:
            self.calls.append(list(argv))
        if argv[:2] == ["squeue", "--version"]:
            return "slurm-wlm 22.05.8"
        assert extra_env == fmt.TIME_FORMAT_ENV
        if any(a.startswith("--user=") for a in argv):
            return "".join(job_line(j, _separators(argv[-1])) for j in sorted(self.known))
        job_id = int(next(a for a in argv if a.startswith("--jobs=")).split("=", 1)[1])
        if job_id == self.failing:
            raise TransientError("squeue exited 1: slurm_load_jobs error: Socket timed out on send/recv operation")
        if job_id not in self.known:
            raise PermanentError("squeue exited 1: slurm_load_jobs error: Invalid job id specified")
        return job_line(job_id, _separators(argv[-1]))


def test_without_a_cheap_account_list_one_read_per_id_each_a_single_job_id():
    """Root's list is every job (slurmctld does not filter --user=root); no user: every job too."""
    slurm = SlurmById({11, 12, 13})
    jobs = SnapshotReader(slurm, "root").jobs(frozenset({11, 12, 13}))
    assert set(jobs) == {11, 12, 13} and jobs[12].nodes == ("n1",)
    asked = sorted(a for c in slurm.calls for a in c if a.startswith("--jobs="))
    reads = [c for c in slurm.calls if c != ["squeue", "--version"]]
    assert asked == ["--jobs=11", "--jobs=12", "--jobs=13"] and len(reads) == 3
    assert all("--user=root" not in c and "--json" not in c for c in slurm.calls)
    assert set(SnapshotReader(SlurmById({11, 12}), None).jobs(frozenset({11, 12}))) == {11, 12}


def test_several_jobs_of_an_account_come_from_its_one_filtered_list():
    slurm = SlurmById({11, 12, 13, 14})
    jobs = SnapshotReader(slurm, "alice").jobs(frozenset({11, 12, 99}))
    assert set(jobs) == {11, 12}  # the named ones Slurm holds, not the account's others
    reads = [c for c in slurm.calls if "--version" not in c]
    assert len(reads) == 1 and "--user=alice" in reads[0]


def test_one_job_or_a_large_account_is_read_by_id():
    slurm = SlurmById({11})
    assert set(SnapshotReader(slurm, "alice").jobs(frozenset({11}))) == {11}
    assert any(a == "--jobs=11" for a in slurm.calls[-1])
    large = SlurmById(set(range(1, LARGE_ACCOUNT + 2)))
    reader = SnapshotReader(large, "alice")
    assert len(reader.jobs()) == LARGE_ACCOUNT + 1  # its list: more jobs than it is worth packing
    reader.jobs(frozenset({1, 2}))
    # the reads by id run in threads: in either order
    assert sorted(a for c in large.calls[-2:] for a in c if a.startswith("--jobs=")) == ["--jobs=1", "--jobs=2"]


def test_a_job_slurm_no_longer_knows_is_absent():
    """Purged after MinJobAge: accounting answers for it (engine/facts/forgotten.py)."""
    assert set(SnapshotReader(SlurmById({11}), "root").jobs(frozenset({11, 99}))) == {11}
    assert set(SnapshotReader(SlurmById({11}), "alice").jobs(frozenset({11, 99}))) == {11}


def test_a_controller_that_does_not_answer_is_still_an_error():
    with pytest.raises(TransientError):
        SnapshotReader(SlurmById({11, 12}, failing=12), "root").jobs(frozenset({11, 12}))


def test_no_ids_no_call_and_none_is_the_accounts_list():
    slurm = SlurmById({5})
    assert SnapshotReader(slurm, "alice").jobs(frozenset()) == {}
    assert slurm.calls == []
    assert set(SnapshotReader(slurm, "alice").jobs(None)) == {5}


def test_the_argv_asks_for_every_state_and_hidden_partitions():
    argv = squeue_by_id_argv(42, fmt.Separators("\x1fA\x1f", "\x1eA\x1e"))
    assert argv[:6] == ["squeue", "--noheader", "--all", "--local", "--states=all", "--jobs=42"]
    assert argv[-1].startswith("--Format=JobID:0")
