import socket

from supervisor.adapters.slurm.tcp_probe import TcpProbe
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


# A name that does not resolve is no longer a failure but "not probed" (issue 14):
# tests/unit/test_probe_fd_budget.py.
