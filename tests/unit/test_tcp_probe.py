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


def _listener():
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen()
    return server


def test_a_node_whose_port_is_unknown_is_not_probed_at_slurmds_default():
    """A grouped read gives no port: the probe must not guess 6818 (where a site's or the harness's
    slurmd may not listen) and call a healthy node unreachable; the node is left "not probed"."""
    probe = TcpProbe(timeout=0.5)
    result = probe.probe([node("grouped", None)])
    assert "grouped" not in result
    assert "port" in probe.last_round.not_run["grouped"]


def test_a_site_configured_slurmd_port_is_used_when_slurm_gives_none():
    server = _listener()
    try:
        result = TcpProbe(timeout=1.0, default_port=server.getsockname()[1]).probe([node("grouped", None)])
    finally:
        server.close()
    assert result == {"grouped": None}
