"""Two login nodes (issue 33): leader kills at random points of a recovery, and the tick's cost on
PostgreSQL against SQLite.

**Failover.** A private Slurm (LocalSlurm, one node per kill and three more) and a private
PostgreSQL (``supervisor.testing.postgres``); two real daemons of one instance share its database,
with the defaults of the configuration (``[store] lease_s`` 15, ``[daemon] poll_interval_s`` 5,
``[slurm] command_timeout_s`` 20). One run of one node, resubmitted after a fault. Each trial:
after a random wait of 0 to one poll interval, the run's node is crashed (``crash_node``); after a
second random wait of 0 to one poll interval plus 3 s — so the kill falls before the fault is seen,
while it is being recorded, mid-recovery or after it — the leader is killed with SIGKILL. The
failover lasts from the kill to the standby's first tick as leader (its ``leader_acting`` line).
The killed daemon is started again (a standby) and the next trial kills the new leader.

* ``duplicate_actions``: tagged jobs Slurm ran beyond one per crash plus the first (every job
  seen by an ``squeue`` every 0.2 s), plus each crashed node's drains beyond one (the journal).
* ``lost_events``: logbook events read before a kill and missing after, plus crashes with no
  fault entry.

**Tick.** The engine in process against the same Slurm, once on SQLite and once on PostgreSQL
(127.0.0.1, TCP), 20 runs each (one-node ``sleep`` jobs, most pending); ticks alternate between
the two, after the first submissions; the p99 of each and their ratio.

Usage: .venv/bin/python bench/ha.py [--kills 10] [--runs 20] [--ticks 100] [--seed 1]
The last line of stdout is one JSON object with the figures.
"""

from __future__ import annotations

import argparse
import datetime
import json
import random
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

import psycopg

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import fmt_s, quiet_logs, table  # noqa: E402

from supervisor.testing import LocalSlurm  # noqa: E402
from supervisor.testing.servers.postgres import LocalPostgres  # noqa: E402
from supervisor.testing.slurm.daemon import SupervisorProcess, write_run  # noqa: E402

POLL_S, LEASE_S, COMMAND_TIMEOUT_S = 5.0, 15.0, 20.0  # the configuration's defaults
SLEEPER = "srun sleep 100000\n"
RECOVERY_S = 300.0  # a recovery waits for Slurm to finish the crashed node's job (KillWait) before resubmitting


def p99(values: list[float]) -> float:
    return statistics.quantiles(values, n=100, method="inclusive")[98] if len(values) > 1 else values[0]


class JobWatch:
    """Every job id Slurm shows with the instance's tag, polled on a thread of its own."""

    def __init__(self, cluster: LocalSlurm) -> None:
        self.cluster, self.tag, self.seen = cluster, "", set[int]()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._poll, daemon=True)

    def start(self, tag: str) -> None:
        self.tag = tag
        self._thread.start()

    def _poll(self) -> None:
        while not self._stop.wait(0.2):
            out = self.cluster.run(["squeue", "-h", "-a", "-o", "%i|%k"], timeout=15).stdout
            for line in out.splitlines():
                job, _, comment = line.partition("|")
                if comment.startswith(self.tag) and job.strip().isdigit():
                    self.seen.add(int(job))

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(5)


class Failovers:
    def __init__(self, cluster: LocalSlurm, server: LocalPostgres, root: Path, rng: random.Random) -> None:
        self.cluster, self.server, self.rng = cluster, server, rng
        database = server.database().rsplit("/", 1)[1]
        self.url = server.url(database)
        store = f'[store]\nurl = "{self.url}"\npassword_file = "{server.password_file}"\n'
        self.daemons = [
            SupervisorProcess(
                cluster, root / f"login{i}", poll_interval_s=POLL_S, extra=store, command_timeout_s=COMMAND_TIMEOUT_S
            )
            for i in range(2)
        ]
        self.spec = write_run(root, "llm", nodes=1, partition=cluster.partition, script_body=SLEEPER, max_restarts=100)
        self.watch = JobWatch(cluster)
        self.crashed: list[str] = []
        self.seconds: list[float] = []
        self.lost = 0

    def query(self, sql: str) -> list[tuple]:
        with psycopg.connect(self.url, password=self.server.password, connect_timeout=5) as db:
            return db.execute(sql).fetchall()

    def run(self, kills: int) -> None:
        leader, standby = self.daemons
        leader.start()
        _wait_logged(leader, "leader_acting", 60)
        standby.start()
        leader.cli("submit", str(self.spec))
        [(instance,)] = self.query("SELECT value FROM meta WHERE key = 'instance'")
        self.watch.start(f"slurm-supervisor:llm:{instance}:")
        for attempt in range(kills):
            self.seconds.append(self._trial(leader, standby, attempt))
            print(f"kill {attempt + 1}: failover {self.seconds[-1]:.2f} s", file=sys.stderr, flush=True)
            leader, standby = standby, leader
        standby.wait_running("llm", attempt=kills, avoid=self.crashed, timeout=RECOVERY_S)
        time.sleep(2 * POLL_S)  # a few more ticks: anything doubled would show now

    def _trial(self, leader: SupervisorProcess, standby: SupervisorProcess, attempt: int) -> float:
        node = standby.wait_running("llm", attempt=attempt, avoid=self.crashed, timeout=RECOVERY_S)["running_on"][0]
        time.sleep(self.rng.uniform(0, POLL_S))
        self.cluster.crash_node(node)
        self.crashed.append(node)
        time.sleep(self.rng.uniform(0, POLL_S + 3.0))
        before = set(self.query("SELECT id, kind, key FROM events"))
        killed = time.time()
        assert leader.proc is not None
        leader.proc.kill()
        leader.wait_exit(10)
        acting = _wait_logged(standby, "leader_acting", LEASE_S + COMMAND_TIMEOUT_S + 30)
        self.lost += len(before - set(self.query("SELECT id, kind, key FROM events")))
        leader.start()  # a fresh standby
        return acting - killed

    def duplicates(self) -> int:
        drains = self.query(
            "SELECT params::json->>'node', count(*) FROM actions WHERE kind = 'node_state' AND status = 'done'"
            " AND params::json->>'change' = 'DRAIN' GROUP BY 1"
        )
        extra_drains = sum(max(0, n - 1) for _, n in drains)
        return max(0, len(self.watch.seen) - (1 + len(self.crashed))) + extra_drains

    def lost_events(self) -> int:
        faults = {m for (m,) in self.query("SELECT message FROM events WHERE kind = 'fault'")}
        unrecorded = [n for n in self.crashed if not any(f"on {n}:" in m or f" {n} " in m for m in faults)]
        return self.lost + len(unrecorded)


