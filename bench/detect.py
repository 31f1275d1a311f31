"""XID 79 on one GPU → the node drained and the run restarted: how fast, end to end, on real parts.

A private Slurm (LocalSlurm), the real daemon (a subprocess, its ingest on loopback), and the real
node agent on every node of the run (`slurm-supervisor agent`, an overlapping job step) reading
the stand-in NVML through pynvml. Each trial submits a 2-node run, waits until every agent has
reported, injects XID 79 on GPU 3 of one node, and measures from the injection to

* the drain: the `node_drained` logbook entry (the scontrol call has returned), and
* the restart: the `restarted` entry (the new job is submitted, without the node).

Budget (issue 3): one agent sample interval plus one daemon tick. The agent waits on NVML's XID
event set between samples and sends an XID at once, so the sample interval is the worst case.

    .venv/bin/python bench/detect.py [--trials 10] [--agent-interval 5] [--poll-interval 5]

Last line: one JSON object (``p50_s``, ``p99_s``, ``budget_s``, ...).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

from _common import run_on_release, slurm_version, table  # type: ignore[import-not-found]

from supervisor.testing import LocalSlurm, unavailable_reason
from supervisor.testing.kit.nvml_standin import NvmlStandin, build_standin
from supervisor.testing.slurm.daemon import SupervisorProcess, write_run

SCRIPT = """\
srun --overlap --ntasks-per-node=1 bash -c 'NVML_STANDIN_STATE="$STATE_DIR/$SLURMD_NODENAME.json" \
LD_LIBRARY_PATH="$NVML_LIB_DIR" exec "$PY" -m supervisor agent --interval {interval}' &
srun --ntasks-per-node=1 sleep 3600
"""


def event_time(book: list[dict], kind: str, node: str | None = None) -> float | None:
    for e in book:
        if e["kind"] == kind and (node is None or node in e["message"]):
            return float(e["at"])
    return None


def trial(cluster: LocalSlurm, work: Path, library: Path, n: int, interval: float, poll: float) -> dict:
    gpus = {node: NvmlStandin(library, work / "nvml" / f"{node}.json") for node in cluster.nodes}
    name = f"detect-{n}"
    spec = write_run(
        work,
        name,
        nodes=2,
        partition=cluster.partition,
        spares=cluster.nodes[-1],
        script_body=SCRIPT.format(interval=interval),
        env={"STATE_DIR": str(work / "nvml"), "PY": sys.executable, "NVML_LIB_DIR": str(library.parent)},
    )
    sup = SupervisorProcess(cluster, work / f"daemon-{n}", poll_interval_s=poll)
    sup.start()
    try:
        sup.cli("submit", str(spec))
        first = sup.wait_running(name, attempt=0, timeout=60)
        time.sleep(max(3.0, 2 * interval))  # every agent up and reporting
        victim = first["running_on"][1]
        injected = time.time()
        gpus[victim].xid(3, 79)
        sup.wait_running(name, attempt=1, avoid=[victim], timeout=120, interval=0.05)
        book = sup.logbook(name)
    finally:
        sup.stop()
    drained = event_time(book, "node_drained", victim)
    restarted = event_time(book, "restarted")
    if drained is None or restarted is None:
        raise RuntimeError(f"trial {n}: no drain/restart in the logbook: {[e['kind'] for e in book]}")
    return {"node": victim, "drain_s": drained - injected, "restart_s": restarted - injected}


def quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--trials", type=int, default=10)
    ap.add_argument("--agent-interval", type=float, default=5.0, help="the agents' sample interval (s)")
    ap.add_argument("--poll-interval", type=float, default=5.0, help="the daemon's poll interval (s)")
    ap.add_argument("--slurm-release", help="run on this release of the matrix (22.05, 24.11, 26.05)")
    args = ap.parse_args()
    run_on_release(args.slurm_release)
    reason = unavailable_reason()
    if reason:
        sys.exit(f"bench/detect.py needs a private Slurm: {reason}")
    with tempfile.TemporaryDirectory(prefix="ssv-bench-detect-") as tmp:
        work = Path(tmp)
        (work / "nvml").mkdir()
        library = build_standin(work / "lib")
        results = []
        release_seen = "unknown"
        for n in range(args.trials):
            cluster = LocalSlurm(4).start()  # a fresh cluster per trial (~0.2 s): no state carried over
            release_seen = slurm_version(cluster)
            try:
                r = trial(cluster, work, library, n, args.agent_interval, args.poll_interval)
            finally:
                cluster.stop()
            results.append(r)
            print(
                f"trial {n}: {r['node']} drained after {r['drain_s']:.2f} s, run restarted after "
                f"{r['restart_s']:.2f} s",
                file=sys.stderr,
                flush=True,
            )
    budget = args.agent_interval + args.poll_interval
    drains = [r["drain_s"] for r in results]
    restarts = [r["restart_s"] for r in results]
    rows = [
        (
            name,
            f"{min(v):.2f}",
            f"{quantile(v, 0.5):.2f}",
            f"{quantile(v, 0.9):.2f}",
            f"{quantile(v, 0.99):.2f}",
            f"{max(v):.2f}",
        )
        for name, v in (("drain issued", drains), ("restart issued", restarts))
    ]
    print(table(rows, ("XID 79 -> ", "min_s", "p50_s", "p90_s", "p99_s", "max_s")))
    print(
        f"\n{len(results)} trials; agent interval {args.agent_interval:g} s, daemon poll {args.poll_interval:g} s; "
        f"budget (one agent interval + one tick) {budget:g} s"
    )
    print(
        json.dumps(
            {
                "p50_s": round(quantile(restarts, 0.5), 2),
                "p99_s": round(quantile(restarts, 0.99), 2),
                "budget_s": budget,
                "drain_p50_s": round(quantile(drains, 0.5), 2),
                "drain_p99_s": round(quantile(drains, 0.99), 2),
                "trials": len(results),
                "slurm": release_seen,
                "mean_s": round(statistics.fmean(restarts), 2),
                "within_budget": all(r <= budget for r in restarts),
            }
        )
    )


if __name__ == "__main__":
    main()
