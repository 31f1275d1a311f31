"""`slurm-supervisor doctor` on the real Slurm of each release in the matrix: every read the daemon
makes works there, and a job read by id keeps its exit code (docs/slurm-releases.md)."""

from __future__ import annotations

import json
import time

import pytest

from supervisor.testing.slurm.daemon import SupervisorProcess

pytestmark = pytest.mark.slurm


def test_doctor_finds_every_read_working_on_this_release(slurm_cluster, tmp_path):
    done = slurm_cluster.run(["sbatch", "--parsable", "-N1", "--wrap", "exit 3"], check=True)
    job_id = int(done.stdout.strip().split(";")[0])
    sup = SupervisorProcess(slurm_cluster, tmp_path)  # its config; no daemon started
    deadline = time.monotonic() + 30
    while "FAILED" not in slurm_cluster.run(["squeue", "-h", "-t", "all", "-j", str(job_id), "-o", "%T"]).stdout:
        assert time.monotonic() < deadline, "the job did not fail"
        time.sleep(0.2)
    out = sup.cli("doctor", "--json")
    checks = {c["check"]: c for c in map(json.loads, out.stdout.splitlines())}
    assert {c["status"] for c in checks.values()} == {"ok"}, checks
    assert checks["release"]["detail"].startswith("Slurm "), checks
    assert checks["a job by id"]["detail"] == f"job {job_id}: FAILED, exit code 3, signal None", checks
    assert "node addresses" in checks, checks
