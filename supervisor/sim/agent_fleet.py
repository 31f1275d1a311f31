"""A fleet of node agents over real HTTP on loopback, and the daemon's ingest in a process of its own
under a given RLIMIT_NOFILE: what the 2,048-agent test and ``bench/scale_sim.py`` drive (issue 14).

Each agent speaks from a loopback address of its own (127.1.x.y), as each agent from its node, and
the ingest is told that ``AGENT_NETWORK`` is where nodes speak from (``[ingest] node_networks``), so
each address counts as its own peer, as a node's would (any other loopback address is one peer,
``adapters.web.peers``). It POSTs one 8-GPU report per turn to ``/v1/reports/RUN``. ``keep_alive``: the agent keeps its
connection between turns (the worst case for the daemon's descriptors); otherwise it connects per
report, as ``HttpSender`` does. A refused, reset or evicted connection is retried on a new one
(within ``retry_s``), as the sender does. Latency = first send of a report → its answer.

    python -m supervisor.sim.agent_fleet agents PORT RUN TOKEN FIRST COUNT TURNS INTERVAL KEEP  # JSON out
    python -m supervisor.sim.agent_fleet ingest RUN TOKEN NODES NOFILE                          # port, then JSON
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import resource
import sys
import threading
import time
from collections import Counter
from collections.abc import MutableMapping
from dataclasses import replace
from typing import Any

from supervisor.domain.health.node_report import SCHEMA_VERSION, GpuSample, NodeReport, to_wire

RETRY_PAUSE_S = (0.02, 0.2)
AGENT_NETWORK = "127.1.0.0/16"  # the fleet's "compute nodes' subnet": agent_address(i) lies in it


def agent_address(i: int) -> str:
    """Agent ``i``'s own loopback address (127.1.0.1 ...)."""
    return f"127.1.{(i + 1) >> 8}.{((i + 1) & 255) or 1}"


def node_name(i: int) -> str:
    return f"n{i + 1:04d}"


def report_body(node: str, seq: int) -> bytes:
    gpus = tuple(GpuSample(i=g, bus=f"00000000:{g:02X}:00.0", ecc_unc_vol=0, temp_c=55) for g in range(8))
    report = NodeReport(v=SCHEMA_VERSION, node=node, seq=seq, at=time.time(), interval_s=5.0, gpus=gpus)
    wire = {"v": SCHEMA_VERSION, "node": node, "dropped": 0, "reports": [to_wire(report)]}
    return json.dumps(wire, separators=(",", ":")).encode()


class BodyTemplate:
    """One node's report body, built once; each turn only its seq and time change (cheap enough
    for one process to speak for a thousand agents)."""

    def __init__(self, node: str) -> None:
        text = report_body(node, 123456789).decode()
        self.head, rest = text.split('"seq":123456789', 1)
        at = rest.index('"at":') + len('"at":')
        end = min(i for i in (rest.find(",", at), rest.find("}", at)) if i >= 0)
        self.mid, self.tail = rest[:at], rest[end:]

    def body(self, seq: int) -> bytes:
        return f'{self.head}"seq":{seq}{self.mid}{time.time():.3f}{self.tail}'.encode()


def raise_nofile(soft: int | None = None) -> None:
    """This process's soft limit: ``soft``, or the hard limit."""
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (soft if soft is not None else hard, hard))


