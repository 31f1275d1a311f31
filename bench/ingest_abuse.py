"""Honest agents report to the daemon's HTTP port while it is under attack (issue 17, item 2).

The real ingest server (``IngestServer`` with ``ReportIngest``, and the read-token pages rendered in
their child process, as the daemon wires them, over a store of ``--events`` logbook events) listens
on loopback in this process, whose RLIMIT_NOFILE is cut to 1,024 (systemd's default); a stand-in
for the engine in this process opens what a tick opens (16 files, SQLite, a ``true`` subprocess)
every 100 ms and counts failures. ``--agents`` honest agents (the real ``HttpSender``, each from a
loopback address of its own, as from its own node) report every ``--interval`` s from a child
process. First ``--calm`` seconds without attack (the baseline), then ``--duration`` seconds with
three attackers (``--attacks``), each a child process connecting from addresses of its own:

* ``idle``: 1,000 connections from 100 addresses that say nothing, reopened as they are closed;
* ``bigline``: 100 MiB request lines and 100 MiB header values, one after the other;
* ``loopback``: the login-node tenant (issue 32, finding 5): 48 loopback addresses x 32
  connections, each trickling a byte of a valid report every 4 s (the honest agents' 127.1.x.y are
  the server's ``node_networks``; every other loopback address counts as one peer);
* ``pages``: 20 connections each pipelining 50 unauthenticated ``GET /runs/R/logbook``, and 4 with
  the read token pipelining 20 logbook and ``/metrics`` requests: 2 reading the answers, 2 never.

A report is *delivered* when its batch got a 200; latency = report made → delivered (the sender's
retries and backoff included); *lost* = never delivered, dropped or rejected. RSS is this process's
(the server's) plus its page renderer's, sampled every 50 ms. Last line JSON: ``honest_p99_ms``
(goal < 100), ``honest_lost`` (goal 0), ``rss_mb_peak`` (goal < 300), ``engine_errors`` (goal 0),
the baseline's ``baseline_p99_ms``, and ``rss_mb_peak_server``/``_renderer``. ``--server
uvicorn|aiohttp`` runs the same against ``bench/_servers.py`` (ADR 0003). ~1 minute, loopback only.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import resource
import socket
import sqlite3
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
import psutil
import structlog

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bench._common import quiet_logs, table  # noqa: E402

RUN, TOKEN, READ_TOKEN = "llm", "run-token-0123456789abcdef", "read-token-0123456789abcdef"
GOALS = {"honest_p99_ms": 100, "honest_lost": 0, "rss_mb_peak": 300, "engine_errors": 0}
MiB = 1 << 20


# ---------------------------------------------------------------------------- the children
class Agent:
    """One honest agent: the real ``HttpSender``, from its node's own loopback address."""

    def __init__(self, n: int, port: int, interval: float, end: float) -> None:
        from supervisor.agent.sender import HttpSender, SenderSettings
        from supervisor.domain.health.node_report import GpuSample

        address = f"127.1.{n >> 8}.{(n & 255) + 1}"

        class NodeSender(HttpSender):
            def _connect(self, to: tuple[str, int], timeout: float | None, source: object = None) -> socket.socket:
                return socket.create_connection(to, timeout, source_address=(address, 0))

        self.sender = NodeSender(f"http://127.0.0.1:{port}", RUN, TOKEN, f"gpu{n:04d}", SenderSettings(timeout_s=5.0))
        self.gpus = tuple(GpuSample(i=i, bus=f"00000000:{i:02X}:00.0", temp_c=50, util=97) for i in range(8))
        self.interval, self.end, self.seq = interval, end, 0
        self.next_at = time.time() + (n % 10) * interval / 10
        self.made: list[float] = []
        self.delivered: list[tuple[float, float]] = []  # (made, latency)

    def run(self) -> None:
        while time.time() < self.end or (self.made and time.time() < self.end + 10):
            self._report(time.time())
            if self.made and self.sender.flush(time.time()):
                done = time.time()
                self.delivered.extend((m, done - m) for m in self.made)
                self.made.clear()
            time.sleep(0.01)
        self.sender.close()

    def _report(self, now: float) -> None:
        from supervisor.domain.health.node_report import SCHEMA_VERSION, NodeReport

        if now >= self.next_at and now < self.end:
            self.seq, self.next_at = self.seq + 1, self.next_at + self.interval
            node = self.sender.node
            self.sender.add(NodeReport(SCHEMA_VERSION, node, self.seq, now, self.interval, gpus=self.gpus))
            self.made.append(now)

    @property
    def lost(self) -> int:
        return len(self.made) + self.sender.dropped_total + self.sender.rejected_total


