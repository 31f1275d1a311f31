"""The daemon's HTTP server itself (``supervisor.adapters.web.server``): TLS with real clients, the
default bind, the caps and answers of the hardened protocol, the page cache, and the daemon's
``[ingest]`` wiring. The attacks themselves are in tests/hostile/test_hostile_port*.py."""

from __future__ import annotations

import datetime
import http.client
import inspect
import ipaddress
import os
import signal
import socket
import ssl
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from answers import read_answer
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID
from test_ingest import TOKENS, body, new_ingest, report

from supervisor.adapters.web.ingest import IngestServer
from supervisor.adapters.web.pages import PageCache
from supervisor.adapters.web.server import HttpServer, Limits, Response, server_tls
from supervisor.agent.sender import HttpSender
from supervisor.config import DaemonConfig
from supervisor.testing.kit.clock import ManualClock
from supervisor.testing.kit.specs import spec


def self_signed(tmp: Path) -> tuple[Path, Path]:
    """A certificate for 127.0.0.1 and its key (mode 600), as PEM files."""
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), False)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    cert_file, key_file = tmp / "cert.pem", tmp / "key.pem"
    cert_file.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_file.write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    key_file.chmod(0o600)
    return cert_file, key_file


@pytest.fixture
def tls_server(tmp_path: Path) -> Iterator[tuple[IngestServer, Path]]:
    cert, key = self_signed(tmp_path)
    srv = IngestServer(new_ingest(ManualClock()), port=0)
    srv.ssl = server_tls(str(cert), str(key))
    srv.start()
    yield srv, cert
    srv.stop()


def test_reports_over_tls_with_a_real_tls_client(tls_server: tuple[IngestServer, Path]) -> None:
    server, cert = tls_server
    context = ssl.create_default_context(cafile=str(cert))
    conn = http.client.HTTPSConnection("127.0.0.1", server.port, context=context, timeout=5)
    for seq in (1, 2):  # keep-alive over one TLS session
        conn.request("POST", "/v1/reports/run-a", body(report(seq=seq)), {"Authorization": f"Bearer {TOKENS['run-a']}"})
        answer = conn.getresponse()
        assert answer.status == 200 and answer.read() == b'{"accepted":1,"duplicates":0,"findings":0}'
    conn.close()


