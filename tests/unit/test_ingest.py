"""The daemon's ingest over real HTTP on loopback: authentication, validation, hostile input,
findings and heartbeats for the engine (HealthFeed)."""

from __future__ import annotations

import http.client
import json
import socket
from collections.abc import Iterator

import pytest
from msgspec.structs import replace

from supervisor.adapters.web.ingest import IngestServer, ReportIngest, Request, Response
from supervisor.agent.sender import HttpSender, SenderSettings
from supervisor.domain.health.findings import Severity
from supervisor.domain.health.gpu_health import HealthRules
from supervisor.domain.health.node_report import SCHEMA_VERSION, GpuSample, NodeReport, XidEvent, to_wire
from supervisor.ports import HealthFeed
from supervisor.testing.kit.clock import ManualClock

TOKENS = {"run-a": "token-a-0123456789", "run-b": "token-b-0123456789"}
JOBS = {"run-a": frozenset({"gpu001", "a"}), "run-b": frozenset({"gpu001", "b"})}  # each run's job's nodes


def new_ingest(clock: ManualClock) -> ReportIngest:
    ingest = ReportIngest(dict(TOKENS), HealthRules(), clock)
    ingest.publish_job_nodes(JOBS)  # what the engine does every tick
    return ingest


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock()


@pytest.fixture
def server(clock: ManualClock) -> Iterator[IngestServer]:
    srv = IngestServer(new_ingest(clock), port=0, max_body=64 * 1024)
    srv.start()
    yield srv
    srv.stop()


def report(node: str = "gpu001", seq: int = 1, **kw: object) -> NodeReport:
    gpus = tuple(GpuSample(i=i, bus=f"00000000:{i:02X}:00.0", ecc_unc_vol=0, temp_c=50) for i in range(8))
    return NodeReport(v=SCHEMA_VERSION, node=node, seq=seq, at=float(seq), interval_s=5.0, gpus=gpus, **kw)  # type: ignore[arg-type]


def body(*reports: NodeReport, node: str = "gpu001", dropped: int = 0) -> bytes:
    wire = {"v": 1, "node": node, "dropped": dropped, "reports": [to_wire(r) for r in reports or (report(),)]}
    return json.dumps(wire).encode()


def post(
    server: IngestServer,
    data: bytes,
    *,
    run: str = "run-a",
    token: str | None = TOKENS["run-a"],
    method: str = "POST",
    path: str | None = None,
) -> tuple[int, dict[str, object]]:
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=5)
    headers = {"Content-Type": "application/json"}
    if token is not None:
        headers["Authorization"] = f"Bearer {token}"
    conn.request(method, path or f"/v1/reports/{run}", body=data, headers=headers)
    response = conn.getresponse()
    status, text = response.status, response.read()
    conn.close()
    return status, json.loads(text)


def test_accepted_report_becomes_findings_and_a_heartbeat(server: IngestServer, clock: ManualClock) -> None:
    feed: HealthFeed = server.ingest
    xid = report(xids=(XidEvent(gpu=3, xid=79, at=1.0),))
    status, answer = post(server, body(xid))
    assert (status, answer) == (200, {"accepted": 1, "duplicates": 0, "findings": 1})
    (f,) = feed.drain_findings()
    assert (f.node, f.run, f.rule, f.severity, f.at) == ("gpu001", "run-a", "xid-79@1", Severity.FATAL, 1000.0)
    assert feed.drain_findings() == []
    clock.advance(7.5)
    assert feed.heartbeat_ages(clock.now()) == {"gpu001": 7.5}
    assert server.ingest.heartbeat_intervals() == {"gpu001": 5.0}


def test_batch_sent_again_counts_once(server: IngestServer) -> None:
    data = body(report(seq=1), report(seq=2, xids=(XidEvent(gpu=0, xid=48, at=2.0),)))
    assert post(server, data)[1] == {"accepted": 2, "duplicates": 0, "findings": 1}
    assert post(server, data)[1] == {"accepted": 0, "duplicates": 2, "findings": 0}
    assert len(server.ingest.drain_findings()) == 1


@pytest.mark.parametrize(
    ("kwargs", "status", "reason"),
    [
        ({"token": None}, 401, "missing 'Authorization: Bearer TOKEN'"),
        ({"token": "guess"}, 403, "not run 'run-a''s token"),
        ({"token": TOKENS["run-b"]}, 403, "not run 'run-a''s token"),  # another run's token
        ({"run": "nope"}, 404, "no supervised run named 'nope'"),
        ({"path": "/v1/reports/../../etc"}, 404, "POST reports to /v1/reports/RUN"),
        ({"path": "/admin"}, 404, "no such path"),
        ({"method": "PUT"}, 405, "POST"),
    ],
)
def test_forged_or_misdirected_requests_are_refused(
    server: IngestServer, kwargs: dict[str, object], status: int, reason: str
) -> None:
    got, answer = post(server, body(report(xids=(XidEvent(gpu=0, xid=79, at=1.0),))), **kwargs)  # type: ignore[arg-type]
    assert got == status and reason in str(answer["error"])
    assert server.ingest.drain_findings() == [] and server.ingest.heartbeat_ages(0) == {}


