"""Node reports accepted and evaluated per second by the daemon's ingest, on one core.

The real ingest (``supervisor.adapters.web.ingest``: asyncio + httptools, msgspec decoding, schema
checks, the GPU-health rules with hysteresis) listens on loopback in this process, pinned to one
CPU. Load generators run in other processes (pinned to the other CPUs when there are any), each
with many keep-alive connections, one request in flight per connection — as a fleet of agents
would — every request one batch carrying one fresh 8-GPU report of one of ``--nodes`` nodes
(sequence numbers increase, so every report is judged, none skipped as a duplicate); 1 in 200
reports carries an XID or a remap pending, so rules fire. Each connection comes from a loopback
address of its own, as each agent from its node (the server caps connections per address). The
ingest knows the run's job holds all ``--nodes`` nodes (``publish_job_nodes``), as after a tick.
Throughput = reports the ingest accepted in the measured window / window; latency = request sent →
answer read, at the client. ``--server uvicorn|aiohttp`` (with ``--loop``) serves the same
``ReportIngest`` from ``bench/_servers.py`` instead (ADR 0003; ``pip install uvicorn aiohttp uvloop``).

Last line JSON: ``reports_per_s``, ``p99_ms`` (and ``p50_ms``, ``goal_reports_per_s``, ``payload_bytes``,
``server_cpu_busy`` — the server thread's CPU share in the window — and
``one_core_capacity_reports_per_s`` = 1 / server CPU seconds per report: what the one core would
take if the generators could push harder; on a machine with few cores the generators, not the
server, are often the limit, and ``server_cpu_busy`` below 1 says so).
"""

from __future__ import annotations

import argparse
import json
import os
import selectors
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bench._common import quiet_logs, table  # noqa: E402,F401

GOAL = 10_000
TOKEN = "bench-token-0123456789abcdef"
RUN = "bench"


def gpu(i: int, fault: bool) -> dict[str, object]:
    g: dict[str, object] = {
        "i": i,
        "uuid": f"GPU-5a1d0000-0000-4000-8000-{i:012d}",
        "bus": f"00000000:{0x19 + 0x20 * i:02X}:00.0",
        "name": "NVIDIA H100 80GB HBM3",
        "ecc_cor_vol": 0,
        "ecc_unc_vol": 0,
        "ecc_cor_agg": 12,
        "ecc_unc_agg": 0,
        "retired_sbe": 0,
        "retired_dbe": 0,
        "retired_pending": False,
        "remap_cor": 0,
        "remap_unc": 0,
        "remap_pending": fault and i == 2,
        "remap_failed": False,
        "clocks": 0,
        "temp_c": 61,
        "power_w": 612.5,
        "sm_mhz": 1980,
        "util": 97,
        "mem_util": 41,
        "nvlink_replay": 0,
        "nvlink_recovery": 0,
        "nvlink_crc": 3,
        "recovery": 0,
    }
    return g


def body_template(node: str, fault: bool) -> tuple[bytes, bytes, bytes]:
    """The request body split around its seq and at values."""
    report = {
        "v": 1,
        "node": node,
        "seq": 0,
        "at": 0.0,
        "interval_s": 5.0,
        "source": "agent",
        "gpu_count": 8,
        "gpus": [gpu(i, fault) for i in range(8)],
        "xids": [{"gpu": 5, "xid": 79, "at": 1.0}] if fault else [],
        "host": {"mem_used_pct": 41.5, "mem_avail_mb": 1200000, "cpu_pct": 12.5, "load1": 3.2},
        "driver": "550.54.15",
    }
    text = json.dumps({"v": 1, "node": node, "dropped": 0, "reports": [report]}, separators=(",", ":"))
    head, rest = text.split('"seq":0', 1)
    mid, tail = rest.split('"at":0.0', 1)
    return (head + '"seq":').encode(), (mid + '"at":').encode(), tail.encode()


