"""The launcher tells the daemon at once when its step dies or a step node stops answering,
instead of at its next poll (issue 16: detection speed)."""

from __future__ import annotations

import socket
import time
from pathlib import Path

import pytest
from test_launcher import Channel, fake_srun, run_in_thread, settings, wait

from supervisor.agent.launcher import Launcher
from supervisor.agent.step_reach import SlurmdReach
from supervisor.domain.cluster import ClusterSnapshot, NodeInfo, NodeState

SLOW_POLL_S = 30.0  # without the news the launcher would say nothing for half a minute


@pytest.mark.timing
def test_a_step_that_dies_is_reported_before_the_next_poll(tmp_path: Path) -> None:
    srun, _ = fake_srun(tmp_path, "sleep 0.3; exit 3")
    channel = Channel()
    launcher = Launcher(settings(srun, poll_s=SLOW_POLL_S, decision_wait_s=60.0), channel)  # type: ignore[arg-type]
    thread, _ = run_in_thread(launcher)
    started = time.monotonic()
    wait(lambda: any(not r.alive for r in channel.reports))
    assert time.monotonic() - started < 5.0
    assert channel.reports[-1].exit_code == 3
    launcher.stopping.set()
    thread.join(5)
    assert not thread.is_alive()  # a stop still ends the wait at once


def test_step_nodes_that_stop_answering_are_reported_and_looked_at_often(tmp_path: Path) -> None:
    srun, _ = fake_srun(tmp_path)
    channel = Channel()
    down: set[str] = set()
    launcher = Launcher(
        settings(srun, poll_s=0.5),
        channel,  # type: ignore[arg-type]
        reach=lambda nodes: tuple(n for n in nodes if n in down),
    )
    thread, _ = run_in_thread(launcher)
    wait(lambda: channel.reports)
    assert channel.reports[-1].unreachable == []
    down.add("n2")
    wait(lambda: channel.reports[-1].unreachable == ["n2"])
    seen = len(channel.reports)
    wait(lambda: len(channel.reports) >= seen + 3, timeout=1.2)  # faster than the 0.5 s poll while it lasts
    launcher.stopping.set()
    thread.join(5)


class _Slurm:
    """Slurm's node records: each node's slurmd on its own local port."""

    def __init__(self, ports: dict[str, int]) -> None:
        self.ports, self.reads = ports, 0

    def snapshot_of(self, jobs, include_nodes) -> ClusterSnapshot:  # noqa: ANN001
        self.reads += 1
        nodes = {n: NodeInfo(n, NodeState.ALLOCATED, address="127.0.0.1", port=p) for n, p in self.ports.items()}
        return ClusterSnapshot(taken_at=0.0, jobs={}, nodes=nodes)


def test_the_launcher_finds_a_step_node_whose_slurmd_is_gone() -> None:
    with socket.socket() as alive, socket.socket() as gone:
        alive.bind(("127.0.0.1", 0))
        alive.listen()
        gone.bind(("127.0.0.1", 0))  # bound, not listening: connects are refused
        slurm = _Slurm({"n1": alive.getsockname()[1], "n2": gone.getsockname()[1]})
        reach = SlurmdReach(slurm, 7)
        assert reach(("n1", "n2")) == ("n2",) and reach(("n1", "n2")) == ("n2",)
        assert slurm.reads == 1  # addresses read once per set of step nodes
        assert reach(("n1",)) == () and slurm.reads == 2