def agents(port: int, count: int, interval: float, calm: float, duration: float, out: str) -> None:
    fleet = [Agent(n, port, interval, time.time() + calm + duration) for n in range(count)]
    threads = [threading.Thread(target=a.run) for a in fleet]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    results = [d for a in fleet for d in a.delivered]
    Path(out).write_text(json.dumps({"results": results, "lost": sum(a.lost for a in fleet)}))


def attacker_socket(port: int, address: str, timeout: float = 10.0) -> socket.socket | None:
    """A connection from ``address``; None when the server did not take it."""
    s = socket.socket()
    try:
        s.bind((address, 0))
        s.settimeout(timeout)
        s.connect(("127.0.0.1", port))
    except OSError:
        s.close()
        return None
    return s


def idle(port: int, duration: float, out: str) -> None:
    held: dict[int, socket.socket] = {}
    opened = 0
    end = time.time() + duration
    while time.time() < end:
        for i in range(1000):
            if time.time() >= end:
                break
            s = held.get(i)
            if s is not None:
                s.setblocking(False)
                try:
                    if s.recv(1) == b"":  # closed by the server: open another
                        s.close()
                        s = None
                except BlockingIOError:
                    pass
                except OSError:
                    s.close()
                    s = None
            if s is None:
                fresh = attacker_socket(port, f"127.2.{i % 100}.{i // 100 + 1}", 1.0)
                if fresh is None:
                    held.pop(i, None)
                else:
                    held[i], opened = fresh, opened + 1
        time.sleep(0.2)
    Path(out).write_text(json.dumps({"opened": opened, "held_at_end": len(held)}))


def loopback(port: int, duration: float, out: str) -> None:
    """The login-node tenant (issue 32, finding 5): 48 loopback addresses x 32 connections, each
    trickling the next byte of a valid report every 4 s, reopened as they are closed."""
    request = b"POST /v1/reports HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n{}"
    held: dict[int, tuple[socket.socket, int]] = {}
    opened, end, next_byte = 0, time.time() + duration, 0.0
    while time.time() < end:
        trickle = time.time() >= next_byte
        next_byte = next_byte if not trickle else time.time() + 4
        for i in range(48 * 32):
            s, sent = held.get(i, (None, 0))
            if s is not None and trickle:
                try:
                    s.send(request[sent : sent + 1])
                    held[i] = (s, min(sent + 1, len(request) - 1))
                except OSError:
                    s.close()
                    s = None
            if s is None:
                fresh = attacker_socket(port, f"127.0.{i % 48}.77", 0.2)
                if fresh is None:
                    held.pop(i, None)
                    continue
                try:
                    fresh.send(request[:1])
                except OSError:
                    fresh.close()
                    continue
                held[i], opened = (fresh, 1), opened + 1
        time.sleep(0.2)
    Path(out).write_text(json.dumps({"opened": opened, "held_at_end": len(held)}))


def bigline(port: int, duration: float, out: str) -> None:
    chunk = b"a" * (1 << 16)
    taken: list[int] = []
    end = time.time() + duration
    while time.time() < end:
        for start in (b"GET /", b"GET / HTTP/1.1\r\nX-Pad: "):
            sent, s = 0, attacker_socket(port, "127.3.0.1")
            if s is None:
                continue
            try:
                s.sendall(start)
                while sent < 100 * MiB and time.time() < end:
                    sent += s.send(chunk)
            except OSError:
                pass
            s.close()
            taken.append(sent)
        time.sleep(0.05)
    Path(out).write_text(json.dumps({"attempts": len(taken), "max_bytes_taken": max(taken, default=0)}))


def pages(port: int, duration: float, out: str) -> None:
    anon = b"GET /runs/%s/logbook HTTP/1.1\r\nHost: x\r\n\r\n" % RUN.encode()
    auth = b"Authorization: Bearer %s\r\n\r\n" % READ_TOKEN.encode()
    read = b"GET /runs/%s/logbook HTTP/1.1\r\nHost: x\r\n%s" % (RUN.encode(), auth)
    read += b"GET /metrics HTTP/1.1\r\nHost: x\r\n" + auth
    received = [0]

    def reader(s: socket.socket) -> None:
        try:
            while data := s.recv(1 << 20):
                received[0] += len(data)
        except OSError:
            pass

    end = time.time() + duration
    while time.time() < end:
        socks = []
        for i in range(24):
            s = attacker_socket(port, f"127.4.0.{i + 1}")
            try:
                if s is None:
                    continue  # refused, or not accepted in time
                s.sendall(anon * 50 if i < 20 else read * 10)
            except OSError:
                continue
            socks.append(s)
            if i < 22:  # the last two never read
                threading.Thread(target=reader, args=(s,), daemon=True).start()
        time.sleep(min(5.0, max(0.0, end - time.time())))
        for s in socks:
            s.close()
    Path(out).write_text(json.dumps({"received_mb": round(received[0] / MiB, 1)}))