@pytest.mark.parametrize(
    ("data", "status", "reason"),
    [
        (b"{", 400, "malformed report batch"),
        (b"[]", 400, "Expected `object`"),
        (b'{"v":1,"node":"n","reports":[{"v":1,"node":"n","seq":"one","at":1}]}', 400, "reports[0].seq"),
        (b'{"v":1,"node":"n","reports":[]}', 422, "at least one report"),
        (b'{"v":9,"node":"n","reports":[{"v":1,"node":"n","seq":1,"at":1}]}', 422, "batch schema version 9"),
        (b'{"v":1,"node":"a","reports":[{"v":1,"node":"b","seq":1,"at":1}]}', 422, "inside a batch from node"),
        (b"\xff\xfe" * 100, 400, "malformed"),
    ],
)
def test_malformed_payloads_get_the_reason(server: IngestServer, data: bytes, status: int, reason: str) -> None:
    got, answer = post(server, data)
    assert got == status and reason in str(answer["error"])
    assert server.ingest.counters[f"rejected_{status}"] == 1


def test_oversized_body_is_refused_before_it_is_read(server: IngestServer) -> None:
    with socket.create_connection(("127.0.0.1", server.port), timeout=5) as s:
        s.sendall(b"POST /v1/reports/run-a HTTP/1.1\r\nHost: x\r\nContent-Length: 1000000000\r\n\r\n")
        answer = s.recv(4096)
    assert answer.startswith(b"HTTP/1.1 413") and b"over the 65536-byte limit" in answer
    assert b"Connection: close" in answer


def test_garbage_and_slow_clients_do_not_stop_the_server(server: IngestServer) -> None:
    for junk in (
        b"\x00\x01\x02 garbage\r\n\r\n",
        b"GET / HTTP/9.9\r\n\r\n",
        b"POST /x HTTP/1.1\r\n" + b"X: y\r\n" * 100,
    ):
        with socket.create_connection(("127.0.0.1", server.port), timeout=5) as s:
            s.sendall(junk)
            s.shutdown(socket.SHUT_WR)
            s.recv(4096)
    idle = socket.create_connection(("127.0.0.1", server.port), timeout=5)  # opens and says nothing
    assert post(server, body())[0] == 200
    idle.close()


def test_keep_alive_and_pipelining(server: IngestServer) -> None:
    one = body(report(seq=1))
    two = body(report(seq=2))
    req = b"".join(
        b"POST /v1/reports/run-a HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer %s\r\nContent-Length: %d"
        b"\r\n\r\n%s" % (TOKENS["run-a"].encode(), len(b), b)
        for b in (one, two)
    )
    with socket.create_connection(("127.0.0.1", server.port), timeout=5) as s:
        s.sendall(req)
        data = b""
        while data.count(b"HTTP/1.1 200") < 2:
            data += s.recv(4096)
    assert server.ingest.counters["reports"] == 2


def test_other_routes_can_be_mounted(server: IngestServer) -> None:
    server.mount("/metrics", lambda request: Response(200, b"up 1\n", "text/plain"))

    def broken(request: Request) -> Response:
        raise RuntimeError("bug")

    server.mount("/broken", broken)
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=5)
    conn.request("GET", "/metrics")
    r = conn.getresponse()
    assert (r.status, r.read(), r.getheader("Content-Type")) == (200, b"up 1\n", "text/plain")
    conn.request("GET", "/broken")
    r = conn.getresponse()
    assert r.status == 500 and b"internal error" in r.read()
    assert post(server, body())[0] == 200


def test_forget_run_stops_its_heartbeats(server: IngestServer) -> None:
    post(server, body(report(node="a"), node="a"))
    post(server, body(report(node="b"), node="b"), run="run-b", token=TOKENS["run-b"])
    server.ingest.forget_run("run-a")
    assert set(server.ingest.heartbeat_ages(2000.0)) == {"b"}


def test_sender_buffers_while_the_daemon_is_down_then_delivers(clock: ManualClock) -> None:
    with socket.socket() as s:  # a port nobody listens on (yet)
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    sender = HttpSender(
        f"http://127.0.0.1:{port}",
        "run-a",
        TOKENS["run-a"],
        "gpu001",
        SenderSettings(buffer_max=3, backoff_initial_s=2, backoff_max_s=8, timeout_s=2),
    )
    for seq in range(1, 6):
        sender.add(report(seq=seq))
    assert sender.pending == 3 and sender.dropped == 2  # the two oldest dropped
    assert sender.flush(0.0) is False
    assert sender.flush(0.5) is False and sender.pending == 3  # backing off: no attempt
    srv = IngestServer(new_ingest(clock), port=port)
    srv.start()
    try:
        assert sender.flush(100.0) is True and sender.pending == 0 and sender.dropped == 0
        assert srv.ingest.counters["reports"] == 3 and srv.ingest.counters["agent_dropped"] == 2
    finally:
        sender.close()
        srv.stop()


def test_sender_drops_a_batch_the_ingest_calls_malformed(server: IngestServer) -> None:
    sender = HttpSender(f"http://127.0.0.1:{server.port}", "run-a", TOKENS["run-a"], "gpu001")
    sender.add(replace(report(), v=7))
    assert sender.flush(0.0) is True and sender.rejected_total == 1 and sender.pending == 0
    wrong = HttpSender(f"http://127.0.0.1:{server.port}", "run-a", "stolen", "gpu001")
    wrong.add(report())
    assert wrong.flush(0.0) is False and wrong.pending == 1  # kept: auth may be fixed, retried later
    sender.close()
    wrong.close()
