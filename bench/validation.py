"""What a node's validation costs (issue 34): the time from a drained node to its readmission through
the remedy's Slurm steps, the validation job's own time, and the capacity it takes (node-seconds
out of service: the node from its reservation to its resume, the two good peers for the job).

A private Slurm (``LocalSlurm(reboot=True)``, 3 nodes) as root, the guard's own argv builders
(``guard/slurm_node_jobs.py``): drain n1, reserve it (MAINT, IGNORE_JOBS, FLEX), reboot it through
Slurm (``scontrol reboot ASAP nextstate=RESUME``; the harness keeps a "rebooted" node away 3 s, a
real node takes minutes: that figure is the harness's, not a reboot's), run the validation job
(``agent/validate.py`` on n1 and two peers, in the reservation), judge its figures, resume. The CPU
stand-in's burn runs ``--burn-s`` (20 by default, the shipped default), the collective
``--collective-mb``. Last line: one JSON object (``validation_job_s``, ``validation_inside_s``,
``node_out_s``, ``peers_node_s``, ``capacity_node_s``, medians over ``--trials``).

    .venv/bin/python bench/validation.py --trials 3 --burn-s 20
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

from supervisor.domain.health.validation import ValidationFigures, ValidationSettings, judge
from supervisor.guard.remedy import REBOOT_NEXT_STATE, reservation_name
from supervisor.guard.slurm_node_jobs import reboot_argv, reserve_argv, unreserve_argv
from supervisor.testing import LocalSlurm

REPO = Path(__file__).resolve().parent.parent
NODE = "n1"


def trial(cluster: LocalSlurm, out: Path, burn_s: float, collective_mb: int) -> dict[str, float]:
    name = reservation_name(NODE)
    cluster.run(["scontrol", "update", f"nodename={NODE}", "state=drain", "reason=bench: XID 79"], check=True)
    held_at = time.monotonic()
    cluster.run(reserve_argv(name, NODE, "root", 60), check=True)
    reboots = len(cluster.reboots)
    cluster.run(reboot_argv(NODE, REBOOT_NEXT_STATE, "bench: reboot"), check=True)
    cluster.wait_for(lambda: len(cluster.reboots) > reboots, 60, message="the reboot")
    cluster.wait_for(lambda: cluster.node_states().get(NODE) in ("idle", "maint", "reserved"), 120, message="back")
    back_at = time.monotonic()
    figures, job_s = validation_job(cluster, out, burn_s, collective_mb)
    cluster.run(["scontrol", "update", f"nodename={NODE}", "state=resume"])  # in service already: an error, no harm
    cluster.run(unreserve_argv(name), check=True)
    done_at = time.monotonic()
    verdict = judge(figures, ValidationSettings(burn_min_share=0.05, collective_min_share=0.05))
    return {
        "reboot_s": back_at - held_at,
        "validation_job_s": job_s,
        "validation_inside_s": figures.elapsed_s,
        "node_out_s": done_at - held_at,
        "peers_node_s": 2 * job_s,
        "capacity_node_s": (done_at - held_at) + 2 * job_s,
        "passed": float(verdict.passed),
    }


def validation_job(
    cluster: LocalSlurm, out: Path, burn_s: float, collective_mb: int
) -> tuple[ValidationFigures, float]:
    out.unlink(missing_ok=True)
    command = (
        f"srun {sys.executable} -m supervisor.agent.validate --node {NODE} --burn-s {burn_s:g} "
        f"--collective-mb {collective_mb}"
    )
    argv = ["sbatch", "--parsable", "-N3", "--ntasks-per-node=1", f"--nodelist={NODE}"]
    argv += [f"--reservation={reservation_name(NODE)}", f"--output={out}", "--wrap", command]
    started = time.monotonic()
    job = cluster.run(argv, check=True, env={"PYTHONPATH": str(REPO)}).stdout.strip()
    cluster.wait_for(lambda: not cluster.run(["squeue", "-h", "-j", job]).stdout.strip(), 600, message="the job")
    lines = out.read_text().strip().splitlines()
    data = json.loads(lines[-1]) if lines and lines[-1].startswith("{") else None
    if data is None:
        raise RuntimeError("the validation job printed no figures:\n" + "\n".join(lines[-20:]))
    return ValidationFigures(**{**data, "oneshot": tuple(data["oneshot"])}), time.monotonic() - started


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trials", type=int, default=3)
    parser.add_argument("--burn-s", type=float, default=20.0)
    parser.add_argument("--collective-mb", type=int, default=64)
    args = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory(prefix="ssv-bench-validation-") as work, LocalSlurm(3, reboot=True) as cluster:
        os.chmod(work, 0o755)
        for i in range(args.trials):
            rows.append(trial(cluster, Path(work) / "validation.json", args.burn_s, args.collective_mb))
            print(f"trial {i + 1}: " + "  ".join(f"{k} {v:.1f}" for k, v in rows[-1].items()), flush=True)
    keys = [k for k in rows[0] if k != "passed"]
    print(f"{'figure':24} {'median':>8} {'min':>8} {'max':>8}")
    medians = {}
    for key in keys:
        values = [r[key] for r in rows]
        medians[key] = round(statistics.median(values), 2)
        print(f"{key:24} {medians[key]:8.1f} {min(values):8.1f} {max(values):8.1f}")
    summary = {**medians, "trials": len(rows), "passed": sum(int(r["passed"]) for r in rows), "burn_s": args.burn_s}
    print(json.dumps(summary, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