# ---------------------------------------------------------------------------- the agents
class Agent:
    def __init__(self, index: int, port: int, run: str, token: str, keep_alive: bool, retry_s: float) -> None:
        self.index, self.port, self.keep_alive, self.retry_s = index, port, keep_alive, retry_s
        self.head = f"POST /v1/reports/{run} HTTP/1.1\r\nHost: daemon\r\nAuthorization: Bearer {token}\r\n"
        self.streams: tuple[asyncio.StreamReader, asyncio.StreamWriter] | None = None
        self.latencies: list[float] = []
        self.statuses: Counter[str] = Counter()
        self.retries = 0
        self.template = BodyTemplate(node_name(index))

    async def report(self, seq: int) -> None:
        body = self.template.body(seq)
        request = (self.head + f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n").encode()
        started = time.perf_counter()
        while True:
            try:
                status = await self._exchange(request + body)
                break
            except (OSError, asyncio.IncompleteReadError, ValueError):
                self._drop()
                if time.perf_counter() - started > self.retry_s:
                    self.statuses["gave_up"] += 1
                    return
                self.retries += 1
                await asyncio.sleep(random.uniform(*RETRY_PAUSE_S))
        self.latencies.append(time.perf_counter() - started)
        self.statuses[str(status)] += 1
        if not self.keep_alive:
            self._drop()

    async def _exchange(self, request: bytes) -> int:
        if self.streams is None:
            self.streams = await asyncio.open_connection(
                "127.0.0.1", self.port, local_addr=(agent_address(self.index), 0)
            )
        reader, writer = self.streams
        writer.write(request)
        await writer.drain()
        head = await reader.readuntil(b"\r\n\r\n")
        length = int(head.lower().split(b"content-length:", 1)[1].split(b"\r\n", 1)[0])
        await reader.readexactly(length)
        if b"connection: close" in head.lower():
            self._drop()
        return int(head[9:12])

    def _drop(self) -> None:
        if self.streams is not None:
            self.streams[1].transport.abort()  # the agent's side: no TIME_WAIT left at the daemon
            self.streams = None


async def _run_agents(agents: list[Agent], turns: int, interval: float) -> None:
    async def one(agent: Agent) -> None:
        if interval > 0:
            await asyncio.sleep(random.uniform(0, interval))  # agents start at random points
        for turn in range(turns):
            due = time.perf_counter() + interval
            await agent.report(turn + 1)
            await asyncio.sleep(max(0.0, due - time.perf_counter()))
        agent._drop()

    await asyncio.gather(*(one(a) for a in agents))


def agents_main(
    port: int, run: str, token: str, first: int, count: int, turns: int, interval: float, keep: bool
) -> None:
    raise_nofile()
    agents = [Agent(first + i, port, run, token, keep, retry_s=30.0) for i in range(count)]
    asyncio.run(_run_agents(agents, turns, interval))
    statuses: Counter[str] = Counter()
    for agent in agents:
        statuses.update(agent.statuses)
    print(
        json.dumps(
            {
                "latencies": [x for a in agents for x in a.latencies],
                "statuses": dict(statuses),
                "retries": sum(a.retries for a in agents),
            }
        )
    )


# ---------------------------------------------------------------------------- the ingest
class EventCounter:
    """A structlog processor counting events by name (the ingest's warnings), then dropping them."""

    def __init__(self) -> None:
        self.counts: Counter[str] = Counter()

    def __call__(self, _: Any, __: str, event: MutableMapping[str, Any]) -> Any:
        self.counts[str(event.get("event"))] += 1
        import structlog

        raise structlog.DropEvent


def open_descriptors() -> int:
    return len(os.listdir("/proc/self/fd"))


def ingest_main(run: str, token: str, nodes: int, nofile: int) -> None:
    """The real ingest under a soft RLIMIT_NOFILE of ``nofile``; prints its port, serves until
    stdin closes, then prints its counters, the events it logged and the most descriptors held."""
    import structlog

    from supervisor.adapters.clock import SystemClock
    from supervisor.adapters.web.ingest import IngestServer, ReportIngest
    from supervisor.domain.health.gpu_health import HealthRules

    raise_nofile(nofile)
    events = EventCounter()
    structlog.configure(processors=[events])
    ingest = ReportIngest({run: token}, HealthRules(), SystemClock())
    ingest.publish_job_nodes({run: frozenset(node_name(i) for i in range(nodes))})
    server = IngestServer(ingest, port=0)
    server.limits = replace(server.limits, node_networks=(AGENT_NETWORK,))
    server.start()
    most = [open_descriptors()]
    stop = threading.Event()

    def sample() -> None:
        while not stop.wait(0.02):
            most[0] = max(most[0], open_descriptors())

    threading.Thread(target=sample, daemon=True).start()
    print(server.port, flush=True)
    sys.stdin.read()
    stop.set()
    server.stop()
    out = {"counters": dict(ingest.counters), "events": dict(events.counts), "most_fds": most[0]}
    out["tracked"] = len(ingest.heartbeat_ages(time.time()))
    print(json.dumps(out), flush=True)


if __name__ == "__main__":
    kind, *args = sys.argv[1:]
    if kind == "agents":
        p, r, t, f, c, n, i, k = args
        agents_main(int(p), r, t, int(f), int(c), int(n), float(i), k == "keep")
    else:
        ingest_main(args[0], args[1], int(args[2]), int(args[3]))