# ---------------------------------------------------------------------------- the server side
def build_store(path: Path, events: int) -> None:
    from supervisor.adapters.sqlite import SqliteStore
    from supervisor.domain.records import Event, EventKind
    from supervisor.domain.run import RunSpec

    store = SqliteStore(path)
    store.add_run(RunSpec(name=RUN, script="/x.sbatch", partition="gpu", nodes=2), 1000.0)
    store.add_attempt(RUN, 100, 0, 1000.0)
    store.attempt_started(RUN, 0, ("n1", "n2"), 1010.0)
    with store.transaction():
        for i in range(events):
            text = f"note {i}: " + "operator text " * 20
            store.record_event(Event(RUN, EventKind.NOTE, text, f"n{i}", 1010.0 + i, 0, 100, "alice"))
    store.close()


def engine(stop: threading.Event, work: Path, errors: list[str]) -> None:
    """What a tick opens: files, the SQLite store, a Slurm client (here ``true``)."""
    while not stop.wait(0.1):
        try:
            files = [open(work / f"tick{i}", "w") for i in range(16)]  # noqa: SIM115
            for f in files:
                f.close()
            db = sqlite3.connect(work / "engine.db")
            db.execute("CREATE TABLE IF NOT EXISTS t(x)")
            db.close()
            subprocess.run(["true"], check=True)
        except OSError as exc:
            errors.append(str(exc))


def sample_rss(stop: threading.Event, peak: list[float]) -> None:
    """Peaks of this process plus the page renderer it started (not the bench's attackers and
    agents): [together, this process, the renderer], MB."""
    me = psutil.Process()
    while not stop.wait(0.05):
        renderers = [c for c in me.children() if "supervisor.adapters.web.renderer" in _cmdline(c)]
        mine, theirs = _rss(me) / MiB, sum(_rss(c) for c in renderers) / MiB
        peak[:] = [max(peak[0], mine + theirs), max(peak[1], mine), max(peak[2], theirs)]


def _cmdline(p: psutil.Process) -> list[str]:
    try:
        return p.cmdline()
    except psutil.Error:
        return []


def _rss(p: psutil.Process) -> int:
    try:
        return int(p.memory_info().rss)
    except psutil.Error:
        return 0


def start_server(kind: str, store_dir: Path, agents_n: int):  # noqa: ANN201
    from supervisor.adapters.clock import SystemClock
    from supervisor.adapters.web.ingest import IngestServer, ReportIngest
    from supervisor.adapters.web.pages import mount_pages
    from supervisor.adapters.web.renderer import ProcessRenderer
    from supervisor.domain.health.gpu_health import HealthRules

    feed = ReportIngest({RUN: TOKEN}, HealthRules(), SystemClock())
    feed.publish_job_nodes({RUN: frozenset(f"gpu{n:04d}" for n in range(agents_n))})
    server = IngestServer(feed, port=0)
    # the honest agents' "nodes" (127.1.x.y) are the compute subnet; the attackers' loopback addresses count as one peer
    server.limits = replace(server.limits, node_networks=("127.1.0.0/16",))
    mount_pages(server, ProcessRenderer(store_dir), READ_TOKEN)  # as the daemon's wiring does
    if kind != "hand":
        from bench._servers import SERVERS

        server = SERVERS[kind](server.router)
    server.start()
    return server


