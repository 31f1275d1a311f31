"""Node agents and hooks find the leader among several login nodes' daemons (issue 33, item 4): a
job is given every daemon's URL, the submitting leader's first; a standby's ingest answers 503 (it
would keep the report where no tick reads it), a login node that is down does not answer, and the
sender then tries the next URL at once, keeps the one that took the batch, and moves on again
after a failover. Real ingest servers on loopback, the standby's word from a real Leadership-like
check (``NotLeading``)."""

from __future__ import annotations

import socket
import time

from supervisor.adapters.clock import SystemClock
from supervisor.adapters.web.ingest import IngestServer, ReportIngest
from supervisor.agent.sender import HttpSender
from supervisor.domain.health.gpu_health import HealthRules
from supervisor.domain.health.node_report import SCHEMA_VERSION, GpuSample, NodeReport
from supervisor.ports import NotLeading

TOKEN = "token-0123456789abcdef"


class Standing:
    """What ``Leadership.may_act`` says of one daemon: leads or stands by."""

    def __init__(self, leads: bool) -> None:
        self.leads = leads

    def may_act(self) -> None:
        if not self.leads:
            raise NotLeading("this daemon is a standby: another login node's daemon leads the instance")


def report(seq: int) -> NodeReport:
    gpus = (GpuSample(i=0, bus="00000000:01:00.0", ecc_unc_vol=0, temp_c=50),)
    return NodeReport(v=SCHEMA_VERSION, node="gpu001", seq=seq, at=time.time(), interval_s=5.0, gpus=gpus)


def daemon(standing: Standing) -> IngestServer:
    ingest = ReportIngest({"run": TOKEN}, HealthRules(), SystemClock())
    ingest.publish_job_nodes({"run": frozenset({"gpu001"})})
    ingest.follow_leadership(standing.may_act)
    server = IngestServer(ingest, port=0)
    server.start()
    return server


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_a_standby_refuses_reports_with_503_and_the_leader_takes_them():
    standby = daemon(Standing(leads=False))
    try:
        sender = HttpSender(f"http://127.0.0.1:{standby.port}", "run", TOKEN, "gpu001")
        sender.add(report(1))
        assert not sender.flush(time.monotonic())
        assert standby.ingest.counters["rejected_503"] == 1 and standby.ingest.counters["reports"] == 0
        assert sender.problem is not None and sender.problem.startswith("503")
    finally:
        standby.stop()


def test_the_sender_passes_a_dead_login_node_and_a_standby_and_keeps_the_leader():
    first, second = Standing(leads=False), Standing(leads=True)
    standby, leader = daemon(first), daemon(second)
    try:
        urls = f"http://127.0.0.1:{closed_port()},http://127.0.0.1:{standby.port},http://127.0.0.1:{leader.port}"
        sender = HttpSender(urls, "run", TOKEN, "gpu001")
        sender.add(report(1))
        assert sender.flush(time.monotonic())  # at once: no backoff between URLs
        assert leader.ingest.counters["reports"] == 1 and standby.ingest.counters["rejected_503"] == 1
        sender.add(report(2))
        assert sender.flush(time.monotonic())
        assert leader.ingest.counters["reports"] == 2 and standby.ingest.counters["requests"] == 1  # kept
        first.leads, second.leads = True, False  # a failover: the other login node's daemon leads now
        sender.add(report(3))
        assert sender.flush(time.monotonic())
        assert standby.ingest.counters["reports"] == 1 and leader.ingest.counters["rejected_503"] == 1
    finally:
        standby.stop(), leader.stop()


def test_when_no_url_takes_the_batch_the_sender_backs_off_and_keeps_it():
    standby = daemon(Standing(leads=False))
    try:
        sender = HttpSender(f"http://127.0.0.1:{closed_port()},http://127.0.0.1:{standby.port}", "run", TOKEN, "gpu001")
        sender.add(report(1))
        now = time.monotonic()
        assert not sender.flush(now) and sender.pending == 1
        assert not sender.flush(now)  # backing off: not even asked
        assert standby.ingest.counters["requests"] == 1
    finally:
        standby.stop()
