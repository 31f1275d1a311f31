"""Issue 32, finding 5: a login-node tenant cannot fill the ingest listener from many loopback
addresses. Any local user may bind any 127.x.y.z as a source; the review's attack held 48 addresses
x 32 connections, each trickling a valid request. Loopback now counts as one peer; the compute
nodes' subnets (``[ingest] node_networks``) count address by address."""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator

import pytest

from supervisor.adapters.web.peers import LOOPBACK, peer_key
from supervisor.adapters.web.server import HttpServer, Limits, Response


@pytest.mark.parametrize(
    ("ip", "key"),
    [
        ("127.0.0.77", LOOPBACK),
        ("127.200.3.4", LOOPBACK),
        ("::1", LOOPBACK),
        ("::ffff:127.0.0.5", LOOPBACK),
        ("10.1.2.3", "10.1.2.3"),
        ("::ffff:10.1.2.3", "10.1.2.3"),
        ("2001:db8:0:1::5", "2001:db8:0:1::/64"),
        ("2001:db8:0:1:ffff::9", "2001:db8:0:1::/64"),
        ("not an address", "not an address"),
    ],
)
def test_the_peer_an_address_counts_against(ip: str, key: str) -> None:
    assert peer_key(ip) == key


def test_addresses_of_the_node_networks_count_one_by_one() -> None:
    assert peer_key("127.1.0.5", ("127.1.0.0/16",)) == "127.1.0.5"
    assert peer_key("127.2.0.5", ("127.1.0.0/16",)) == LOOPBACK


@pytest.fixture
def server() -> Iterator[HttpServer]:
    srv = HttpServer(
        port=0, limits=Limits(max_connections=64, max_connections_per_peer=4, node_networks=("127.1.0.0/16",))
    )
    srv.mount("/ok", lambda request: Response(200, b"{}"))
    srv.start()
    yield srv
    srv.stop()


def _trickler(port: int, source: str) -> socket.socket | None:
    s = socket.socket()
    try:
        s.bind((source, 0))
        s.connect(("127.0.0.1", port))
        s.sendall(b"P")  # busy: the first byte of a valid request, the rest to come slowly
    except OSError:
        s.close()
        return None
    return s


def test_many_loopback_addresses_hold_one_peers_share_and_an_agent_is_answered(server: HttpServer) -> None:
    held = [s for a in range(16) for _ in range(4) if (s := _trickler(server.port, f"127.0.{a}.77")) is not None]
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and server.connections > 4:
        time.sleep(0.05)  # the refused ones are closed at once; the count settles at the share
    assert server.connections <= 4, "16 loopback addresses x 4 connections filled the listener (64)"
    agent = socket.socket()
    agent.bind(("127.1.0.9", 0))
    agent.settimeout(5)
    agent.connect(("127.0.0.1", server.port))
    agent.sendall(b"GET /ok HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
    assert agent.recv(64).startswith(b"HTTP/1.1 200")
    for s in [*held, agent]:
        s.close()
