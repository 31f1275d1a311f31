import socket

from supervisor.adapters.tcp_probe import TcpProbe
from supervisor.domain.cluster import NodeInfo, NodeState


def node(name, port):
    return NodeInfo(name, NodeState.ALLOCATED, address="127.0.0.1", port=port)


def test_listening_node_is_alive_and_closed_port_is_refused():
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen()
    alive_port = server.getsockname()[1]
    closed = socket.socket()
    closed.bind(("127.0.0.1", 0))
    dead_port = closed.getsockname()[1]
    closed.close()
    try:
        result = TcpProbe(timeout=1.0).probe([node("up", alive_port), node("down", dead_port)])
    finally:
        server.close()
    assert result["up"] is None
    assert "ECONNREFUSED" in result["down"]


def test_unresolvable_host_is_a_failure():
    result = TcpProbe(timeout=0.5).probe([NodeInfo("x", NodeState.IDLE, address="no-such-host.invalid", port=1)])
    assert result["x"].startswith("cannot resolve")