def _wait_logged(daemon: SupervisorProcess, event: str, timeout: float) -> float:
    """When (wall clock, from the log line's timestamp) ``daemon``'s current process logged ``event``."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for line in daemon.log_path.read_text(errors="replace").splitlines():
            if f'"{event}"' in line:
                stamp = json.loads(line)["timestamp"].replace("Z", "+00:00")
                return datetime.datetime.fromisoformat(stamp).timestamp()
        time.sleep(0.05)
    raise AssertionError(f"{daemon.workdir.name} did not log {event} within {timeout} s")


def tick_seconds(
    cluster: LocalSlurm, server: LocalPostgres, root: Path, runs: int, ticks: int
) -> dict[str, list[float]]:
    """Seconds per engine tick on each store, ``runs`` runs each, the ticks interleaved."""
    from supervisor.adapters.clock import SystemClock
    from supervisor.adapters.postgres import PostgresStore
    from supervisor.adapters.slurm.cli import SlurmCli
    from supervisor.adapters.slurm.reads import own_user
    from supervisor.adapters.sqlite import SqliteStore
    from supervisor.config import load_run_spec
    from supervisor.engine.reconcile import Engine

    stores = {
        "sqlite": SqliteStore(root / "sqlite"),
        "postgres": PostgresStore(server.database(), password=server.password),
    }
    engines = {}
    for name, store in stores.items():
        for i in range(runs):
            spec = load_run_spec(
                write_run(root, f"{name}{i}", nodes=1, partition=cluster.partition, script_body=SLEEPER)
            )
            store.add_run(spec, time.time())
        slurm = SlurmCli(slurm_conf=str(cluster.slurm_conf), timeout=COMMAND_TIMEOUT_S, user=own_user())
        engines[name] = Engine(scheduler=slurm, store=store, clock=SystemClock())
    seconds: dict[str, list[float]] = {name: [] for name in engines}
    for i in range(ticks + 5):
        for name, engine in engines.items():
            started = time.perf_counter()
            engine.tick()
            if i >= 5:  # the first ticks submit every run
                seconds[name].append(time.perf_counter() - started)
    for store in stores.values():
        store.close()
    return seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kills", type=int, default=10)
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--ticks", type=int, default=100)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    quiet_logs()
    root = Path(tempfile.mkdtemp(prefix="bench-ha-"))
    # KillWait 5 s (Slurm's default: 30): each recovery waits on it; the failover does not
    with LocalSlurm(nodes=args.kills + 3, extra_conf={"KillWait": "5"}) as cluster:
        server = LocalPostgres().start()
        try:
            failovers = Failovers(cluster, server, root / "failover", random.Random(args.seed))
            try:
                failovers.run(args.kills)
            finally:  # a trial that failed leaves no daemon behind
                failovers.watch.stop()
                for daemon in failovers.daemons:
                    daemon.stop()
            counted = {"duplicate_actions": failovers.duplicates(), "lost_events": failovers.lost_events()}
            cluster.reset()
            ticks = tick_seconds(cluster, server, root / "ticks", args.runs, args.ticks)
        finally:
            server.stop()
    report(failovers.seconds, counted, ticks, args)


def report(
    seconds: list[float], counted: dict[str, int], ticks: dict[str, list[float]], args: argparse.Namespace
) -> None:
    rows = [[i + 1, fmt_s(s)] for i, s in enumerate(seconds)]
    print(table(rows, ["kill", "failover s (kill -> the standby's first tick)"]))
    tick_rows = [
        [name, len(v), f"{statistics.median(v) * 1000:.1f}", f"{p99(v) * 1000:.1f}"] for name, v in ticks.items()
    ]
    print(table(tick_rows, ["store", "ticks", "p50 ms", "p99 ms"]))
    figures = {
        "kills": len(seconds),
        "failover_s_p50": round(statistics.median(seconds), 2),
        "failover_s_p99": round(p99(seconds), 2),
        "failover_goal_s": LEASE_S + POLL_S,
        **counted,
        "runs": args.runs,
        "tick_s_p99_postgres": round(p99(ticks["postgres"]), 4),
        "tick_s_p99_sqlite": round(p99(ticks["sqlite"]), 4),
        "tick_p99_ratio_postgres_sqlite": round(p99(ticks["postgres"]) / p99(ticks["sqlite"]), 2),
    }
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