# ---------------------------------------------------------------------------- load generator
def generate(port: int, conns: int, duration: float, node_base: int, nodes: int, out: str) -> None:
    templates = [body_template(f"gpu{node_base + n:05d}", False) for n in range(nodes)]
    fault_templates = [body_template(f"gpu{node_base + n:05d}", True) for n in range(nodes)]
    seqs = [0] * nodes
    sel = selectors.DefaultSelector()
    state: dict[socket.socket, list] = {}
    counter = 0

    def request(sock: socket.socket) -> None:
        nonlocal counter
        n = counter % nodes
        counter += 1
        seqs[n] += 1
        head, mid, tail = (fault_templates if counter % 200 == 0 else templates)[n]
        body = b"%s%d%s%.3f%s" % (head, seqs[n], mid, time.time(), tail)
        req = (
            b"POST /v1/reports/%s HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer %s\r\n"
            b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n"
            % (RUN.encode(), TOKEN.encode(), len(body))
            + body
        )
        state[sock][0] = time.perf_counter()
        sock.sendall(req)

    for c in range(conns):  # each connection from an address of its own, as agents on their nodes
        here = node_base + c
        s = socket.create_connection(("127.0.0.1", port), source_address=(f"127.1.{here >> 8}.{here & 255 or 1}", 0))
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        state[s] = [0.0, b""]
        sel.register(s, selectors.EVENT_READ)
    latencies: list[float] = []
    statuses: dict[int, int] = {}
    end = time.perf_counter() + duration
    for s in state:
        request(s)
    while time.perf_counter() < end:
        for key, _ in sel.select(0.5):
            s = key.fileobj
            st = state[s]  # type: ignore[index]
            st[1] += s.recv(65536)  # type: ignore[union-attr]
            while b"\r\n\r\n" in st[1]:
                head, _, rest = st[1].partition(b"\r\n\r\n")
                length = int(head.lower().split(b"content-length: ", 1)[1].split(b"\r\n", 1)[0])
                if len(rest) < length:
                    break
                status = int(head[9:12])
                statuses[status] = statuses.get(status, 0) + 1
                st[1] = rest[length:]
                latencies.append(time.perf_counter() - st[0])
                if time.perf_counter() < end:
                    request(s)  # type: ignore[arg-type]
    np.save(out, np.array(latencies))
    Path(out + ".json").write_text(json.dumps({str(k): v for k, v in statuses.items()}))


