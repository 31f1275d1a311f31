"""Regenerate the Slurm 22.05 golden fixtures in this folder from a real private cluster.

Run as root on a host where LocalSlurm works (Debian 12, slurmctld/slurmd/munge installed):

    .venv/bin/python tests/data/slurm/capture_2205.py

Takes about 40 s. Jobs are named after what they show; the parser tests find them by name.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

from supervisor.testing import LocalSlurm

HERE = Path(__file__).resolve().parent


def save(cluster: LocalSlurm, command: str, name: str) -> None:
    out = cluster.run([command, "--json"], timeout=20).stdout
    (HERE / name).write_text(out)
    print("wrote", name, len(out), "bytes")


def sbatch(cluster: LocalSlurm, name: str, *args: str) -> int:
    argv = ["sbatch", "--parsable", f"--job-name={name}", "--output=/dev/null", *args]
    return int(cluster.run(argv, check=True).stdout.strip().split(";")[0])


def state(cluster: LocalSlurm, job: int) -> str:
    out = cluster.run(["squeue", "-h", "-t", "all", "-j", str(job), "-o", "%T"]).stdout
    return out.strip()


def wait_state(cluster: LocalSlurm, job: int, *states: str, timeout: float = 30.0) -> None:
    cluster.wait_for(lambda: state(cluster, job) in states, timeout, message=f"job {job} {states}")


def mixed(cluster: LocalSlurm) -> None:
    done = sbatch(cluster, "completed", "--wrap", "true")
    failed = sbatch(cluster, "failed_exit3", "--wrap", "exit 3")
    killed = sbatch(cluster, "killed_sig9", "--wrap", "kill -9 $$")
    for job in (done, failed, killed):
        wait_state(cluster, job, "COMPLETED", "FAILED")
    cancelled = sbatch(cluster, "cancelled_running", "--wrap", "sleep 300")
    wait_state(cluster, cancelled, "RUNNING")
    cluster.run(["scancel", str(cancelled)], check=True)
    wait_state(cluster, cancelled, "CANCELLED")
    running = sbatch(
        cluster, "running", "--requeue", "--comment=run=r1,intent=7 tag:x", "--exclude=n4", "--wrap", "sleep 300"
    )
    requeued = sbatch(cluster, "requeued", "--requeue", "--wrap", "sleep 300")
    wait_state(cluster, running, "RUNNING")
    wait_state(cluster, requeued, "RUNNING")
    cluster.run(["scontrol", "requeue", str(requeued)], check=True)
    wait_state(cluster, requeued, "PENDING")
    sbatch(cluster, "held_user", "--hold", "--wrap", "true")
    admin = sbatch(cluster, "held_admin", "--begin=now+1hour", "--wrap", "true")
    cluster.run(["scontrol", "hold", str(admin)], check=True)
    sbatch(cluster, "pending_resources", "--nodes=4", "--wrap", "true")
    time.sleep(1.5)  # let the scheduler give pending_resources its reason
    save(cluster, "squeue", "squeue_2205_mixed.json")
    save(cluster, "sinfo", "sinfo_2205_mixed.json")


def node_fail(cluster: LocalSlurm) -> None:
    cluster.reset()
    job = sbatch(cluster, "two_node_no_requeue", "--nodes=2", "--no-requeue", "--wrap", "sleep 300")
    wait_state(cluster, job, "RUNNING")
    nodes = cluster.run(["squeue", "-h", "-j", str(job), "-o", "%N"]).stdout.strip()
    dead = "n2" if "n2" in nodes or "[1-2]" in nodes else nodes.split(",")[-1]
    cluster.crash_node(dead)
    cluster.run(["scontrol", "update", f"nodename={dead}", "state=down", "reason=supervisor: crashed"], check=True)
    save(cluster, "squeue", "squeue_2205_completing.json")
    wait_state(cluster, job, "NODE_FAIL")
    save(cluster, "squeue", "squeue_2205_node_fail.json")
    cluster.run(
        ["scontrol", "update", f"nodename={dead}", "state=drain", "reason=supervisor: crashed, drained"], check=True
    )
    others = [n for n in cluster.nodes if n != dead]
    cluster.run(
        ["scontrol", "update", f"nodename={others[1]}", "state=drain", "reason=supervisor: test drain"], check=True
    )
    cluster.crash_node(others[2])
    cluster.wait_for(lambda: cluster.node_states()[others[2]].endswith("*"), 30, message="NOT_RESPONDING")
    save(cluster, "sinfo", "sinfo_2205_down_drain.json")


def controller_down(cluster: LocalSlurm) -> None:
    cluster.stop_controller()
    save(cluster, "squeue", "squeue_2205_controller_down.json")
    save(cluster, "sinfo", "sinfo_2205_controller_down.json")


def prolog_failure() -> None:
    with LocalSlurm(2, extra_conf={"Prolog": "/bin/false"}) as cluster:
        job = sbatch(cluster, "prolog_failed", "--requeue", "--wrap", "true")
        cluster.wait_for(
            lambda: "launch failed" in cluster.run(["squeue", "-h", "-j", str(job), "-o", "%r"]).stdout,
            30,
            message="held after prolog",
        )
        save(cluster, "squeue", "squeue_2205_prolog_held.json")
        save(cluster, "sinfo", "sinfo_2205_prolog_drain.json")


def main() -> int:
    with LocalSlurm(4) as cluster:
        mixed(cluster)
        node_fail(cluster)
        controller_down(cluster)
    prolog_failure()
    return 0


if __name__ == "__main__":
    sys.exit(main())
