"""The daemon's tick on a 10,000-node cluster with 50,000 other users' jobs queued (issue 14).

A private Slurm 22.05 (``LocalSlurm``): 4 real nodes of 5 CPUs and 9,996 more defined DOWN (their
slurmd never starts), all in partition ``main``; 3 other users hold 5,000 and then 50,000 pending
jobs (held arrays, split into one job record per task by an update of all but their last task).
20 one-node runs are supervised by the real engine, store and Slurm adapter, in a child process per
measurement (so each has its own RSS) running as the daemon's own account ``ssv-scale-d`` (as
deployed: never root — 22.05's ``squeue -u root`` is not filtered by slurmctld): **new** (the
supervised jobs, taken from the account's list that slurmctld filters — as root they would be read
by id — and the nodes in focus; the formatted reads 22.05 needs) and **old** (``squeue --all --json`` and ``sinfo --json`` of the whole
cluster: the adapter without a user), at 5,000 and at 50,000 other jobs.

Each child ticks the engine back to back on a clock that advances one poll interval (5 s) per
tick, so that the rate-limited whole-cluster reads come as often as they would in a daemon; probes
and log watching are off (they touch no Slurm). Figures per tick: wall time, the daemon's CPU and
its Slurm clients' CPU, stdout bytes read from each client, slurmctld's CPU (less its idle rate,
measured first: slurmctld pings the 9,996 absent nodes), and the child's peak RSS.

Needs what the tests need (root, Debian's Slurm packages, cgroup2); creates users ``ssv-scale-1..3``
and ``ssv-scale-d``.
``--ticks`` (new, default 24), ``--old-ticks`` (default 6: one old tick at 50,000 jobs takes ~10 s).
Last line: one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from supervisor.testing import LocalSlurm  # noqa: E402
from supervisor.testing.slurm._conf import ExtraNodes  # noqa: E402
from supervisor.testing.slurm.users import as_user, local_user, python_for_others  # noqa: E402

NODES, CPUS, RUNS, POLL_S = 4, 5, 20, 5.0
OTHER_USERS = ("ssv-scale-1", "ssv-scale-2", "ssv-scale-3")
DAEMON_USER = "ssv-scale-d"  # the supervised account: the child runs as it
MAX_ARRAY = 10_000


# ---------------------------------------------------------------------------- the queue


def queue_jobs(cluster: LocalSlurm, count: int) -> int:
    """``count`` more held jobs, spread over the other users, each task its own job record."""
    per_user = count // len(OTHER_USERS)
    for user in OTHER_USERS:
        left = per_user
        while left:
            size = min(left, MAX_ARRAY)
            argv = ["sbatch", "--parsable", "--hold", f"--array=0-{size - 1}", "-o", "/dev/null", "--wrap", "true"]
            done = as_user(user, argv, env=cluster.env, cwd="/tmp")
            if done.returncode:
                raise RuntimeError(f"sbatch as {user}: {done.stderr}")
            array = done.stdout.strip().split(";")[0]
            # an update of some tasks splits them off the array's one record: Slurm then holds (and
            # squeue --json prints) one record per job, as on a cluster of single jobs
            cluster.run(["scontrol", "update", f"jobid={array}_[0-{size - 2}]", "nice=1"], check=True, timeout=120)
            left -= size
    return per_user * len(OTHER_USERS)


def job_records(cluster: LocalSlurm) -> int:
    return len(cluster.run(["squeue", "--all", "-h", "-t", "all", "-o", "%A"], timeout=120).stdout.split())


# ---------------------------------------------------------------------------- slurmctld


def controller(cluster: LocalSlurm) -> psutil.Process:
    for proc in psutil.process_iter(["name", "cmdline"]):
        if proc.info["name"] == "slurmctld" and str(cluster.slurm_conf) in " ".join(proc.info["cmdline"] or ()):
            return proc
    raise RuntimeError("slurmctld not found")


def cpu_s(proc: psutil.Process) -> float:
    t = proc.cpu_times()
    return t.user + t.system


def idle_rate(ctld: psutil.Process, seconds: float = 10.0) -> float:
    """slurmctld's CPU seconds per second with no client (its pings of the absent nodes)."""
    start = cpu_s(ctld)
    time.sleep(seconds)
    return (cpu_s(ctld) - start) / seconds


# ---------------------------------------------------------------------------- one measurement (child)