def test_the_agent_sends_over_https_trusting_the_sites_ca(
    tls_server: tuple[IngestServer, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    server, cert = tls_server
    monkeypatch.setenv("SSL_CERT_FILE", str(cert))  # how a site's CA reaches the agent's default context
    sender = HttpSender(f"https://127.0.0.1:{server.port}", "run-a", TOKENS["run-a"], "gpu001")
    sender.add(report())
    assert sender.flush(0.0) is True and server.ingest.counters["reports"] == 1
    sender.close()


def test_plain_http_and_silent_clients_on_the_tls_port_are_bounded(tls_server: tuple[IngestServer, Path]) -> None:
    server, _ = tls_server
    answer = raw(server, b"POST /v1/reports/run-a HTTP/1.1\r\nContent-Length: 2\r\n\r\n{}")
    deadline = time.monotonic() + 3
    while not server.counters["tls_failed"] and time.monotonic() < deadline:
        time.sleep(0.02)
    assert b"HTTP/1.1" not in answer and server.counters["tls_failed"] == 1  # no handshake: hung up
    silent = [
        socket.create_connection(("127.0.0.1", server.port)) for _ in range(server.limits.max_connections_per_peer + 8)
    ]
    time.sleep(0.3)  # no TLS handshake yet: each one is counted like any connection
    assert server.connections <= server.limits.max_connections_per_peer
    for s in silent:
        s.close()


def test_the_default_bind_is_loopback_in_the_config_and_the_class() -> None:
    default = inspect.signature(HttpServer.__init__).parameters["host"].default
    assert default == DaemonConfig().ingest.bind == "127.0.0.1"
    assert inspect.signature(IngestServer.__init__).parameters["host"].default == "127.0.0.1"


def raw(server: HttpServer, data: bytes, timeout: float = 5.0) -> bytes:
    with socket.create_connection(("127.0.0.1", server.port), timeout=timeout) as s:
        s.sendall(data)
        return read_answer(s)


@pytest.fixture
def plain() -> Iterator[HttpServer]:
    srv = HttpServer(port=0, limits=Limits(max_url_bytes=64, max_head_bytes=1024, max_headers=4, max_pipelined=3))
    srv.mount("/echo", lambda r: Response(200, r.path.encode() + b"?" + r.query.encode(), "text/plain"))
    srv.mount("/slow", lambda r: (time.sleep(0.2), Response(200, b"slow"))[1], blocking=True)
    srv.start()
    yield srv
    srv.stop()


@pytest.mark.parametrize(
    ("data", "status"),
    [
        (b"GET /" + b"a" * 100 + b" HTTP/1.1\r\n\r\n", b"414"),
        (b"GET / HTTP/1.1\r\n" + b"X: " + b"v" * 2000 + b"\r\n\r\n", b"431"),
        (b"GET / HTTP/1.1\r\n" + b"".join(b"H%d: v\r\n" % i for i in range(5)) + b"\r\n", b"431"),
        (b"CONNECT  HTTP/1.1\r\n\r\n", b"400"),
    ],
    ids=["long-url", "long-header", "many-headers", "bad-target"],
)
def test_oversized_or_odd_heads_are_answered_and_closed(plain: HttpServer, data: bytes, status: bytes) -> None:
    answer = raw(plain, data)
    assert answer.startswith(b"HTTP/1.1 " + status) and b"Connection: close" in answer


def test_pipelined_answers_keep_their_order_across_the_worker_thread(plain: HttpServer) -> None:
    answer = raw(plain, b"GET /slow HTTP/1.1\r\n\r\nGET /echo?x=1 HTTP/1.1\r\nConnection: close\r\n\r\n")
    assert answer.index(b"slow") < answer.index(b"/echo?x=1")


def test_too_many_pipelined_requests_are_answered_then_the_connection_closes(plain: HttpServer) -> None:
    answer = raw(plain, b"GET /echo?n HTTP/1.1\r\n\r\n" * 10)
    assert answer.count(b"HTTP/1.1 200") == 4 and answer.endswith(b"/echo?n")  # max_pipelined + 1, then closed


def test_a_half_closed_client_still_gets_its_answers(plain: HttpServer) -> None:
    with socket.create_connection(("127.0.0.1", plain.port), timeout=5) as s:
        s.sendall(b"GET /slow HTTP/1.1\r\n\r\nGET /echo HTTP/1.1\r\n\r\n")
        s.shutdown(socket.SHUT_WR)
        answer = b""
        while chunk := s.recv(65536):
            answer += chunk
    assert answer.count(b"HTTP/1.1 200") == 2


@pytest.mark.timing
def test_idle_keep_alive_connections_are_closed_after_the_idle_timeout() -> None:
    srv = HttpServer(port=0, limits=Limits(idle_timeout_s=0.5))
    srv.start()
    try:
        with socket.create_connection(("127.0.0.1", srv.port), timeout=3) as s:
            started = time.monotonic()
            assert s.recv(1) == b""
            assert 0.4 < time.monotonic() - started < 2.0 and srv.counters["closed_idle"] == 1
    finally:
        srv.stop()


def test_the_page_cache_renders_once_per_ttl_and_bounds_its_bytes() -> None:
    now = [0.0]
    cache = PageCache(ttl_s=5.0, max_bytes=100, clock=lambda: now[0])
    renders: list[str] = []

    def render(key: str, size: int = 10) -> Response:
        renders.append(key)
        return Response(200, b"x" * size)

    assert cache.get("a", lambda: render("a")) == cache.get("a", lambda: render("a"))
    now[0] = 6.0
    cache.get("a", lambda: render("a"))
    cache.get("b", lambda: render("b", 95))  # over the byte cap together: "a" goes
    cache.get("b", lambda: render("b", 95))
    cache.get("a", lambda: render("a"))
    assert renders == ["a", "a", "b", "a"]


def daemon_config(tmp_path: Path, **ingest: str) -> Path:
    lines = "".join(f"{k} = {v}\n" for k, v in ingest.items())
    path = tmp_path / "supervisor.toml"
    path.write_text(f'[daemon]\nstate_dir = "{tmp_path / "state"}"\n[ingest]\nport = 0\n{lines}')
    return path


def test_the_daemon_wires_the_caps_tls_and_the_read_token(tmp_path: Path) -> None:
    from supervisor.cli import wiring
    from supervisor.config import load_daemon_config

    cert, key = self_signed(tmp_path)
    token = tmp_path / "read.token"
    token.write_text("read-token-0123456789abcdef\n")
    token.chmod(0o600)
    path = daemon_config(
        tmp_path,
        max_connections_per_peer="4",
        request_deadline_s="5",
        read_token_file=f'"{token}"',
        tls_cert_file=f'"{cert}"',
        tls_key_file=f'"{key}"',
    )
    cfg = load_daemon_config(path)
    built = wiring.ingest(cfg, wiring.clock())
    assert built is not None
    server = built[1]
    server.start()
    try:
        assert (server.limits.max_connections_per_peer, server.limits.request_deadline_s) == (4, 5.0)
        assert wiring.advertised_url(cfg, server) == f"https://127.0.0.1:{server.port}"
        for header, status in (({}, 401), ({"Authorization": "Bearer read-token-0123456789abcdef"}, 200)):
            conn = http.client.HTTPSConnection(
                "127.0.0.1", server.port, context=ssl.create_default_context(cafile=str(cert)), timeout=5
            )
            conn.request("GET", "/metrics", headers=header)
            assert conn.getresponse().status == status
            conn.close()
    finally:
        server.stop()


def test_a_read_token_others_can_read_stops_the_daemon(tmp_path: Path) -> None:
    import click

    from supervisor.cli import wiring
    from supervisor.config import load_daemon_config

    token = tmp_path / "read.token"
    token.write_text("read-token-0123456789abcdef\n")
    token.chmod(0o644)
    cfg = load_daemon_config(daemon_config(tmp_path, read_token_file=f'"{token}"'))
    with pytest.raises(click.ClickException, match=r"\[ingest\] read_token_file .* run `chmod 600"):
        wiring.ingest(cfg, wiring.clock())


def test_pages_render_in_a_child_process_started_again_if_it_dies(tmp_path: Path) -> None:
    from supervisor.adapters.sqlite import SqliteStore
    from supervisor.adapters.web.renderer import ProcessRenderer

    store = SqliteStore(tmp_path)
    store.add_run(spec(script="/x.sbatch", partition="gpu"), 1000.0)
    renderer = ProcessRenderer(tmp_path)
    try:
        status, _, text = renderer.metrics()
        assert status == 200 and b'slurm_supervisor_runs{state="registered"} 1.0' in text
        first = renderer.pid
        assert first is not None
        os.kill(first, signal.SIGKILL)  # the child dies (out of memory, say): the next page starts another
        status, headers, page = renderer.logbook("llm", 2000.0)
        assert status == 200 and b"llm" in page and renderer.pid not in (None, first)
    finally:
        renderer.close()
