"""Property-based fuzzing of the daemon's HTTP request path (issue 17, item 2): raw bytes — random,
and request-shaped with mutated lines, headers, lengths, chunked bodies and pipelining — sent to
the real server over loopback, in random pieces, then the sending half closed.

For every input: the server answers or hangs up within its deadline (no hang), no answer is a 500
(no handler crash), the server thread lives on and still takes an honest report, and its memory
stays bounded over the whole run.
"""

from __future__ import annotations

import http.client
import json
import socket
import time
from collections.abc import Iterator

import psutil
import pytest
from answers import read_answer
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from supervisor.adapters.clock import SystemClock
from supervisor.adapters.web.ingest import IngestServer, ReportIngest
from supervisor.adapters.web.server import Limits, Response
from supervisor.domain.health.gpu_health import HealthRules

TOKEN = "run-token-0123456789abcdef"
FUZZ = settings(max_examples=250, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


@pytest.fixture(scope="module")
def server() -> Iterator[IngestServer]:
    feed = ReportIngest({"run-a": TOKEN}, HealthRules(), SystemClock())
    feed.publish_job_nodes({"run-a": frozenset({"gpu001"})})
    limits = Limits(request_deadline_s=1.0, idle_timeout_s=1.0, max_head_bytes=4096, max_url_bytes=512)
    srv = IngestServer(feed, port=0, max_body=8192)
    srv.limits = limits
    srv.mount("/pages/", lambda request: Response(200, b"a page"), blocking=True)  # on the worker thread
    srv.start()
    yield srv
    srv.stop()


def honest_report(port: int) -> int:
    report = {"v": 1, "node": "gpu001", "seq": int(time.time() * 1000), "at": time.time() - 1, "interval_s": 5.0}
    data = json.dumps({"v": 1, "node": "gpu001", "reports": [report]}).encode()
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
    conn.request("POST", "/v1/reports/run-a", data, {"Authorization": f"Bearer {TOKEN}"})
    status = conn.getresponse().status
    conn.close()
    return status


# ------------------------------------------------------------------ inputs
TEXT = st.binary(max_size=40) | st.text(max_size=40).map(lambda t: t.encode("utf-8", "surrogatepass"))
METHOD = st.sampled_from([b"GET", b"POST", b"PUT", b"HEAD", b"CONNECT", b"PRI", b"G\x00T", b""]) | TEXT
PATH = st.sampled_from([b"/v1/reports/run-a", b"/v1/reports/", b"/pages/x", b"/metrics", b"*", b"/%00"]) | TEXT
VERSION = st.sampled_from([b"HTTP/1.1", b"HTTP/1.0", b"HTTP/2.0", b"HTTP/1.1 ", b"", b"HTTP/9"])
HEADER = st.tuples(
    st.sampled_from([b"Content-Length", b"Transfer-Encoding", b"Authorization", b"Connection", b"Upgrade", b"X"])
    | TEXT,
    st.sampled_from([b"chunked", b"0", b"5", b"-1", b"99999999999999999999", b"close", b"Bearer " + TOKEN.encode()])
    | TEXT
    | st.integers(0, 20000).map(lambda n: b"v" * n),
)
BODY = st.binary(max_size=300) | st.sampled_from([b"5\r\nhello\r\n0\r\n\r\n", b"ffffffff\r\n", b"{}"])


@st.composite
def request_bytes(draw: st.DrawFn) -> bytes:
    line = draw(METHOD) + b" " + draw(PATH) + b" " + draw(VERSION) + b"\r\n"
    headers = b"".join(n + b": " + v + b"\r\n" for n, v in draw(st.lists(HEADER, max_size=8)))
    return line + headers + draw(st.sampled_from([b"\r\n", b"", b"\n"])) + draw(BODY)


REPORT = st.builds(
    lambda seq, at, extra: json.dumps(
        {"v": 1, "node": "gpu001", "reports": [{"v": 1, "node": "gpu001", "seq": seq, "at": at, **extra}]}
    ).encode(),
    st.integers(-5, 2**64),
    st.floats(allow_nan=True) | st.just(time.time()),
    st.dictionaries(st.sampled_from(["gpus", "xids", "interval_s", "source", "host"]), st.integers() | st.text()),
)


@st.composite
def well_formed(draw: st.DrawFn) -> bytes:
    """A request the parser accepts: a valid line, a body with its true length or chunked."""
    body = draw(REPORT | st.binary(max_size=200))
    method, path = draw(st.sampled_from([(b"POST", b"/v1/reports/run-a"), (b"GET", b"/pages/x"), (b"GET", b"/x")]))
    auth = draw(st.sampled_from([b"Bearer " + TOKEN.encode(), b"Bearer nope", b"Basic x", b""]))
    if draw(st.booleans()):
        framing = b"Content-Length: %d\r\n\r\n%s" % (len(body), body)
    else:
        framing = b"Transfer-Encoding: chunked\r\n\r\n%x\r\n%s\r\n0\r\n\r\n" % (len(body), body)
    return b"%s %s HTTP/1.1\r\nHost: x\r\nAuthorization: %s\r\n%s" % (method, path, auth, framing)


RAW = st.lists(well_formed() | request_bytes(), min_size=1, max_size=6).map(b"".join) | st.binary(
    min_size=1, max_size=2000
)


def send_in_pieces(port: int, data: bytes, cuts: list[int]) -> bytes:
    """Send ``data`` split at ``cuts``, close the sending half, read until the server hangs up."""
    with socket.create_connection(("127.0.0.1", port), timeout=4) as sock:
        start = 0
        try:
            for cut in [*sorted(c % (len(data) + 1) for c in cuts), len(data)]:
                sock.sendall(data[start:cut])
                start = max(start, cut)
            sock.shutdown(socket.SHUT_WR)
        except OSError:
            return b""  # hung up on us already: allowed
        return read_answer(sock)  # a TimeoutError here is a hang: the test fails


@FUZZ
@given(data=RAW, cuts=st.lists(st.integers(0, 5000), max_size=4))
def test_no_bytes_crash_or_hang_the_server(server: IngestServer, data: bytes, cuts: list[int]) -> None:
    answer = send_in_pieces(server.port, data, cuts)
    assert b"HTTP/1.1 500" not in answer
    assert server._thread is not None and server._thread.is_alive()


def test_after_the_fuzzing_the_server_still_listens_and_its_memory_is_bounded(server: IngestServer) -> None:
    before = psutil.Process().memory_info().rss
    for i in range(300):
        send_in_pieces(server.port, b"GET /" + b"a" * 600 + b" HTTP/1.1\r\n" + b"X: " + b"v" * (i * 50), [7, 300])
    grown = psutil.Process().memory_info().rss - before
    assert honest_report(server.port) == 200
    assert grown < 16 << 20, f"RSS grew {grown >> 20} MiB over 300 refused requests"
    deadline = time.monotonic() + 3
    while server.connections and time.monotonic() < deadline:
        time.sleep(0.05)
    assert server.connections == 0  # none left behind


READ = 256 * 1024  # the most asyncio reads at once


@FUZZ
@given(
    pad=st.integers(0, 6000) | st.integers(READ + 8000, READ + 20000),
    before=st.lists(st.integers(0, 3000), max_size=3),  # requests pipelined ahead, with bodies
    cuts=st.lists(st.integers(0, 10000), max_size=5),
)
def test_the_head_cap_holds_however_the_bytes_arrive(
    server: IngestServer, pad: int, before: list[int], cuts: list[int]
) -> None:
    """A head (request line and headers) over ``max_head_bytes`` is refused with 431 whether it
    comes first or after pipelined requests, in one piece or many; one under it is answered. A
    head that starts inside a read after another request is counted from the next read, so there
    it may run one read past the cap before it is refused (documented in http_protocol)."""
    ahead = b"".join(b"POST /x HTTP/1.1\r\nContent-Length: %d\r\n\r\n%s" % (n, b"b" * n) for n in before)
    last = b"GET /x HTTP/1.1\r\nX-Pad: " + b"p" * pad + b"\r\n\r\n"
    answer = send_in_pieces(server.port, ahead + last, cuts)
    cap = server.limits.max_head_bytes
    # refused: 431, or hung up before the client read it (a reset drops what it had not read)
    refused = b"HTTP/1.1 431" in answer or answer.count(b"HTTP/1.1 404") <= len(before)
    if len(last) - 2 <= cap:  # the cap counts the head without its final CRLF
        assert not refused
    elif not before or len(last) > cap + READ:
        assert refused