def spawn(role: str, *args: object) -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, __file__, "--role", role, *map(str, args)])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--agents", type=int, default=64)
    ap.add_argument("--interval", type=float, default=1.0, help="seconds between an agent's reports")
    ap.add_argument("--calm", type=float, default=10.0, help="seconds of baseline before the attack")
    ap.add_argument("--duration", type=float, default=30.0, help="seconds under attack")
    ap.add_argument("--events", type=int, default=20000, help="logbook events of the paged run")
    ap.add_argument("--server", choices=("hand", "uvicorn", "aiohttp"), default="hand")
    ap.add_argument("--attacks", default="idle,bigline,pages,loopback", help="which attackers (comma-separated)")
    ap.add_argument("--role", nargs="+", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.role:
        structlog.configure(  # the agents' warnings (retries under attack) are counted, not printed
            wrapper_class=structlog.make_filtering_bound_logger(int(os.environ.get("ABUSE_LOG_LEVEL", logging.ERROR))),
            logger_factory=structlog.PrintLoggerFactory(sys.stderr),
        )
        role, *rest = args.role
        hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, 65536), hard))  # the attackers' own limit
        kinds = ROLES[role]
        ROLE_MAIN[role](*[kind(x) for kind, x in zip(kinds, rest, strict=True)])
        return
    quiet_logs()
    resource.setrlimit(resource.RLIMIT_NOFILE, (1024, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
    with tempfile.TemporaryDirectory(prefix="bench-abuse-") as tmp:
        run(args, Path(tmp))


def run(args: argparse.Namespace, tmp: Path) -> None:
    build_store(tmp, args.events)
    server = start_server(args.server, tmp, args.agents)
    stop, errors, peak = threading.Event(), [], [0.0, 0.0, 0.0]
    for target, targs in ((engine, (stop, tmp, errors)), (sample_rss, (stop, peak))):
        threading.Thread(target=target, args=targs, daemon=True).start()
    started = time.time()
    honest = spawn("agents", server.port, args.agents, args.interval, args.calm, args.duration, tmp / "agents.json")
    time.sleep(args.calm)
    rss_calm = peak[0]
    attackers = [spawn(r, server.port, args.duration, tmp / f"{r}.json") for r in args.attacks.split(",")]
    for p in [*attackers, honest]:
        try:
            p.wait(max(1.0, started + args.calm + args.duration + 30 - time.time()))
        except subprocess.TimeoutExpired:
            p.kill()  # bounded: an attacker stuck on a server that no longer accepts
    stop.set()
    server.stop()
    report(args, tmp, started, errors, peak, rss_calm, getattr(server, "counters", {}))


def report(args, tmp, started, errors, rss_peaks, rss_calm, counters) -> None:  # noqa: ANN001
    got = json.loads((tmp / "agents.json").read_text())
    made = np.array([m for m, _ in got["results"]])
    lat = np.array([latency for _, latency in got["results"]]) * 1000
    calm = lat[made < started + args.calm] if len(lat) else lat
    attack = lat[made >= started + args.calm + 1] if len(lat) else lat
    attacks = {r: _read(tmp / f"{r}.json") for r in args.attacks.split(",")}
    figures = {
        "honest_p99_ms": round(float(np.percentile(attack, 99)), 1) if len(attack) else None,
        "honest_lost": got["lost"],
        "rss_mb_peak": round(rss_peaks[0], 1),
        "engine_errors": len(errors),
        "baseline_p99_ms": round(float(np.percentile(calm, 99)), 1) if len(calm) else None,
        "p99_vs_baseline": round(float(np.percentile(attack, 99) / np.percentile(calm, 99)), 2)
        if len(attack) and len(calm)
        else None,
        "honest_p50_ms": round(float(np.percentile(attack, 50)), 1) if len(attack) else None,
        "honest_delivered": int(len(lat)),
        "rss_mb_peak_server": round(rss_peaks[1], 1),
        "rss_mb_peak_renderer": round(rss_peaks[2], 1),
        "server": args.server,
    }
    figures["met"] = all(figures[k] is not None and figures[k] <= v for k, v in GOALS.items())  # type: ignore[operator]
    rows: list[list[object]] = [[k, v] for k, v in figures.items()]
    rows += [["rss_mb before the attack", round(rss_calm, 1)]]
    rows += [[f"attacker {r}", json.dumps(v)] for r, v in attacks.items()]
    rows += [
        [
            "server counters",
            json.dumps(
                {k: v for k, v in dict(counters).items() if k.startswith(("closed", "rej", "refused", "evicted"))}
            ),
        ]
    ]
    rows += [["engine error (first)", errors[0] if errors else "-"]]
    print(table(rows, ["measure", "value"]))
    print(json.dumps(figures))


def _read(path: Path) -> object:
    return json.loads(path.read_text()) if path.exists() else "(the attacker failed: see stderr)"


ROLE_MAIN = {"agents": agents, "idle": idle, "bigline": bigline, "pages": pages, "loopback": loopback}
ROLES = {
    "agents": (int, int, float, float, float, str),
    **dict.fromkeys(("idle", "bigline", "pages", "loopback"), (int, float, str)),
}


if __name__ == "__main__":
    main()
