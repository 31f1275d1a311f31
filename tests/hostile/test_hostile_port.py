"""The daemon's HTTP port under attack (issue 17, item 2; security review findings #2, #8).

Each test is one attack an unauthenticated user with network access to the login node can make;
each failed on the server as it was before the hardening (the note in the test says how). The
server runs on loopback in this process, except where its file descriptors are the point (a child
process with a low RLIMIT_NOFILE). Attackers connect from 127.0.0.2 so that per-peer caps do not
touch the honest client on 127.0.0.1.
"""

from __future__ import annotations

import http.client
import json
import os
import socket
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import psutil
import pytest

from supervisor.adapters.clock import SystemClock
from supervisor.adapters.sqlite import SqliteStore
from supervisor.adapters.web.ingest import IngestServer, ReportIngest
from supervisor.adapters.web.pages import mount_pages
from supervisor.adapters.web.renderer import ProcessRenderer, ThreadRenderer
from supervisor.domain.health.gpu_health import HealthRules
from supervisor.domain.records import Event, EventKind
from supervisor.testing.kit.specs import spec

TOKEN = "run-token-0123456789abcdef"
READ_TOKEN = "read-token-0123456789abcdef"
ATTACKER = "127.0.0.2"
MiB = 1 << 20


def report_body(node: str = "gpu001", seq: int = 1) -> bytes:
    report = {"v": 1, "node": node, "seq": seq, "at": float(seq), "interval_s": 5.0, "gpus": []}
    return json.dumps({"v": 1, "node": node, "dropped": 0, "reports": [report]}).encode()


def post_report(port: int, seq: int = 1, timeout: float = 10.0) -> tuple[int, float]:
    """An honest agent's POST on a fresh connection: (status, seconds to the answer)."""
    start = time.perf_counter()
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    data = report_body(seq=seq)
    conn.request("POST", "/v1/reports/run-a", data, {"Authorization": f"Bearer {TOKEN}"})
    status = conn.getresponse().status
    conn.close()
    return status, time.perf_counter() - start


def attacker_socket(port: int, address: str = ATTACKER) -> socket.socket:
    s = socket.socket()
    s.bind((address, 0))
    s.connect(("127.0.0.1", port))
    return s


def rss() -> int:
    return psutil.Process().memory_info().rss


def ingest() -> ReportIngest:
    feed = ReportIngest({"run-a": TOKEN}, HealthRules(), SystemClock())
    feed.publish_job_nodes({"run-a": frozenset({"gpu001"})})
    return feed


