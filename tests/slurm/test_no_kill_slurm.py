"""What Slurm 22.05 does to a ``--no-kill`` job when one of its nodes dies: the facts in-allocation
recovery relies on (docs/in-allocation.md), measured on the harness's real Slurm.

* The job stays RUNNING; the dead node leaves its NodeList (NumNodes shrinks) as soon as the
  node is DOWN — at once when the supervisor sets it DOWN, else after SlurmdTimeout.
* The step that ran on it is force-terminated (srun: "Node failure on n2").
* A new step starts in the same job on the survivor and the spare (``--nodelist``), and an agent
  step with ``--overlap`` beside it.
* The batch host's death does not end the job either: it stays RUNNING on the other nodes with
  no batch script left (BatchHost still names the dead node) — the supervisor must fall back.
"""

from __future__ import annotations

import time

import pytest

from supervisor.testing import LocalSlurm

pytestmark = pytest.mark.slurm


def _job(cluster: LocalSlurm, job_id: int) -> dict[str, str]:
    out = cluster.run(["scontrol", "show", "job", str(job_id)], check=True).stdout
    return dict(word.split("=", 1) for word in out.split() if "=" in word)


def _submit(cluster: LocalSlurm, body: str, nodes: str) -> int:
    script = cluster.root / f"nokill-{time.monotonic_ns()}.sh"
    script.write_text(f"#!/bin/bash\n{body}\nsleep 600\n")
    argv = ["sbatch", "--parsable", "--no-kill", f"-N{nodes.count(',') + 1}", "-w", nodes, "-o", "/dev/null"]
    job_id = int(cluster.run([*argv, str(script)], check=True).stdout.strip())
    cluster.wait_for(lambda: _job(cluster, job_id)["JobState"] == "RUNNING", 15.0, message="job running")
    return job_id


def _steps(cluster: LocalSlurm, job_id: int) -> list[str]:
    out = cluster.run(["squeue", "-h", "-s", "-j", str(job_id), "-o", "%i %N"], check=True).stdout
    return out.split("\n")[:-1]


def test_a_dead_run_node_leaves_the_allocation_and_a_new_step_runs_on_the_spare(slurm_cluster: LocalSlurm) -> None:
    c = slurm_cluster
    step_log = c.root / f"step0-{time.monotonic_ns()}.out"
    job_id = _submit(c, f"srun -N2 -n2 --nodelist=n1,n2 sleep 600 > {step_log} 2>&1 &", "n1,n2,n3")
    c.wait_for(lambda: any(s.endswith("n[1-2]") for s in _steps(c, job_id)), 15.0, message="step 0 running")

    c.crash_node("n2")
    c.run(["scontrol", "update", "nodename=n2", "state=down", "reason=slurm-supervisor: test"], check=True)
    c.wait_for(lambda: _job(c, job_id)["NodeList"] == "n[1,3]", 5.0, message="n2 excised")
    job = _job(c, job_id)
    assert (job["JobState"], job["NumNodes"], job["BatchHost"]) == ("RUNNING", "2", "n1")
    c.wait_for(lambda: "Node failure on n2" in step_log.read_text(), 20.0, message="step 0 terminated")

    step = c.run(["srun", "--jobid", str(job_id), "-N2", "-n2", "--nodelist=n1,n3", "printenv", "SLURMD_NODENAME"])
    assert step.returncode == 0 and sorted(step.stdout.split()) == ["n1", "n3"]
    agent = c.run(["srun", "--jobid", str(job_id), "-N2", "--ntasks-per-node=1", "--overlap", "true"])
    assert agent.returncode == 0, agent.stderr


def test_the_batch_host_dying_leaves_a_running_job_without_its_script(slurm_cluster: LocalSlurm) -> None:
    c = slurm_cluster
    job_id = _submit(c, "", "n1,n3")
    c.crash_node("n1")
    c.run(["scontrol", "update", "nodename=n1", "state=down", "reason=slurm-supervisor: test"], check=True)
    c.wait_for(lambda: _job(c, job_id)["NodeList"] == "n3", 5.0, message="n1 excised")
    time.sleep(1.0)  # nothing ends it: still running a second later
    job = _job(c, job_id)
    assert (job["JobState"], job["BatchHost"]) == ("RUNNING", "n1")
