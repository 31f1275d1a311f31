"""The agent's connection to the ingest (issue 14): held only while it sends, so 2,048 agents
reporting every few seconds cost the daemon a handful of descriptors, not 2,048."""

from __future__ import annotations

import time

from supervisor.adapters.clock import SystemClock
from supervisor.adapters.web.ingest import IngestServer, ReportIngest
from supervisor.agent.sender import HttpSender, SenderSettings
from supervisor.domain.health.gpu_health import HealthRules
from supervisor.domain.health.node_report import SCHEMA_VERSION, GpuSample, NodeReport

TOKEN = "token-0123456789abcdef"


def report(seq: int) -> NodeReport:
    gpus = (GpuSample(i=0, bus="00000000:01:00.0", ecc_unc_vol=0, temp_c=50),)
    return NodeReport(v=SCHEMA_VERSION, node="gpu001", seq=seq, at=time.time(), interval_s=5.0, gpus=gpus)


def connections_after(server: IngestServer, settle_s: float = 2.0) -> int:
    deadline = time.monotonic() + settle_s
    while server.connections and time.monotonic() < deadline:
        time.sleep(0.01)
    return server.connections


def serve() -> IngestServer:
    ingest = ReportIngest({"run": TOKEN}, HealthRules(), SystemClock())
    ingest.publish_job_nodes({"run": frozenset({"gpu001"})})
    server = IngestServer(ingest, port=0)
    server.start()
    return server


def test_the_sender_lets_go_of_its_connection_between_reports():
    server = serve()
    try:
        sender = HttpSender(f"http://127.0.0.1:{server.port}", "run", TOKEN, "gpu001")
        for seq in (1, 2):
            sender.add(report(seq))
            assert sender.flush(time.monotonic())
            assert connections_after(server) == 0
        assert server.ingest.counters["reports"] == 2
    finally:
        server.stop()


def test_keep_alive_when_asked_holds_one_connection():
    server = serve()
    try:
        sender = HttpSender(f"http://127.0.0.1:{server.port}", "run", TOKEN, "gpu001", SenderSettings(keep_alive=True))
        sender.add(report(1))
        assert sender.flush(time.monotonic())
        assert connections_after(server, settle_s=0.3) == 1
        sender.close()
    finally:
        server.stop()
