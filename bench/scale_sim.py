"""A 2,048-node run on the simulated cluster with real sockets: the engine's tick, the slurmd probe
and the ingest within systemd's default soft RLIMIT_NOFILE of 1,024 (issue 14).

The real engine (``EngineHarness``: store, decisions, logbook) supervises one run of ``--run-nodes``
nodes on a ``SimCluster``, ticking once a second of wall time (the virtual clock follows). Each
node's slurmd is a real listening socket on loopback, in a child process (``--farm``); a few idle
nodes' sockets are closed from the start (dead), and at ``--crash-at`` one node of the job crashes
(its socket closes, its slurmd goes down in the simulator). The probe is the real ``TcpProbe``
pointed at those sockets. 2,048 agents (``supervisor.sim.agent_fleet``, another process) POST an
8-GPU report every ``--agent-interval`` s to the real ingest, served in this process — whose soft
RLIMIT_NOFILE is ``--nofile`` — as in the daemon.

Baseline: the probe before issue 14 (every socket at once, a name lookup per node) on the same
sockets, in a subprocess under soft limits of 256 and 1,024 (it crashes with EMFILE) and under the
hard limit (its round time).

Last line JSON: ``tick_p99_s`` (goal < 1), ``probe_round_s`` (p99 of the probe's calls over all job
nodes: what a tick spends probing, at most its 0.5 s budget), ``probe_sweep_s`` (p99 of the wall time
until every job node has been answered, over as many ticks as it takes; goal < 2), ``ingest_p99_ms`` (goal < 100), ``emfile`` (probe sockets refused + accept pauses,
goal 0), ``recovered``, ``recover_s`` (crash → new attempt running, virtual seconds), baseline.

    python bench/scale_sim.py --run-nodes 2048
"""

from __future__ import annotations

import argparse
import json
import resource
import selectors
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bench._common import table  # noqa: E402

TOKEN = "scale-token-0123456789abcdef"
RUN = "llm"
EXTRA_NODES = 16  # idle nodes beside the job's: spares and a few dead ones
DEAD_IDLE = 8


# ---------------------------------------------------------------------------- the slurmd farm (child)
def farm_main(count: int) -> None:
    """``count`` listening sockets; prints their ports; accepts and closes; ``kill I`` on stdin closes one."""
    resource.setrlimit(resource.RLIMIT_NOFILE, (resource.getrlimit(resource.RLIMIT_NOFILE)[1],) * 2)
    listeners = []
    sel = selectors.DefaultSelector()
    for _ in range(count):
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        s.listen(64)
        s.setblocking(False)
        sel.register(s, selectors.EVENT_READ)
        listeners.append(s)
    sel.register(sys.stdin, selectors.EVENT_READ)
    print(json.dumps([s.getsockname()[1] for s in listeners]), flush=True)
    while True:
        for key, _ in sel.select():
            if key.fileobj is sys.stdin:
                line = sys.stdin.readline()
                if not line:
                    return
                victim = listeners[int(line.split()[1])]
                sel.unregister(victim)
                victim.close()  # nothing listens: connects are refused, as to a dead slurmd
                continue
            try:
                key.fileobj.accept()[0].close()  # type: ignore[union-attr]
            except OSError:
                pass


class Farm:
    def __init__(self, names: list[str]) -> None:
        argv = [sys.executable, __file__, "--farm", str(len(names))]
        self.proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        assert self.proc.stdout is not None and self.proc.stdin is not None
        self.index = {name: i for i, name in enumerate(names)}
        self.ports = dict(zip(names, json.loads(self.proc.stdout.readline()), strict=True))

    def kill(self, name: str) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(f"kill {self.index[name]}\n")
        self.proc.stdin.flush()

    def close(self) -> None:
        self.proc.communicate("", timeout=30)


