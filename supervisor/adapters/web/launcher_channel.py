"""The in-allocation launcher's channel: ``POST /v1/launcher/RUN`` (docs/in-allocation.md).

The launcher in the run's job reports what its step is (generation, alive, exit code, nodes, its
host) and is answered with the step it should run. It speaks with the run's token, checked as the
agents' reports are (``ingest.bearer_refusal``: constant-time compare), and for the run's current
job only: the job id must be the current attempt's and its host a node of that job, as the
daemon's store has them. The body is a bounded msgspec schema (names as Slurm's, lists capped).
The report is kept in the store (``launcher_reports``) through the channel's own connection; the
goal is read from it (written by the engine's journaled ``swap_step`` only), and signed with a key
derived from the run's token (``domain.wire_auth.goal_mac``): without TLS someone in the middle
could otherwise rewrite it (a newer generation from its own checkpoint), and the launcher acts
only on a goal the run's daemon signed. Clients send the token's wire form, never the token.
A standby daemon (its connections hold epoch 0: ``engine.loop.leadership``) cannot keep the report
and answers 503, so the launcher asks the next login node's daemon (``agent.launcher_client``).
"""

from __future__ import annotations

import hmac
import re
import threading
from collections import Counter
from collections.abc import Callable, Mapping
from typing import Annotated, Protocol

import msgspec
import structlog

from supervisor.adapters.web.ingest import bearer_refusal
from supervisor.adapters.web.messages import Request, Response, error
from supervisor.domain.alloc_step import LauncherReport, StepGoal
from supervisor.domain.checkpoints.resume import resume_env
from supervisor.domain.records import RunRecord
from supervisor.domain.text_safety import printable
from supervisor.domain.wire_auth import goal_mac
from supervisor.ports import Clock, NotLeading, RunStore, StepLedger