def child(args: argparse.Namespace) -> None:
    """Tick the engine ``--ticks`` times (after bringing every run to RUNNING); print one JSON line."""
    from supervisor.adapters.slurm.cli import SlurmCli
    from supervisor.adapters.slurm.reads import own_user
    from supervisor.adapters.sqlite import SqliteStore
    from supervisor.domain.run import RunSpec, RunState
    from supervisor.engine.reconcile import Engine, EngineSettings

    cli = SlurmCli(slurm_conf=args.slurm_conf, timeout=120.0, user=None if args.mode == "old" else own_user())
    store = SqliteStore(Path(args.state))
    clock = SteppingClock()
    scheduler = cli if args.mode == "new" else WholeReads(cli)
    engine = Engine(scheduler=scheduler, store=store, clock=clock, settings=EngineSettings())
    if not store.runs():
        for i in range(RUNS):
            spec = RunSpec(f"run{i:02d}", args.script, "main", 1, output="/dev/null", workdir="/tmp")
            store.add_run(spec, clock.now())
    for _ in range(60):  # until every run's job runs (the first child submits them)
        engine.tick()
        clock.step()
        if all(r.state is RunState.RUNNING for r in store.runs(active_only=True)):
            break
    running = sum(r.state is RunState.RUNNING for r in store.runs(active_only=True))
    for _ in range(3):  # the measured ticks start from a steady state
        engine.tick()
        clock.step()
    print(json.dumps(measure(engine, cli, clock, args.ticks, psutil.Process(args.ctld), running)))


def measure(engine, cli, clock, ticks: int, ctld: psutil.Process, running: int) -> dict:
    cli.bytes_read.clear()
    walls, cpus = [], []
    ctld_start, kids_start = cpu_s(ctld), _children_cpu()
    began = time.monotonic()
    for _ in range(ticks):
        w0, c0 = time.perf_counter(), time.process_time()
        engine.tick()
        walls.append(time.perf_counter() - w0)
        cpus.append(time.process_time() - c0)
        clock.step()
    return {
        "walls": walls,
        "daemon_cpu_s": cpus,
        "clients_cpu_s": _children_cpu() - kids_start,
        "ctld_cpu_s": cpu_s(ctld) - ctld_start,
        "window_s": time.monotonic() - began,
        "bytes": dict(cli.bytes_read),
        "rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "running": running,
    }


def _children_cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


class WholeReads:
    """The adapter as the baseline reads: every snapshot every job (no reads by id)."""

    def __init__(self, cli) -> None:
        self._cli = cli

    def __getattr__(self, name: str):
        if name == "snapshot_of":  # engine/facts/observe.py then reads the account's list every tick
            raise AttributeError(name)
        return getattr(self._cli, name)


class SteppingClock:
    """The engine's clock: real time at start, one poll interval later at each step."""

    def __init__(self) -> None:
        self._now = time.time()

    def now(self) -> float:
        return self._now

    def step(self) -> None:
        self._now = max(self._now + POLL_S, time.time())

    def wait(self, seconds: float) -> bool:
        return False


# ---------------------------------------------------------------------------- parent


def run_child(mode: str, ticks: int, cluster: LocalSlurm, state: Path, script: Path, ctld: psutil.Process) -> dict:
    python, python_env = python_for_others()
    argv = ["runuser", "-u", DAEMON_USER, "--", *python, __file__, "--child", mode, "--ticks", str(ticks)]
    argv += ["--state", str(state), "--slurm-conf", str(cluster.slurm_conf), "--script", str(script)]
    argv += ["--ctld", str(ctld.pid)]
    pythonpath = ":".join(p for p in (python_env.get("PYTHONPATH"), str(REPO)) if p)
    env = {**os.environ, **cluster.env, **python_env, "PYTHONPATH": pythonpath, "HOME": "/tmp"}
    done = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=3600, check=False, cwd="/tmp")  # noqa: S603
    lines = [ln for ln in done.stdout.splitlines() if ln.startswith("{")]
    if done.returncode or not lines:
        raise RuntimeError(f"child {mode} failed ({done.returncode}): {done.stderr[-3000:]}")
    return json.loads(lines[-1])


def figures(raw: dict, idle: float) -> dict:
    ticks = len(raw["walls"])
    walls = sorted(raw["walls"])
    p99 = walls[min(ticks - 1, round(0.99 * (ticks - 1)))]
    ctld_ms = max(0.0, raw["ctld_cpu_s"] - idle * raw["window_s"]) / ticks * 1000
    return {
        "ticks": ticks,
        "tick_p50_s": round(statistics.median(walls), 3),
        "tick_p99_s": round(p99, 3),
        "daemon_cpu_ms_per_tick": round(sum(raw["daemon_cpu_s"]) / ticks * 1000, 1),
        "clients_cpu_ms_per_tick": round(raw["clients_cpu_s"] / ticks * 1000, 1),
        "slurm_bytes_per_tick": round(sum(raw["bytes"].values()) / ticks),
        "bytes_per_tick_by_command": {k: round(v / ticks) for k, v in sorted(raw["bytes"].items())},
        "slurmctld_cpu_ms_per_tick": round(ctld_ms, 1),
        "daemon_rss_mb": round(raw["rss_mb"], 1),
        "runs_running": raw["running"],
    }


