"""The slurmd probe within the daemon's descriptor budget (issue 14): it probes a few hundred nodes
at a time, a socket it cannot open is the daemon's problem (the node is "not probed", never
"failed"), and names are looked up once, not per node per tick."""

from __future__ import annotations

import json
import resource
import socket
import subprocess
import sys
import textwrap

import pytest

from supervisor.adapters.slurm.tcp_probe import TcpProbe
from supervisor.domain.cluster import ClusterSnapshot, NodeInfo, NodeState
from supervisor.engine.facts.probes import ProbeTracker

# A probe of NODES nodes, all pointing at one listening port, under a soft RLIMIT_NOFILE of LIMIT:
# the reproduction (356 nodes under `ulimit -n 256`).
_UNDER_LIMIT = textwrap.dedent(
    """
    import json, resource, sys
    from supervisor.adapters.slurm.tcp_probe import TcpProbe
    from supervisor.domain.cluster import NodeInfo, NodeState
    port, nodes, limit = (int(a) for a in sys.argv[1:4])
    resource.setrlimit(resource.RLIMIT_NOFILE, (limit, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
    infos = [NodeInfo(f"n{i:04d}", NodeState.ALLOCATED, address="127.0.0.1", port=port) for i in range(nodes)]
    result = TcpProbe(timeout=5.0).probe(infos)
    print(json.dumps({"alive": sum(v is None for v in result.values()), "answered": len(result)}))
    """
)


def probe_in_subprocess(port: int, nodes: int, limit: int) -> subprocess.CompletedProcess[str]:
    argv = [sys.executable, "-c", _UNDER_LIMIT, str(port), str(nodes), str(limit)]
    return subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False)


@pytest.fixture
def slurmd():
    """One listening socket standing for every node's slurmd (a backlog wide enough for all)."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(4096)
    yield server.getsockname()[1]
    server.close()


def test_many_nodes_under_a_low_descriptor_limit_do_not_crash_the_probe(slurmd):
    """The old probe opened one socket per node at once: EMFILE ended the process."""
    result = probe_in_subprocess(slurmd, nodes=356, limit=256)
    assert result.returncode == 0, result.stderr[-2000:]
    assert json.loads(result.stdout) == {"alive": 356, "answered": 356}


def test_at_most_a_window_of_sockets_is_open_at_once(slurmd):
    infos = [NodeInfo(f"n{i}", NodeState.ALLOCATED, address="127.0.0.1", port=slurmd) for i in range(300)]
    probe = TcpProbe(timeout=2.0, window=50)
    result = probe.probe(infos)
    assert all(v is None for v in result.values()) and len(result) == 300
    assert 0 < probe.last_round.most_open <= 50


class Exhausted(Exception):
    pass


def test_a_socket_that_cannot_be_opened_is_not_a_node_failure():
    """Out of descriptors (EMFILE): the nodes are left out of the result — not probed, unknown."""

    def no_sockets(*_):
        raise OSError(24, "Too many open files")

    probe = TcpProbe(timeout=0.5, open_socket=no_sockets)
    infos = [NodeInfo("a", NodeState.ALLOCATED, address="127.0.0.1", port=1)]
    assert probe.probe(infos) == {}
    assert probe.last_round.not_run == {"a": "cannot open a socket: [Errno 24] Too many open files"}
    assert probe.counters["emfile"] == 1


def test_nodes_not_probed_are_neither_failures_nor_recoveries():
    """A tracker fed 'not probed' rounds never confirms a node dead on them, and keeps a real
    failure's first sighting."""

    class Scripted:
        def __init__(self, rounds):
            self.rounds = list(rounds)

        def probe(self, nodes):
            return self.rounds.pop(0)

    snap = ClusterSnapshot(0.0, {}, {"a": NodeInfo("a", NodeState.ALLOCATED)})
    tracker = ProbeTracker(Scripted([{"a": "refused"}, {}, {}, {"a": "refused"}]), confirm_s=1.0)
    assert tracker.update(["a"], snap, 0.0) == {}
    assert tracker.update(["a"], snap, 5.0) == {} and tracker.suspects == {"a"}  # not probed: still suspect
    assert tracker.update(["a"], snap, 6.0) == {}
    dead = tracker.update(["a"], snap, 7.0)
    assert "failed 2 times over 7.0 s" in dead["a"]