# ---------------------------------------------------------------------------- the benchmark
def make_server(kind: str, loop: str, ingest: object):  # noqa: ANN201
    from supervisor.adapters.web.ingest import IngestServer

    if kind == "hand":
        return IngestServer(ingest, port=0)  # type: ignore[arg-type]
    from bench._servers import SERVERS
    from supervisor.adapters.web.ingest import REPORTS_PREFIX
    from supervisor.adapters.web.server import Router

    router = Router()
    router.mount(REPORTS_PREFIX, ingest.handle)  # type: ignore[attr-defined]
    return SERVERS[kind](router, loop=loop)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--duration", type=float, default=10.0, help="measured seconds (after 2 s of warm-up)")
    ap.add_argument("--generators", type=int, default=2)
    ap.add_argument("--conns", type=int, default=32, help="keep-alive connections per generator")
    ap.add_argument("--nodes", type=int, default=2048, help="distinct nodes across all generators")
    ap.add_argument("--server", choices=("hand", "uvicorn", "aiohttp"), default="hand", help="see ADR 0003")
    ap.add_argument("--loop", choices=("asyncio", "uvloop"), default="uvloop", help="uvicorn's and aiohttp's loop")
    ap.add_argument("--generate", nargs=6, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.generate:
        p, c, d, b, n, out = args.generate
        generate(int(p), int(c), float(d), int(b), int(n), out)
        return
    quiet_logs()
    import logging

    import structlog

    structlog.configure(
        wrapper_class=structlog.make_filtering_bound_logger(logging.ERROR),
        logger_factory=structlog.PrintLoggerFactory(sys.stderr),
    )
    from supervisor.adapters import gc_tuning
    from supervisor.adapters.clock import SystemClock
    from supervisor.adapters.web.ingest import ReportIngest
    from supervisor.domain.health.gpu_health import HealthRules

    cpus = sorted(os.sched_getaffinity(0))
    os.sched_setaffinity(0, {cpus[0]})  # the server: one core
    ingest = ReportIngest({RUN: TOKEN}, HealthRules(), SystemClock())
    ingest.publish_job_nodes({RUN: frozenset(f"gpu{n:05d}" for n in range(args.nodes))})  # the run's job
    server = make_server(args.server, args.loop, ingest)
    gc_tuning.settle()  # as the daemon does once wired
    server.start()
    warm, total = 2.0, args.duration + 2.0
    per = args.nodes // args.generators
    gen_cpus = cpus[1:] or cpus
    with tempfile.TemporaryDirectory(prefix="bench-ingest-") as tmp:
        procs = []
        for g in range(args.generators):
            out = f"{tmp}/lat{g}.npy"
            procs.append(
                (
                    out,
                    subprocess.Popen(  # noqa: S603 - fixed argv
                        [
                            sys.executable,
                            __file__,
                            "--generate",
                            str(server.port),
                            str(args.conns),
                            str(total + 0.5),
                            str(g * per),
                            str(per),
                            out[:-4],
                        ],
                        preexec_fn=lambda c=gen_cpus[g % len(gen_cpus)]: os.sched_setaffinity(0, {c}),
                    ),
                )
            )
        time.sleep(warm)
        before, t0, c0 = ingest.counters["reports"], time.perf_counter(), time.process_time()
        time.sleep(args.duration)
        after, t1, c1 = ingest.counters["reports"], time.perf_counter(), time.process_time()
        for _, p in procs:
            p.wait(60)
        lat = np.concatenate([np.load(out) for out, _ in procs]) * 1000
        statuses: dict[str, int] = {}
        for out, _ in procs:
            for k, v in json.loads(Path(out[:-4] + ".json").read_text()).items():
                statuses[k] = statuses.get(k, 0) + v
    server.stop()
    rate = (after - before) / (t1 - t0)
    payload = sum(len(x) for x in body_template("gpu00000", False)) + 6
    p50, p99 = float(np.percentile(lat, 50)), float(np.percentile(lat, 99))
    rows = [
        ["reports accepted and evaluated per s", f"{rate:,.0f}"],
        ["goal", f"{GOAL:,}"],
        ["latency p50 (ms)", f"{p50:.2f}"],
        ["latency p99 (ms)", f"{p99:.2f}"],
        ["payload (bytes, 8 GPUs)", payload],
        ["answers by status", json.dumps(statuses)],
        ["findings raised", ingest.counters["findings"]],
        ["connections", args.generators * args.conns],
        ["server CPU", f"1 (cpu {cpus[0]})"],
        ["server CPU busy", f"{(c1 - c0) / (t1 - t0):.0%}"],
        ["server CPU per report (us)", f"{(c1 - c0) / max(1, after - before) * 1e6:.0f}"],
    ]
    print(table(rows, ["measure", "value"]))
    per_report_s = (c1 - c0) / max(1, after - before)
    print(
        json.dumps(
            {
                "reports_per_s": round(rate),
                "p99_ms": round(p99, 2),
                "p50_ms": round(p50, 2),
                "goal_reports_per_s": GOAL,
                "payload_bytes": payload,
                "met": rate >= GOAL,
                "server_cpu_busy": round((c1 - c0) / (t1 - t0), 2),
                "one_core_capacity_reports_per_s": round(1 / per_report_s) if per_report_s else None,
            }
        )
    )


if __name__ == "__main__":
    main()