class LoopbackProbe:
    """The real ``TcpProbe``, each node's slurmd at its farm port; times each call (a tick's share)
    and each sweep (from a call until every node asked for then has been answered: a round the
    probe could not finish within a call carries over to the next ticks)."""

    def __init__(self, ports: dict[str, int]) -> None:
        from supervisor.adapters.slurm.tcp_probe import TcpProbe

        self.ports, self.tcp, self.rounds = ports, TcpProbe(timeout=1.0), []
        self.sweeps: list[tuple[int, float, int]] = []  # (nodes, seconds, calls)
        self._sweep: tuple[float, set[str], int, int] | None = None  # started, left, nodes, calls

    def probe(self, nodes):  # noqa: ANN001, ANN201 - the NodeProbe port
        infos = [replace(n, address="127.0.0.1", port=self.ports[n.name]) for n in nodes]
        started = time.perf_counter()
        if self._sweep is None:
            self._sweep = (started, {n.name for n in infos}, len(infos), 0)
        result = self.tcp.probe(infos)
        self.rounds.append((len(infos), time.perf_counter() - started))
        self._note_sweep(result, {n.name for n in infos})
        return result

    def _note_sweep(self, result, asked: set[str]) -> None:  # noqa: ANN001
        assert self._sweep is not None
        began, left, count, calls = self._sweep
        left = (left & asked) - set(result)
        self._sweep = (began, left, count, calls + 1)
        if not left:
            self.sweeps.append((count, time.perf_counter() - began, calls + 1))
            self._sweep = None


# ---------------------------------------------------------------------------- the baseline
_OLD_PROBE = """
import json, resource, selectors, socket, sys, time
ports, limit = json.loads(sys.stdin.read()), int(sys.argv[1])
resource.setrlimit(resource.RLIMIT_NOFILE, (limit, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
sel, started, alive = selectors.DefaultSelector(), time.perf_counter(), 0
for port in ports:  # the probe before issue 14: a lookup per node, every socket at once
    info = socket.getaddrinfo("127.0.0.1", port, type=socket.SOCK_STREAM)[0]
    s = socket.socket(info[0], socket.SOCK_STREAM)
    s.setblocking(False)
    s.connect_ex(info[4])
    sel.register(s, selectors.EVENT_WRITE)
while sel.get_map():
    for key, _ in sel.select(1.0):
        alive += key.fileobj.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR) == 0
        sel.unregister(key.fileobj)
        key.fileobj.close()
print(json.dumps({"round_s": time.perf_counter() - started, "alive": alive}))
"""


def baseline(ports: list[int], limit: int) -> str:
    argv = [sys.executable, "-c", _OLD_PROBE, str(limit)]
    done = subprocess.run(argv, input=json.dumps(ports), capture_output=True, text=True, timeout=120, check=False)
    if done.returncode != 0:
        return "crashed: EMFILE" if "Too many open files" in done.stderr else f"crashed: {done.stderr[-200:]}"
    return f"{json.loads(done.stdout)['round_s']:.3f} s"


# ---------------------------------------------------------------------------- the run
def build(tmp: Path, run_nodes: int, ports_of: Farm, events) -> tuple:  # noqa: ANN001
    import structlog

    from supervisor.adapters.clock import SystemClock  # noqa: F401 - the ingest's clock is the engine's here
    from supervisor.adapters.sqlite import SqliteStore
    from supervisor.adapters.web.ingest import IngestServer, ReportIngest
    from supervisor.domain.health.gpu_health import HealthRules
    from supervisor.domain.run import RunSpec, SparePolicy
    from supervisor.sim.agent_fleet import AGENT_NETWORK
    from supervisor.sim.clock import VirtualClock
    from supervisor.sim.slurm.cluster import SimCluster
    from supervisor.testing.kit.engine import EngineHarness

    structlog.configure(processors=[events])
    clock = VirtualClock(start=time.time())
    names = list(ports_of.ports)
    cluster = SimCluster(clock, names, "main")
    spec = RunSpec(
        name=RUN, script="/train.sbatch", partition="main", nodes=run_nodes,
        spare_policy=SparePolicy.NAMED, spare_nodes=(names[-1],), max_restarts=5,
    )  # fmt: skip
    ingest = ReportIngest({RUN: TOKEN}, HealthRules(), clock)
    server = IngestServer(ingest, port=0)
    server.limits = replace(server.limits, node_networks=(AGENT_NETWORK,))  # each agent its own peer, as a node
    server.start()
    probe = LoopbackProbe(ports_of.ports)
    world = EngineHarness(
        tmp, clock=clock, scheduler=cluster, open_store=SqliteStore, specs=[spec], probe=probe,
        health=ingest, view=cluster.inspect,
    )  # fmt: skip
    return world, cluster, server, probe


def open_fds() -> int:
    return len(list(Path("/proc/self/fd").iterdir()))


