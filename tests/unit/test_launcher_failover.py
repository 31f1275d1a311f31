"""A launcher after a failover (issue 33): its job was given every login node's daemon URL, the
leader's first; a standby answers 503 (its connections hold epoch 0, so it cannot keep the report),
a dead daemon does not answer, and the launcher polls the first that answers as the leader.

Two real daemons' channels on one SQLite store (two connections, the leader lease and the fence
between them), each behind a real HTTP server on a port of its own."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from pathlib import Path

import msgspec
import pytest

from supervisor.adapters.sqlite import SqliteStore
from supervisor.adapters.web.launcher_channel import LauncherChannel, LauncherPoll
from supervisor.adapters.web.messages import Request, Response
from supervisor.adapters.web.server import HttpServer
from supervisor.agent.daemon_url import MAX_URLS, daemon_urls
from supervisor.agent.launcher_client import ChannelClient
from supervisor.domain.alloc_step import StepGoal
from supervisor.domain.run import RestartMode
from supervisor.testing.kit.clock import ManualClock
from supervisor.testing.kit.specs import spec

SPEC = spec(script="/s.sh", restart_mode=RestartMode.IN_ALLOCATION, hot_spares=1)
TOKEN = "secret-token"
REPORT = LauncherPoll(job_id=7, generation=0, alive=True, nodes=["n1", "n2"], host="n1")


class Daemon:
    """One login node's daemon as the launcher sees it: a store connection and its channel's server."""

    def __init__(self, state: Path, epoch: int) -> None:
        self.store = SqliteStore(state)
        self.channel = LauncherChannel({"llm": TOKEN}, self.store, ManualClock(50.0))
        self.polls = 0
        self.server = HttpServer(port=0)
        self.server.mount("/v1/launcher/", self._handle)
        self.store.hold_epoch(epoch)
        self.server.start()

    def _handle(self, request: Request) -> Response:
        self.polls += 1
        return self.channel.handle(request)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.port}"

    def stop(self) -> None:
        self.server.stop()
        self.store.close()


@pytest.fixture
def two_daemons(tmp_path: Path) -> Iterator[tuple[Daemon, Daemon]]:
    setup = SqliteStore(tmp_path)
    setup.add_run(SPEC, 1.0)
    setup.add_attempt("llm", 7, 0, 2.0)
    setup.attempt_started("llm", 0, ("n1", "n2", "n3"), 3.0)
    leads = setup.claim_lease("login2:1:a", "http://login2", 15.0)
    setup.set_step_goal("llm", StepGoal(7, 1, ("n1", "n3"), "n2 died", 40.0))  # the swap the new leader wrote
    setup.close()
    standby, leader = Daemon(tmp_path, epoch=0), Daemon(tmp_path, epoch=leads.epoch)
    try:
        yield standby, leader
    finally:
        standby.stop()
        leader.stop()


def _dead_url() -> str:
    with socket.socket() as s:  # a port nothing listens on: the old leader's login node, gone
        s.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{s.getsockname()[1]}"


def test_a_standby_refuses_the_launchers_report_and_keeps_nothing(two_daemons) -> None:
    standby, _ = two_daemons
    body, headers = msgspec.json.encode(REPORT), {"authorization": f"Bearer {TOKEN}"}
    answer = standby.channel.handle(Request("POST", "/v1/launcher/llm", "", headers, body, "127.0.0.1"))
    assert answer.status == 503 and b"stands by" in answer.body
    assert standby.store.launcher_report("llm", 7) is None


def test_the_launcher_finds_the_new_leader_past_a_dead_daemon_and_a_standby(two_daemons) -> None:
    standby, leader = two_daemons
    client = ChannelClient(f"{_dead_url()},{standby.url},{leader.url}", "llm", TOKEN, timeout_s=2.0)
    goal = client.poll(REPORT)
    assert goal is not None and (goal.generation, goal.nodes) == (1, ["n1", "n3"])
    assert leader.store.launcher_report("llm", 7) is not None  # the leader kept the report
    assert client.path == "/v1/launcher/llm"
    assert (standby.polls, leader.polls) == (1, 1)
    assert client.poll(REPORT) is not None  # the next poll goes to the leader at once
    assert (standby.polls, leader.polls) == (1, 2)


def test_a_job_is_given_at_most_a_few_checked_urls() -> None:
    assert daemon_urls("http://login1:8471, http://login2:8471") == ("http://login1:8471", "http://login2:8471")
    for bad in ("", "login1:8471", "http://login1:8471,ftp://x", ",".join(["http://l:1"] * (MAX_URLS + 1))):
        with pytest.raises(ValueError, match="URL"):
            daemon_urls(bad)
