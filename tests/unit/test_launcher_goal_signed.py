"""Issue 32, finding 9: without TLS, someone in the middle on the cluster network could rewrite the
daemon's answer to the in-allocation launcher (generation+1, the same nodes, its own checkpoint in
``SSV_RESUME_CHECKPOINT``) and the launcher restarted the step from it. Now the daemon signs every
goal with a key derived from the run's token, the launcher acts only on a goal the run's daemon
signed, and no client sends the token itself (its one-way wire form: a reader of the traffic
cannot derive the key).

The middle here is a real HTTP server between the launcher's client and the daemon's real channel."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from supervisor.adapters.sqlite import SqliteStore
from supervisor.adapters.web.launcher_channel import LauncherChannel, LauncherPoll, sign_goal
from supervisor.adapters.web.messages import Request
from supervisor.agent.launcher_client import ChannelClient
from supervisor.agent.sender import HttpSender
from supervisor.domain.alloc_step import StepGoal
from supervisor.domain.checkpoints.manifest import Guarantee
from supervisor.domain.checkpoints.resume import CheckpointPick, ResumePlan
from supervisor.domain.health.node_report import NodeReport
from supervisor.domain.wire_auth import speaks_for, wire_token
from supervisor.testing.kit.clock import ManualClock
from supervisor.testing.kit.specs import spec

TOKEN = "the-runs-token"
POLL = LauncherPoll(job_id=7, generation=0, alive=True, nodes=["n1", "n2"], host="n1")
Rewrite = Callable[[dict], dict]


@pytest.fixture
def channel(tmp_path: Path) -> LauncherChannel:
    store = SqliteStore(tmp_path)
    store.add_run(spec(name="llm", script="/s.sh"), 1.0)
    store.add_attempt("llm", 7, 0, 2.0)
    store.attempt_started("llm", 0, ("n1", "n2", "n3"), 3.0)
    plan = ResumePlan(chosen=CheckpointPick("/ckpt/llm/step_000200", 200, Guarantee.MANIFEST))
    store.set_step_goal("llm", StepGoal(7, 1, ("n1", "n3"), "n2 died", 40.0, plan))
    return LauncherChannel({"llm": TOKEN}, store, ManualClock(50.0))


def middle(channel: LauncherChannel, rewrite: Rewrite, seen: list[str] | None = None) -> Iterator[str]:
    """A server in the middle: passes the launcher's poll to the daemon, rewrites the answer, and
    keeps the Authorization headers it read (in ``seen``)."""

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802 (http.server's name)
            body = self.rfile.read(int(self.headers["Content-Length"]))
            headers = {"authorization": self.headers["Authorization"]}
            if seen is not None:
                seen.append(self.headers["Authorization"])
            answer = channel.handle(Request("POST", self.path, "", headers, body, "127.0.0.1"))
            data = json.dumps(rewrite(json.loads(answer.body))).encode()
            self.send_response(answer.status)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def goal_through(channel: LauncherChannel, rewrite: Rewrite):  # noqa: ANN201
    for url in middle(channel, rewrite):
        return ChannelClient(url, "llm", TOKEN, timeout_s=5.0).poll(POLL)
    raise AssertionError("no server")


def planted(goal: dict) -> dict:
    return {**goal, "generation": goal["generation"] + 1, "env": {"SSV_RESUME_CHECKPOINT": "/scratch/mallory/step_9"}}


def test_the_daemons_goal_reaches_the_launcher_unchanged(channel):
    goal = goal_through(channel, lambda g: g)
    assert goal is not None and (goal.generation, goal.nodes) == (1, ["n1", "n3"])
    assert goal.env["SSV_RESUME_CHECKPOINT"] == "/ckpt/llm/step_000200"


@pytest.mark.parametrize(
    "rewrite",
    [
        planted,  # the attack of the review: a newer generation from the attacker's checkpoint
        lambda g: {**g, "nodes": ["n3", "n2"]},
        lambda g: {k: v for k, v in planted(g).items() if k != "mac"},  # a goal without a signature
        lambda g: {**g, "mac": "hmac-sha256:" + "0" * 64},
        lambda g: json.loads(sign_goal_json(planted(g), "another-runs-token")),
    ],
)
def test_a_goal_rewritten_on_the_way_is_not_acted_on(channel, rewrite):
    assert goal_through(channel, rewrite) is None


def sign_goal_json(goal: dict, token: str) -> str:
    from supervisor.adapters.web.launcher_channel import LauncherGoal

    body = {k: v for k, v in goal.items() if k != "mac"}
    return json.dumps({**body, "mac": sign_goal(LauncherGoal(**body), "llm", token).mac})


def test_no_client_sends_the_runs_token_itself(channel):
    seen: list[str] = []

    def keep(goal: dict) -> dict:
        return goal

    for url in middle(channel, keep, seen):
        ChannelClient(url, "llm", TOKEN, timeout_s=5.0).poll(POLL)
        sender = HttpSender(url, "llm", TOKEN, "n1")
        sender.add(NodeReport(v=1, node="n1", seq=1, at=1.0))
        sender.flush(0.0, force=True)
    assert len(seen) == 2 and all(TOKEN not in header for header in seen), seen
    assert all(header == f"Bearer {wire_token(TOKEN)}" for header in seen)
    assert speaks_for(wire_token(TOKEN), TOKEN) and speaks_for(TOKEN, TOKEN)  # an older client's token too
    assert not speaks_for(wire_token("another"), TOKEN) and not speaks_for(wire_token(TOKEN)[:-1], TOKEN)