def run(args: argparse.Namespace, tmp: Path) -> dict:
    from supervisor.sim.agent_fleet import EventCounter
    from supervisor.sim.slurm.cluster import node_names

    names = list(node_names(args.run_nodes + EXTRA_NODES))
    farm = Farm(names)
    base = {str(limit): baseline(list(farm.ports.values())[: args.run_nodes], limit) for limit in (256, 1024)}
    base["hard"] = baseline(list(farm.ports.values())[: args.run_nodes], resource.getrlimit(resource.RLIMIT_NOFILE)[1])
    resource.setrlimit(resource.RLIMIT_NOFILE, (args.nofile, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
    events = EventCounter()
    world, cluster, server, probe = build(tmp, args.run_nodes, farm, events)
    for name in names[-1 - DEAD_IDLE : -1]:  # dead idle nodes: nothing listens
        cluster.crash_node(name)
        farm.kill(name)
    world.until(world.running)
    fleet = subprocess.Popen(
        [sys.executable, "-m", "supervisor.sim.agent_fleet", "agents", str(server.port), RUN, TOKEN, "0",
         str(args.run_nodes), str(int(args.ticks / args.agent_interval)), str(args.agent_interval), "close"],
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    ticks, most_fds, crashed_at, recovered_at, victim = [], 0, None, None, ""
    for n in range(args.ticks):
        if n == args.crash_at:
            victim = world.job().nodes[len(world.job().nodes) // 2]
            cluster.crash_node(victim)
            farm.kill(victim)
            crashed_at = world.clock.now()
        started = time.perf_counter()
        world.tick(interval=1.0)
        ticks.append(time.perf_counter() - started)
        most_fds = max(most_fds, open_fds())
        if crashed_at and recovered_at is None and world.running() and world.run().attempt.seq == 1:
            recovered_at = world.clock.now()
        time.sleep(max(0.0, 1.0 - (time.perf_counter() - started)))
    agents = json.loads(fleet.communicate(timeout=300)[0])
    server.stop()
    farm.close()
    full = [s for count, s in probe.rounds if count >= args.run_nodes]
    sweeps = [(s, calls) for count, s, calls in probe.sweeps if count >= args.run_nodes]
    fault = [e.message for e in world.store.events(RUN) if e.kind.value == "fault"]
    return {
        "tick_p99_s": round(float(np.percentile(ticks, 99)), 3),
        "tick_max_s": round(max(ticks), 3),
        "probe_round_s": round(float(np.percentile(full, 99)), 3) if full else None,
        "probe_rounds": len(full),
        "probe_sweep_s": round(float(np.percentile([s for s, _ in sweeps], 99)), 3) if sweeps else None,
        "probe_sweep_calls_max": max((c for _, c in sweeps), default=None),
        "ingest_p99_ms": round(float(np.percentile(agents["latencies"], 99)) * 1000, 1),
        "ingest_p50_ms": round(float(np.percentile(agents["latencies"], 50)) * 1000, 1),
        "ingest_reports": len(agents["latencies"]),
        "ingest_statuses": agents["statuses"],
        "ingest_retries": agents["retries"],
        "emfile": probe.tcp.counters["emfile"] + events.counts["http_accept_paused"],
        "probe_not_run": probe.tcp.counters["not_run"],
        "most_fds": most_fds,
        "nofile_soft": args.nofile,
        "recovered": recovered_at is not None,
        "recover_s": round(recovered_at - crashed_at, 1) if recovered_at and crashed_at else None,
        "crashed_node": victim,
        "fault_evidence": fault[0][:160] if fault else None,
        "baseline_old_probe": base,
        "run_nodes": args.run_nodes,
        "goal_met": False,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--run-nodes", type=int, default=2048)
    ap.add_argument("--ticks", type=int, default=30, help="ticks, one a second of wall time")
    ap.add_argument("--crash-at", type=int, default=12, help="the tick at which a node of the job crashes")
    ap.add_argument("--nofile", type=int, default=1024, help="this process's soft RLIMIT_NOFILE (the daemon side)")
    ap.add_argument("--agent-interval", type=float, default=5.0)
    ap.add_argument("--farm", type=int, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.farm:
        farm_main(args.farm)
        return
    with tempfile.TemporaryDirectory(prefix="ssv-scale-") as tmp:
        figures = run(args, Path(tmp))
    figures["goal_met"] = bool(
        figures["tick_p99_s"] < 1.0
        and (figures["probe_sweep_s"] or 99) < 2.0
        and figures["ingest_p99_ms"] < 100
        and figures["emfile"] == 0
        and figures["recovered"]
    )
    rows = [(k, json.dumps(v) if isinstance(v, dict) else v) for k, v in figures.items()]
    print(table(rows, ("figure", "value")))
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