def test_a_probe_that_raises_is_logged_and_changes_nothing():
    class Broken:
        def probe(self, nodes):
            raise OSError(23, "Too many open files in system")

    snap = ClusterSnapshot(0.0, {}, {"a": NodeInfo("a", NodeState.ALLOCATED)})
    tracker = ProbeTracker(Broken(), confirm_s=0.0)
    assert tracker.update(["a"], snap, 0.0) == {} and tracker.suspects == frozenset()


def test_names_are_looked_up_once_and_again_after_a_failure_or_the_refresh(slurmd):
    lookups: list[str] = []
    now = [0.0]

    def resolver(host, port):
        lookups.append(host)
        return socket.getaddrinfo("127.0.0.1", port, type=socket.SOCK_STREAM)

    probe = TcpProbe(timeout=2.0, resolve=resolver, refresh_s=600.0, monotonic=lambda: now[0])
    alive = NodeInfo("up", NodeState.ALLOCATED, address="node-up", port=slurmd)
    closed = socket.socket()
    closed.bind(("127.0.0.1", 0))
    dead = NodeInfo("down", NodeState.ALLOCATED, address="node-down", port=closed.getsockname()[1])
    closed.close()
    for _ in range(3):
        result = probe.probe([alive, dead])
        assert result["up"] is None and "ECONNREFUSED" in result["down"]
    probe.resolver.wait_idle()
    assert lookups.count("node-up") == 1  # once, not per tick
    assert lookups.count("node-down") >= 2  # looked up again after each failure (in the background)
    now[0] = 601.0
    probe.probe([alive])
    probe.resolver.wait_idle()
    assert lookups.count("node-up") == 2  # refreshed after refresh_s


def test_a_name_that_does_not_resolve_is_not_probed_rather_than_failed():
    probe = TcpProbe(timeout=0.5)
    result = probe.probe([NodeInfo("x", NodeState.IDLE, address="no-such-host.invalid", port=1)])
    assert result == {}
    assert probe.last_round.not_run["x"].startswith("cannot resolve no-such-host.invalid")


@pytest.mark.timing
def test_a_round_stays_within_its_time_limit_and_the_next_one_starts_where_it_stopped(unanswering):
    """Nodes that never answer: the round is cut at ``round_limit_s``; the rest are not probed this
    round (unknown, not failed) and go first in the next."""
    infos = [NodeInfo(f"n{i}", NodeState.ALLOCATED, address="127.0.0.1", port=unanswering) for i in range(6)]
    probe = TcpProbe(timeout=0.2, window=2, round_limit_s=0.3)
    first = probe.probe(infos)
    assert sorted(first) == ["n0", "n1"] and all("no answer within" in v for v in first.values())
    assert set(probe.last_round.not_run) == {"n2", "n3", "n4", "n5"}
    assert probe.last_round.seconds < 0.6
    second = probe.probe(infos)  # the connects carried over (n2, n3) are answered first, then n4, n5
    assert {"n2", "n3"} <= set(second) <= {"n2", "n3", "n4", "n5"}


_RAISE = textwrap.dedent(
    """
    import json, resource
    from supervisor.adapters.rlimits import raise_nofile
    limit = raise_nofile()
    print(json.dumps([limit.before, limit.after, resource.getrlimit(resource.RLIMIT_NOFILE)[0]]))
    """
)


def test_the_daemon_raises_its_soft_descriptor_limit_to_the_hard_one():
    """Started with systemd's default soft limit (1,024) under a higher hard one."""
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != -1 and hard <= 1024:
        pytest.skip(f"the hard limit here is {hard}")
    argv = ["prlimit", "--nofile=1024:", "--", sys.executable, "-c", _RAISE]
    result = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False)
    assert result.returncode == 0, result.stderr
    before, after, now = json.loads(result.stdout.splitlines()[-1])
    assert before == 1024 and after == now and now > 1024