@pytest.fixture
def server() -> Iterator[IngestServer]:
    srv = IngestServer(ingest(), port=0)
    srv.start()
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def big_store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A store with one run and 4,000 logbook events: its page takes a while to render."""
    path = tmp_path_factory.mktemp("store")
    store = SqliteStore(path)
    store.add_run(spec(script="/x.sbatch", partition="gpu"), 1000.0)
    store.add_attempt("llm", 100, 0, 1000.0)
    store.attempt_started("llm", 0, ("n1", "n2"), 1010.0)
    with store.transaction():
        for i in range(4000):
            note = f"note {i}: " + "operator text " * 20
            store.record_event(Event("llm", EventKind.NOTE, note, f"n{i}", 1010.0 + i, 0, 100, "alice"))
    store.close()
    return path


def pages_server(store_dir: Path, renderer: str = "thread") -> IngestServer:
    """The server with the pages, rendered in its worker thread or, as the daemon does, a child."""
    srv = IngestServer(ingest(), port=0)
    pages = ProcessRenderer(store_dir) if renderer == "process" else ThreadRenderer(SqliteStore(store_dir))
    mount_pages(srv, pages, READ_TOKEN)
    srv.start()
    return srv


def flood(sock: socket.socket, chunk: bytes, total: int, deadline_s: float = 20.0) -> int:
    """Send up to ``total`` bytes of ``chunk`` repeated; the bytes the server took before it hung up."""
    sock.settimeout(deadline_s)
    sent = 0
    try:
        while sent < total:
            sent += sock.send(chunk)
    except OSError:  # reset or broken pipe: the server closed the connection
        pass
    return sent


def drain(sock: socket.socket) -> None:
    try:
        while sock.recv(1 << 20):
            pass
    except OSError:
        pass


def closed_by_server(sock: socket.socket, within_s: float = 5.0) -> bool:
    sock.settimeout(within_s)
    try:
        while sock.recv(65536):
            pass
    except (ConnectionResetError, BrokenPipeError):
        return True
    except TimeoutError:
        return False
    return True


# ------------------------------------------------------------------ oversized request line and headers
@pytest.mark.parametrize(
    "head",
    [b"GET /", b"GET / HTTP/1.1\r\nX-Pad: "],
    ids=["request-line", "header-value"],
)
def test_a_96_mib_request_line_or_header_is_refused_at_once(server: IngestServer, head: bytes) -> None:
    """Before: httptools buffered the URL or the header value whole (RSS +100 to +360 MB), and the
    connection stayed open until the 96 MiB had arrived."""
    before = rss()
    sock = attacker_socket(server.port)
    sock.sendall(head)
    sent = flood(sock, b"a" * (64 * 1024), 96 * MiB)
    grown = rss() - before
    sock.close()
    assert sent < 16 * MiB, f"the server read {sent / MiB:.0f} MiB of one header before hanging up"
    assert grown < 24 * MiB, f"RSS grew {grown / MiB:.0f} MiB"
    assert post_report(server.port)[0] == 200


# ------------------------------------------------------------------ file descriptors
CHILD = textwrap.dedent(
    """
    import resource, sqlite3, subprocess, sys, tempfile, time
    from supervisor.adapters.clock import SystemClock
    from supervisor.adapters.web.ingest import IngestServer, ReportIngest
    from supervisor.domain.health.gpu_health import HealthRules
    resource.setrlimit(resource.RLIMIT_NOFILE, ({limit}, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
    feed = ReportIngest({"run-a": "{token}"}, HealthRules(), SystemClock())
    feed.publish_job_nodes({"run-a": frozenset({"gpu001"})})
    srv = IngestServer(feed, port=0)
    srv.start()
    print("PORT", srv.port, flush=True)
    tmp = tempfile.mkdtemp()
    for line in sys.stdin:  # each line: try what the engine does every tick
        errors = []
        try:
            files = [open(f"{tmp}/f{i}", "w") for i in range(16)]
            for f in files: f.close()
            db = sqlite3.connect(f"{tmp}/state.db"); db.execute("create table if not exists t(x)"); db.close()
            subprocess.run(["true"], check=True)
        except OSError as exc:
            errors.append(str(exc))
        print("ERRORS", repr(errors), flush=True)
    """
)


def answer(child: subprocess.Popen[str], tag: str) -> str:
    assert child.stdout is not None
    for line in child.stdout:  # the server's log lines come first
        if line.startswith(tag + " "):
            return line[len(tag) + 1 :].strip()
    raise AssertionError(f"the child ended without {tag}")


def test_idle_connections_cannot_take_the_engines_file_descriptors(tmp_path: Path) -> None:
    """Before: no connection cap; 600 idle sockets against a daemon with RLIMIT_NOFILE 512 made
    the engine's own opens (files, SQLite, subprocess) fail with EMFILE."""
    code = CHILD.replace("{limit}", "512").replace("{token}", TOKEN)
    child = subprocess.Popen(
        [sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=os.getcwd()
    )
    try:
        assert child.stdout is not None and child.stdin is not None
        port = int(answer(child, "PORT"))
        idle = []
        for i in range(600):  # from 30 addresses: the cap in all, not the per-address one, is tested
            try:
                idle.append(attacker_socket(port, f"127.0.1.{i % 30 + 1}"))
            except OSError:
                break
        time.sleep(1.0)  # the server accepts them
        child.stdin.write("tick\n")
        child.stdin.flush()
        errors = answer(child, "ERRORS")
        assert errors == "[]", errors
        assert post_report(port)[0] == 200  # and agents are still heard
        for s in idle:
            s.close()
    finally:
        child.kill()
        child.wait()


@pytest.mark.timing
def test_slowloris_is_cut_by_an_absolute_deadline(server: IngestServer) -> None:
    """Before: the idle timer was re-armed by every byte, so a byte every few seconds held the
    connection (and its fd) for ever."""
    server.limits = replace(server.limits, request_deadline_s=1.0)  # the reaper reads it as it goes
    sock = attacker_socket(server.port)
    sock.settimeout(0.2)
    started = time.monotonic()
    try:
        for b in b"POST /v1/reports/run-a HTTP/1.1\r\nX: " + b"y" * 100:
            sock.send(bytes([b]))
            time.sleep(0.1)
            if time.monotonic() - started > 4:
                break
    except OSError:
        pass
    assert closed_by_server(sock, 0.5)
    assert time.monotonic() - started < 3.5
    sock.close()


@pytest.mark.timing
def test_a_head_trickled_byte_by_byte_is_cut_at_the_heads_deadline_not_the_requests(server: IngestServer) -> None:
    """Issue 32, finding 5: the head has a deadline of its own, shorter than the whole request's,
    so a slow "busy" connection lives seconds, not ``request_deadline_s`` (30 s); a slow body
    (the head complete) still has the request's. Before: every trickled head lived 30 s."""
    server.limits = replace(server.limits, head_deadline_s=1.0, request_deadline_s=6.0)
    head = attacker_socket(server.port)
    body = attacker_socket(server.port)
    started = time.monotonic()
    body.sendall(b"POST /v1/reports/run-a HTTP/1.1\r\nContent-Length: 400\r\n\r\n")
    for b in b"POST /v1/reports/run-a HTTP/1.1\r\nX: " + b"y" * 30:
        try:
            head.send(bytes([b]))
            body.send(b"{")
        except OSError:
            break
        time.sleep(0.1)
    assert closed_by_server(head, 0.5) and time.monotonic() - started < 3.5
    assert not closed_by_server(body, 0.2)  # its head was whole: the body has the request's deadline
    assert server.counters["closed_head_deadline"] == 1
    head.close()
    body.close()


def test_one_peer_cannot_hold_every_connection(server: IngestServer) -> None:
    """Before: no per-peer cap; one address could open connections until the process ran out."""
    socks = [attacker_socket(server.port) for _ in range(200)]
    time.sleep(0.5)
    open_ = sum(1 for s in socks if not closed_by_server(s, 0.01))
    assert open_ <= 64, f"one address holds {open_} connections"
    assert post_report(server.port)[0] == 200
    for s in socks:
        s.close()


# ------------------------------------------------------------------ pages
def page_request(path: str, token: str | None = READ_TOKEN) -> bytes:
    auth = b"Authorization: Bearer %s\r\n" % token.encode() if token else b""
    return b"GET %s HTTP/1.1\r\nHost: x\r\n%s\r\n" % (path.encode(), auth)


@pytest.mark.timing
@pytest.mark.parametrize("renderer", ["thread", "process"])
def test_pipelined_page_requests_do_not_delay_an_agents_report(big_store: Path, renderer: str) -> None:
    """Before: ten pipelined logbook requests were rendered one after the other on the event loop;
    an agent's POST sent just after waited for all of them (7.7 s with 20,000 events)."""
    srv = pages_server(big_store, renderer)
    try:
        sock = attacker_socket(srv.port)
        reader = threading.Thread(target=drain, args=(sock,), daemon=True)
        reader.start()  # a client that reads its answers: nothing holds the pages back
        sock.sendall(page_request("/runs/llm/logbook") * 10)
        time.sleep(0.05)
        status, took = post_report(srv.port)
        assert status == 200 and took < 0.5, f"the report took {took:.2f} s"
        sock.close()
    finally:
        srv.stop()


def test_unread_pipelined_answers_do_not_pile_up(big_store: Path) -> None:
    """Before: every pipelined request was answered into the transport's buffer whether or not the
    client read it (40 unread answers: RSS +190 MB)."""
    srv = pages_server(big_store)
    try:
        for path in ("/runs/llm/logbook", "/metrics"):  # once, read: what any render costs is not counted
            conn = http.client.HTTPConnection("127.0.0.1", srv.port, timeout=10)
            conn.request("GET", path, headers={"Authorization": f"Bearer {READ_TOKEN}"})
            conn.getresponse().read()
            conn.close()
        sock = attacker_socket(srv.port)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        before = rss()
        sock.sendall(page_request("/runs/llm/logbook") * 40 + page_request("/metrics") * 40)
        deadline = time.monotonic() + 4
        peak = 0
        while time.monotonic() < deadline:
            peak = max(peak, rss() - before)
            time.sleep(0.1)
        assert peak < 32 * MiB, f"RSS grew {peak / MiB:.0f} MiB with answers nobody reads"
        assert post_report(srv.port)[0] == 200
        sock.close()
    finally:
        srv.stop()


@pytest.mark.parametrize("path", ["/metrics", "/runs/llm/logbook"])
def test_pages_refuse_a_reader_without_the_read_token(big_store: Path, path: str) -> None:
    """Before: /metrics and the logbook answered anyone (run, node and user names, log lines)."""
    srv = pages_server(big_store)
    try:
        for token in (None, "guess", TOKEN):  # no token, a wrong one, a run's (write) token
            conn = http.client.HTTPConnection("127.0.0.1", srv.port, timeout=10)
            conn.request("GET", path, headers={"Authorization": f"Bearer {token}"} if token else {})
            answer = conn.getresponse()
            body = answer.read()
            conn.close()
            assert answer.status in (401, 403), (token, answer.status)
            assert b"llm" not in body and b"slurm_supervisor" not in body
    finally:
        srv.stop()
