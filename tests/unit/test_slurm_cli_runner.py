"""SlurmCli's runner against small fake client executables: real subprocesses, nothing patched,
no Slurm needed."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest

from supervisor.adapters.slurm.cli import SlurmCli, sbatch_argv
from supervisor.domain.cluster import SubmitRequest
from supervisor.ports import PermanentError, PermissionDenied, TransientError

DATA = Path(__file__).resolve().parents[1] / "data" / "slurm"


def _request(**overrides: object) -> SubmitRequest:
    fields: dict = dict(run="r1", script="/srv/run.sh", job_name="train", partition="gpu", nodes=4, comment="sup:r1:i7")
    fields.update(overrides)
    return SubmitRequest(**fields)


def fake_bin(tmp_path: Path, name: str, body: str) -> None:
    path = tmp_path / name
    path.write_text("#!/bin/sh\n" + body + "\n")
    path.chmod(path.stat().st_mode | stat.S_IXUSR)


def test_snapshot_from_fake_clients(tmp_path: Path) -> None:
    fake_bin(tmp_path, "squeue", f"cat {DATA / 'squeue_2205_mixed.json'}")
    fake_bin(tmp_path, "sinfo", f"cat {DATA / 'sinfo_2205_down_drain.json'}")
    snap = SlurmCli(bin_dir=str(tmp_path)).snapshot()
    assert len(snap.jobs) == 9 and set(snap.nodes) == {"n1", "n2", "n3", "n4"}
    assert snap.taken_at > 0
    assert [j.name for j in snap.jobs_with_comment("run=r1,intent=7 tag:x")] == ["running"]


def test_snapshot_controller_down_document_is_transient(tmp_path: Path) -> None:
    fake_bin(tmp_path, "squeue", f"cat {DATA / 'squeue_2205_controller_down.json'}")
    fake_bin(tmp_path, "sinfo", f"cat {DATA / 'sinfo_2205_down_drain.json'}")
    with pytest.raises(TransientError, match="squeue"):
        SlurmCli(bin_dir=str(tmp_path)).snapshot()


def test_snapshot_bad_json_is_transient_and_timeout_is_transient(tmp_path: Path) -> None:
    fake_bin(tmp_path, "squeue", "echo '{\"jobs\": ['")
    with pytest.raises(TransientError, match="JSON"):
        SlurmCli(bin_dir=str(tmp_path)).snapshot()
    fake_bin(tmp_path, "squeue", "exec sleep 30")
    with pytest.raises(TransientError, match="timed out"):
        SlurmCli(bin_dir=str(tmp_path), timeout=0.3).snapshot()


def test_missing_binary_is_permanent(tmp_path: Path) -> None:
    with pytest.raises(PermanentError, match="cannot run"):
        SlurmCli(bin_dir=str(tmp_path)).hold(1)


def test_submit_passes_env_to_the_job_through_an_export_file(tmp_path: Path) -> None:
    record = tmp_path / "record"
    body = (
        f'printf "%s\\n" "$@" > {record}.argv; env > {record}.env; '
        f'for a in "$@"; do case "$a" in --export-file=*) cat /dev/fd/"${{a#--export-file=}}" > {record}.job;; esac; done; '
        'echo "77;c"'
    )
    fake_bin(tmp_path, "sbatch", body)
    cli = SlurmCli(bin_dir=str(tmp_path), slurm_conf="/etc/x/slurm.conf", env={"BASE": "b", "FOO": "daemon's"})
    job_id = cli.submit(_request(env={"FOO": "a,b c", "QUOTE": 'it\'s "x"'}))
    assert job_id == 77
    argv = Path(f"{record}.argv").read_text().splitlines()
    fd = next(a for a in argv if a.startswith("--export-file=")).split("=", 1)[1]
    assert argv == sbatch_argv(_request(), export_file=fd)[1:]
    job = Path(f"{record}.job").read_bytes().split(b"\0")
    assert {b"FOO=a,b c", b'QUOTE=it\'s "x"'} <= set(job) and b"FOO=daemon's" not in job  # the run's win
    assert b"BASE=b" in job and b"SLURM_CONF=/etc/x/slurm.conf" in job  # what --export=ALL would have given
    env = Path(f"{record}.env").read_text().splitlines()
    assert {"BASE=b", "SLURM_CONF=/etc/x/slurm.conf"} <= set(env)
    assert not any(line.startswith(("FOO=", "QUOTE=")) for line in env)  # the job's, not sbatch's


def test_cancel_of_ended_job_is_not_an_error(tmp_path: Path) -> None:
    fake_bin(
        tmp_path,
        "scancel",
        "echo 'scancel: error: Kill job error on job id 5: Job/step already completing or completed' >&2; exit 1",
    )
    SlurmCli(bin_dir=str(tmp_path)).cancel(5)
    fake_bin(
        tmp_path, "scancel", "echo 'scancel: error: Kill job error on job id 5: Access/permission denied' >&2; exit 1"
    )
    with pytest.raises(PermissionDenied):
        SlurmCli(bin_dir=str(tmp_path)).cancel(5)
