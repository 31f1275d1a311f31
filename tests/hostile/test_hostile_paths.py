"""Files the daemon opens for a run (the job's output, the resume file) cannot be turned against
it: a FIFO blocks nothing, a secret of the daemon's is neither shown nor overwritten, links are not
followed, and the output followed is the one Slurm reports (issue 17, item 4; review findings #5
and #7). Each attack here failed on the old code."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest
import structlog

from supervisor.adapters.checkpoints.resume_file import write_resume_file
from supervisor.adapters.logtail import LogTail
from supervisor.adapters.run_files import RunFileRefused
from supervisor.adapters.sqlite import SqliteStore
from supervisor.cli import wiring
from supervisor.config import ConfigError, load_daemon_config, load_run_file
from supervisor.domain.cluster import ClusterSnapshot, JobInfo, JobState
from supervisor.domain.progress.hang import HangSettings
from supervisor.domain.run import RunSpec
from supervisor.engine.watch.progress import ProgressWatch
from supervisor.testing.kit.logs import MemoryLogs

SECRET = "HOOK-TOKEN-do-not-show"


def daemon_config(tmp_path: Path):
    state = tmp_path / "state"
    state.mkdir(exist_ok=True)
    (state / "supervisor.db").write_bytes(b"SQLite format 3\0")
    (state / "hook.token").write_text(SECRET + "\n")
    conf = tmp_path / "supervisor.toml"
    conf.write_text(f'[daemon]\nstate_dir = "{state}"\n')
    return load_daemon_config(conf), state


def read_in_thread(tail: LogTail, seconds: float = 5.0) -> list[object]:
    result: list[object] = []

    def read() -> None:
        try:
            result.append(tail.read_lines())
        except OSError as exc:
            result.append(exc)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    reader.join(seconds)
    return result


# ------------------------------------------------------------------ the job's output


def test_a_fifo_at_the_output_path_blocks_nothing(tmp_path):
    fifo = tmp_path / "out.log"
    os.mkfifo(fifo)
    result = read_in_thread(LogTail(fifo))
    if not result:  # let the blocked reader go before failing
        os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
    assert result, "reading a FIFO as the job's output blocked the caller"
    assert isinstance(result[0], OSError) and "not a regular file" in str(result[0])


def test_an_output_that_is_a_link_is_not_followed(tmp_path):
    secret = tmp_path / "secret"
    secret.write_text(SECRET + "\n")
    (tmp_path / "out.log").symlink_to(secret)
    with pytest.raises(OSError, match="link"):
        LogTail(tmp_path / "out.log").read_lines()


def attempt_running(store: SqliteStore, spec: RunSpec, job_id: int, now: float) -> None:
    store.add_run(spec, now)
    attempt = store.add_attempt(spec.name, job_id, 0, now, ())
    store.attempt_started(spec.name, attempt.seq, ("n1",), now)


def hang_evidence(watch: ProgressWatch, store: SqliteStore, spec: RunSpec, job: JobInfo) -> dict:
    run = store.get_run(spec.name)
    assert run is not None
    snap = ClusterSnapshot(1000.0, {job.job_id: job})
    watch.update([run], snap, 1000.0)
    return watch.update([run], snap, 1000.0 + 4000)[spec.name]


def test_an_output_pointed_at_the_daemons_secret_is_not_shown_as_evidence(tmp_path):
    cfg, state = daemon_config(tmp_path)
    spec = RunSpec(name="r1", script="/w/t.sh", partition="p", nodes=1, workdir="/w", output=str(state / "hook.token"))
    store = SqliteStore(tmp_path / "store")
    attempt_running(store, spec, 7, 1000.0)
    watch = wiring.progress(cfg)
    assert watch is not None
    evidence = hang_evidence(watch, store, spec, JobInfo(7, "r1", JobState.RUNNING, nodes=("n1",)))
    assert SECRET not in repr(evidence)


def test_the_output_followed_is_the_one_slurm_reports(tmp_path):
    spec = RunSpec(name="r1", script="/w/t.sh", partition="p", nodes=1, workdir="/w", output="/logs/spec-%j.out")
    store = SqliteStore(tmp_path / "store")
    attempt_running(store, spec, 7, 1000.0)
    logs = MemoryLogs()
    watch = ProgressWatch(logs, HangSettings(startup_grace_s=60, floor_s=60, cap_s=600))
    job = JobInfo(7, "r1", JobState.RUNNING, nodes=("n1",), stdout="/elsewhere/%x-%j.out")
    evidence = hang_evidence(watch, store, spec, job)
    assert evidence["log"] == "/elsewhere/r1-7.out"


def test_an_output_inside_the_daemons_folders_is_refused_at_load(tmp_path):
    (tmp_path / "t.sh").write_text("#!/bin/sh\nsrun true\n")
    spec = tmp_path / "run.toml"
    state = tmp_path / "state"
    state.mkdir()
    body = f'[run]\nname = "r1"\nscript = "t.sh"\npartition = "p"\nnodes = 1\noutput = "{state}/hook.token"\n'
    spec.write_text(body)
    with pytest.raises(ConfigError, match="supervisor's own folder"):
        load_run_file(spec, daemon_dirs=[str(state)])


# ------------------------------------------------------------------ the resume file


def test_a_resume_file_naming_the_daemons_database_is_refused_at_load(tmp_path):
    (tmp_path / "t.sh").write_text("#!/bin/sh\nsrun true\n")
    spec = tmp_path / "run.toml"
    body = (
        '[run]\nname = "r1"\nscript = "t.sh"\npartition = "p"\nnodes = 1\n'
        '[checkpoints]\nroot = "s3://b/p/"\nresume_file = "/var/lib/slurm-supervisor/supervisor.db"\n'
    )
    spec.write_text(body)
    with pytest.raises(ConfigError, match="supervisor's own folder"):
        load_run_file(spec)


def test_a_resume_file_naming_the_daemons_database_is_not_written(tmp_path):
    cfg, state = daemon_config(tmp_path)
    before = (state / "supervisor.db").read_bytes()
    with pytest.raises(OSError, match="supervisor's own folder"):
        write_resume_file(str(state / "supervisor.db"), '{"run": "alice"}', protected=wiring.daemon_dirs(cfg))
    (tmp_path / "link").symlink_to(state)  # nor through a linked folder
    with pytest.raises(OSError, match="supervisor's own folder"):
        write_resume_file(str(tmp_path / "link" / "supervisor.db"), "{}", protected=wiring.daemon_dirs(cfg))
    assert (state / "supervisor.db").read_bytes() == before


def test_a_resume_file_that_is_not_a_regular_file_is_not_replaced(tmp_path):
    os.mkfifo(tmp_path / "resume.json")
    with pytest.raises(OSError, match="not a regular file"):
        write_resume_file(str(tmp_path / "resume.json"), "{}")
    (tmp_path / "other").write_text("keep")
    (tmp_path / "linked.json").symlink_to(tmp_path / "other")
    with pytest.raises(OSError, match="not a regular file"):
        write_resume_file(str(tmp_path / "linked.json"), "{}")
    assert (tmp_path / "other").read_text() == "keep"


def test_a_resume_file_is_still_written_where_it_may_be(tmp_path):
    write_resume_file(str(tmp_path / "resume.json"), '{"run": "r1"}')
    write_resume_file(str(tmp_path / "resume.json"), '{"run": "r2"}')
    assert (tmp_path / "resume.json").read_text() == '{"run": "r2"}'
    assert [p.name for p in tmp_path.iterdir()] == ["resume.json"]
    assert (tmp_path / "resume.json").stat().st_mode & 0o777 == 0o644


def test_the_daemons_folders_include_its_state_and_secrets(tmp_path):
    cfg, state = daemon_config(tmp_path)
    dirs = wiring.daemon_dirs(cfg)
    assert str(state) in dirs and "/etc/slurm-supervisor" in dirs and "/var/lib/slurm-supervisor" in dirs


def test_a_refused_output_is_logged_once_and_blocks_no_tick(tmp_path):
    os.mkfifo(tmp_path / "out.log")
    spec = RunSpec(name="r1", script="/w/t.sh", partition="p", nodes=1, workdir="/w", output=str(tmp_path / "out.log"))
    store = SqliteStore(tmp_path / "store")
    attempt_running(store, spec, 7, 1000.0)
    watch = ProgressWatch(lambda path, at_end: LogTail(path, start_at_end=at_end), HangSettings())
    run = store.get_run("r1")
    snap = ClusterSnapshot(1000.0, {7: JobInfo(7, "r1", JobState.RUNNING, nodes=("n1",))})
    with structlog.testing.capture_logs() as logs:
        for tick in range(5):
            watch.update([run], snap, 1000.0 + tick)
    assert [e["event"] for e in logs].count("progress_unreadable") == 1


def test_the_read_token_the_tls_key_and_the_store_password_are_the_daemons_too(tmp_path):
    """Issue 32 (the review's smaller points): a run's output or resume file may not name the read
    token, the TLS key or the store's password file where they live outside /etc/slurm-supervisor
    (the daemon, as the account, would write the job's output over them, or follow them)."""
    secrets = tmp_path / "secrets"
    secrets.mkdir()
    names = ("read.token", "tls.key", "tls.crt", "store.pass")
    for name in names:
        (secrets / name).write_text(SECRET + "\n")
        (secrets / name).chmod(0o600)
    state = tmp_path / "state"
    state.mkdir()
    conf = tmp_path / "supervisor.toml"
    conf.write_text(
        f'[daemon]\nstate_dir = "{state}"\n[ingest]\nread_token_file = "{secrets}/read.token"\n'
        f'tls_cert_file = "{secrets}/tls.crt"\ntls_key_file = "{secrets}/tls.key"\n'
        f'[store]\nurl = "postgresql://db/ssv"\npassword_file = "{secrets}/store.pass"\n'
    )
    dirs = wiring.daemon_dirs(load_daemon_config(conf))
    for name in ("read.token", "tls.key", "store.pass"):
        assert str(secrets / name) in dirs, name
    with pytest.raises(RunFileRefused):
        write_resume_file(str(secrets / "tls.key"), "{}", protected=dirs)