LAUNCHER_PREFIX = "/v1/launcher/"
_RUN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
NodeName = Annotated[str, msgspec.Meta(pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")]
MAX_NODES = 16_384

log = structlog.get_logger(__name__)


class LauncherPoll(msgspec.Struct, forbid_unknown_fields=True):
    """What the launcher says of its step (the request body)."""

    job_id: Annotated[int, msgspec.Meta(ge=1, le=2**53)]
    generation: Annotated[int, msgspec.Meta(ge=0, le=1_000_000)]
    alive: bool
    nodes: Annotated[list[NodeName], msgspec.Meta(max_length=MAX_NODES)]
    host: NodeName
    exit_code: Annotated[int, msgspec.Meta(ge=-255, le=255)] | None = None
    # step nodes whose slurmd the launcher could not reach: a hint that wakes the daemon (whose
    # own probe decides), since srun notices a dead node only once Slurm calls it DOWN
    unreachable: Annotated[list[NodeName], msgspec.Meta(max_length=MAX_NODES)] = []


class LauncherGoal(msgspec.Struct, forbid_unknown_fields=True):
    """The step the launcher should run (the answer). ``nodes`` None: generation 0, its own start."""

    job_id: Annotated[int, msgspec.Meta(ge=1, le=2**53)]
    generation: Annotated[int, msgspec.Meta(ge=0, le=1_000_000)]
    nodes: Annotated[list[NodeName], msgspec.Meta(max_length=MAX_NODES)] | None = None
    env: Annotated[dict[str, Annotated[str, msgspec.Meta(max_length=4096)]], msgspec.Meta(max_length=32)] = {}
    mac: Annotated[str, msgspec.Meta(max_length=100)] = ""  # the daemon's signature (sign_goal)


class ChannelStore(RunStore, StepLedger, Protocol):
    """What the channel reads and writes (the SQLite store, its own connection)."""


class LauncherChannel:
    """``wake``: cuts the daemon's wait short when a step died or a step node is unreachable, so
    the next tick comes now rather than after a poll interval (a hint; the tick decides)."""

    def __init__(
        self,
        tokens: Mapping[str, str],
        store: ChannelStore,
        clock: Clock,
        wake: Callable[[], object] | None = None,
        counters: Counter[str] | None = None,
    ) -> None:
        self.tokens, self.store, self.clock, self.wake = tokens, store, clock, wake
        # the server's counters (wiring shares them), so a flood of refused polls shows as the
        # reports' refusals do: launcher_requests, launcher_rejected_STATUS
        self.counters: Counter[str] = Counter() if counters is None else counters
        self._decoder = msgspec.json.Decoder(LauncherPoll)
        self._lock = threading.Lock()  # one SQLite connection: one request at a time
        # run -> (job, generation, unreachable nodes) last reported: a hint's memory only (a
        # restarted daemon forgets it and is woken once more)
        self._unreachable: dict[str, tuple[int, int, frozenset[str]]] = {}
        store.channel_listening(clock.now())  # launchers' silence counts from now on, not while no daemon ran

    def handle(self, request: Request) -> Response:
        self.counters["launcher_requests"] += 1
        response = self._handle(request)
        if response.status != 200:
            self.counters[f"launcher_rejected_{response.status}"] += 1
        return response

    def _handle(self, request: Request) -> Response:
        run = request.path[len(LAUNCHER_PREFIX) :]
        if not _RUN.match(run):
            return error(404, "POST to /v1/launcher/RUN (RUN: the run's name)")
        if request.method != "POST":
            return error(405, "the launcher polls with POST")
        denied = bearer_refusal(self.tokens, run, request.headers.get("authorization", ""))
        if denied is not None:
            return denied
        try:
            poll = self._decoder.decode(request.body)
        except (msgspec.ValidationError, msgspec.DecodeError) as exc:
            return error(400, f"malformed launcher report: {printable(str(exc), 300)}")
        with self._lock:
            return self._answer(run, poll)

    def _answer(self, run: str, poll: LauncherPoll) -> Response:
        record = self.store.get_run(run)
        attempt = record.attempt if record is not None else None
        if attempt is None or attempt.job_id != poll.job_id:
            return error(403, f"job {poll.job_id} is not run {run!r}'s current job")
        if not attempt.nodes:
            return error(409, f"job {poll.job_id} is not seen running yet; ask again")
        if poll.host not in attempt.nodes:
            return error(403, f"host {poll.host!r} is not a node of job {poll.job_id}")
        heard = LauncherReport(
            poll.job_id, poll.generation, poll.alive, tuple(poll.nodes), poll.host, self.clock.now(), poll.exit_code
        )
        try:
            self.store.launcher_reported(run, heard)  # before the wake: the tick it brings reads the report
        except NotLeading:  # a standby's connection (epoch 0): the launcher asks the next login node
            return error(503, "this daemon stands by: another login node's daemon leads the instance; ask it")
        if self.wake is not None and self._news_of_trouble(run, _last_report(record), poll):
            log.info(
                "launcher_wakes_daemon",
                run=run,
                job_id=poll.job_id,
                alive=poll.alive,
                unreachable=poll.unreachable[:16],
            )
            self.wake()
        goal = goal_answer(poll.job_id, self.store.step_goal(run, poll.job_id))
        return Response(200, msgspec.json.encode(sign_goal(goal, run, self.tokens[run])))

    def _news_of_trouble(self, run: str, before: LauncherReport | None, poll: LauncherPoll) -> bool:
        """A step node newly unreachable, or the step just found dead (not each poll while it stays so)."""
        seen = (poll.job_id, poll.generation, frozenset(poll.unreachable))
        known = self._unreachable.get(run)
        self._unreachable[run] = seen
        if poll.unreachable and (known is None or known[:2] != seen[:2] or not seen[2] <= known[2]):
            return True
        if poll.alive:
            return False
        return before is None or before.job_id != poll.job_id or before.generation != poll.generation or before.alive


def _last_report(record: RunRecord | None) -> LauncherReport | None:
    return record.step.report if record is not None and record.step is not None else None


def sign_goal(goal: LauncherGoal, run: str, token: str) -> LauncherGoal:
    return msgspec.structs.replace(goal, mac=_mac(goal, run, token))


def goal_signed(goal: LauncherGoal, run: str, token: str) -> bool:
    """Did the run's daemon sign this goal (every field of it)?"""
    return hmac.compare_digest(goal.mac.encode(), _mac(goal, run, token).encode())


def _mac(goal: LauncherGoal, run: str, token: str) -> str:
    return goal_mac(token, run, goal.job_id, goal.generation, goal.nodes, goal.env)


def goal_answer(job_id: int, goal: StepGoal | None) -> LauncherGoal:
    if goal is None:
        return LauncherGoal(job_id, 0)
    env = resume_env(goal.resume) if goal.resume is not None else {}
    return LauncherGoal(job_id, goal.generation, list(goal.nodes), env)
