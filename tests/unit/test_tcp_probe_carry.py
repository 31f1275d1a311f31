"""A probe round that does not finish within its share of the tick carries over (issue 14): the call
returns at its budget, the connects still open stay open (within the window) and are answered at a
later call — a node that never answers is still found dead, but no tick waits for it."""

from __future__ import annotations

import os
import socket
import time

import pytest

from supervisor.adapters.slurm.tcp_probe import TcpProbe
from supervisor.domain.cluster import NodeInfo, NodeState


@pytest.fixture
def listening():
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(64)
    yield server.getsockname()[1]
    server.close()


def nodes(port: int, *names: str) -> list[NodeInfo]:
    return [NodeInfo(n, NodeState.ALLOCATED, address="127.0.0.1", port=port) for n in names]


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


@pytest.mark.timing
def test_a_round_longer_than_its_budget_returns_at_the_budget_and_is_answered_later(unanswering, listening):
    probe = TcpProbe(timeout=0.4, window=8, round_limit_s=0.1)
    hung, up = nodes(unanswering, "h1", "h2"), nodes(listening, "u1")
    started = time.monotonic()
    first = probe.probe(hung + up)
    assert time.monotonic() - started < 0.3  # not the 0.4 s a hung connect takes
    assert first == {"u1": None}  # the hung nodes: not answered yet — unknown, not failed
    assert set(probe.last_round.not_run) == {"h1", "h2"}
    time.sleep(0.4)
    second = probe.probe(hung + up)
    assert second["u1"] is None
    assert "no answer within 0.4 s" in second["h1"] and "no answer within 0.4 s" in second["h2"]
    assert probe.last_round.seconds < 0.3


def test_connects_carried_over_stay_within_the_window_and_are_closed_when_no_longer_asked_for(unanswering):
    before = open_fds()
    probe = TcpProbe(timeout=5.0, window=4, round_limit_s=0.05)
    names = [f"n{i}" for i in range(10)]
    probe.probe(nodes(unanswering, *names))
    assert open_fds() - before <= 4 + 1  # the window, and the selector's own descriptor
    probe.probe(nodes(unanswering, *names))  # the same connects, still open: none started twice
    assert probe.last_round.most_open <= 4
    probe.probe([])
    assert open_fds() - before <= 1
    probe.close()
    assert open_fds() <= before
