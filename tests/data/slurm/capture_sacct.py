"""Regenerate the sacct golden files in this folder from a real private cluster with accounting
(a private MariaDB and slurmdbd: supervisor/testing/slurm/accounting.py).

Run as root on a host where LocalSlurm works and slurmdbd + mariadb-server are installed:

    .venv/bin/python tests/data/slurm/capture_sacct.py                      # the host's Slurm
    scripts/slurm-release shell 24.11 /opt/ssv-venv/bin/python tests/data/slurm/capture_sacct.py

Takes about 30 s. Jobs are named after what they show; the parser tests find them by name.
Writes ``sacct_<rel>.txt`` (what the adapter reads: ``sacct_argv`` with ``SLURM_TIME_FORMAT=%s``)
and ``sacct_<rel>.json`` (``sacct --json`` for the same jobs: kept to show why it is not read), rel
the running release (2205, 2411, 2605).
"""

from __future__ import annotations

import sys
import time

from capture import HERE, sbatch, wait_state  # the job helpers of the squeue/sinfo capture beside this file

from supervisor.adapters.slurm.release import parse_version
from supervisor.adapters.slurm.sacct import SACCT_ENV, sacct_argv
from supervisor.testing import LocalSlurm


def jobs(cluster: LocalSlurm) -> list[int]:
    ids = [
        sbatch(cluster, "completed", "--comment=slurm-supervisor:llm:abc:1", "--wrap", "true"),
        sbatch(cluster, "failed_exit3", "--wrap", "sleep 1; exit 3"),
        sbatch(cluster, "killed_sig9", "--wrap", "kill -9 $$"),
    ]
    cancelled = sbatch(cluster, "cancelled_running", "--wrap", "sleep 300")
    requeued = sbatch(cluster, "requeued_then_completed", "--requeue", "--wrap", "sleep 2")
    node_fail = sbatch(cluster, "node_fail", "--no-requeue", "--nodes=2", "--wrap", "sleep 300")
    for job in (cancelled, requeued, node_fail):
        wait_state(cluster, job, "RUNNING")
    cluster.run(["scancel", str(cancelled)], check=True)
    cluster.run(["scontrol", "requeue", str(requeued)], check=True)
    node = cluster.run(["squeue", "-h", "-j", str(node_fail), "-o", "%N"], check=True).stdout.split(",")[0]
    cluster.run(["scontrol", "update", f"nodename={node.strip()}", "state=down", "reason=capture"], check=True)
    never = sbatch(cluster, "cancelled_pending", "--hold", "--wrap", "true")
    cluster.run(["scancel", str(never)], check=True)
    running = sbatch(cluster, "running", "--wrap", "sleep 300")
    wait_state(cluster, running, "RUNNING")
    wait_state(cluster, requeued, "COMPLETED", timeout=60)
    return [*ids, cancelled, requeued, node_fail, never, running]


def main() -> int:
    with LocalSlurm(4, accounting=True) as cluster:
        version = parse_version(cluster.run(["squeue", "--version"], check=True).stdout)
        assert version is not None
        release = f"{version[0]:02d}{version[1]:02d}"
        ids = jobs(cluster)
        time.sleep(2.0)  # slurmctld sends job records to slurmdbd asynchronously
        text = cluster.run(sacct_argv(ids), env=SACCT_ENV, check=True).stdout
        (HERE / f"sacct_{release}.txt").write_text(text)
        listed = ",".join(map(str, ids))
        doc = cluster.run(["sacct", "--json", f"--jobs={listed}", "--allocations"], check=True).stdout
        (HERE / f"sacct_{release}.json").write_text(doc)
        print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