def main() -> None:
    if "--child" in sys.argv:
        child(_child_args())
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ticks", type=int, default=24)
    parser.add_argument("--old-ticks", type=int, default=6)
    parser.add_argument("--nodes", type=int, default=10_000)
    parser.add_argument("--jobs", default="5000,50000", help="other users' jobs at each stage")
    args = parser.parse_args()
    for user in (*OTHER_USERS, DAEMON_USER):
        local_user(user)
    stages = [int(n) for n in args.jobs.split(",")]
    extra = ExtraNodes(args.nodes - NODES, prefix="x", state="DOWN")
    conf = {"MaxJobCount": str(2 * stages[-1] + 10_000), "MaxArraySize": str(MAX_ARRAY + 1)}
    with LocalSlurm(NODES, cpus_per_node=CPUS, extra_nodes=extra, extra_conf=conf, ready_timeout=120) as cluster:
        work = Path(tempfile.mkdtemp(prefix="scale-"))
        work.chmod(0o755)
        (work / "state").mkdir()
        shutil.chown(work / "state", DAEMON_USER)
        script = work / "job.sh"
        script.write_text("#!/bin/sh\nexec sleep 100000\n")
        script.chmod(0o755)
        ctld = controller(cluster)
        idle = idle_rate(ctld)
        print(f"cluster: {args.nodes} nodes defined ({NODES} real); slurmctld idle {idle * 1000:.0f} ms CPU/s")
        results, queued = {}, 0
        for stage in stages:
            queued += queue_jobs(cluster, stage - queued)
            records = job_records(cluster)
            print(f"queued {queued} held jobs of {len(OTHER_USERS)} other users ({records} job records in squeue)")
            for mode, ticks in (("new", args.ticks), ("old", args.old_ticks)):
                raw = run_child(mode, ticks, cluster, work / "state", script, ctld)
                results[(mode, stage)] = figures(raw, idle)
                print(table_row(mode, stage, results[(mode, stage)]))
        print(json.dumps(summary(results, stages, args.nodes, idle)))


def _child_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    parser.add_argument("--child", choices=("new", "old"), required=True)
    parser.add_argument("--ticks", type=int, required=True)
    parser.add_argument("--state", required=True)
    parser.add_argument("--slurm-conf", required=True)
    parser.add_argument("--script", required=True)
    parser.add_argument("--ctld", type=int, required=True)
    ns = parser.parse_args()
    ns.mode = ns.child
    return ns


def table_row(mode: str, jobs: int, f: dict) -> str:
    return (
        f"  {mode:3} @ {jobs:>6} jobs: tick p50 {f['tick_p50_s']:.3f} s p99 {f['tick_p99_s']:.3f} s | daemon "
        f"{f['daemon_cpu_ms_per_tick']:.0f} ms + clients {f['clients_cpu_ms_per_tick']:.0f} ms CPU | "
        f"{f['slurm_bytes_per_tick']:,} B/tick {f['bytes_per_tick_by_command']} | slurmctld "
        f"{f['slurmctld_cpu_ms_per_tick']:.0f} ms | RSS {f['daemon_rss_mb']:.0f} MB | running {f['runs_running']}"
    )


def summary(results: dict, stages: list[int], nodes: int, idle: float) -> dict:
    small, big = stages[0], stages[-1]
    new, old = results[("new", big)], results[("old", big)]
    ratio = results[("new", big)]["slurm_bytes_per_tick"] / max(1, results[("new", small)]["slurm_bytes_per_tick"])
    return {
        "tick_p50_s": new["tick_p50_s"],
        "tick_p99_s": new["tick_p99_s"],
        "daemon_rss_mb": new["daemon_rss_mb"],
        "slurm_bytes_per_tick": new["slurm_bytes_per_tick"],
        f"slurm_bytes_per_tick_{small}": results[("new", small)]["slurm_bytes_per_tick"],
        f"slurm_bytes_ratio_{big}_{small}": round(ratio, 3),
        "slurmctld_cpu_ms_per_tick": new["slurmctld_cpu_ms_per_tick"],
        "daemon_cpu_ms_per_tick": new["daemon_cpu_ms_per_tick"],
        "baseline": {
            "tick_p50_s": old["tick_p50_s"],
            "tick_p99_s": old["tick_p99_s"],
            "daemon_rss_mb": old["daemon_rss_mb"],
            "slurm_bytes_per_tick": old["slurm_bytes_per_tick"],
            f"slurm_bytes_per_tick_{small}": results[("old", small)]["slurm_bytes_per_tick"],
            "slurmctld_cpu_ms_per_tick": old["slurmctld_cpu_ms_per_tick"],
            "daemon_cpu_ms_per_tick": old["daemon_cpu_ms_per_tick"],
        },
        "by_stage": {f"{m}_{n}": f for (m, n), f in results.items()},
        "nodes_defined": nodes,
        "other_jobs": big,
        "runs": RUNS,
        "slurmctld_idle_ms_per_s": round(idle * 1000, 1),
        "goal_met": new["tick_p99_s"] < 1.0 and new["daemon_rss_mb"] < 500 and ratio <= 1.2,
    }


if __name__ == "__main__":
    main()
