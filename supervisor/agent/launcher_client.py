"""The launcher's side of the channel (``adapters.web.launcher_channel``): one POST per poll with the
run's token (its wire form: the token never crosses the network), the answer read bounded and
validated, and acted on only when the run's daemon signed it (``goal_signed``: someone in the
middle cannot hand the launcher a step of its own). Any failure is "no answer": the launcher keeps
its step as it is (jobs outlive the daemon)."""

from __future__ import annotations

import http.client
import urllib.parse

import msgspec
import structlog

from supervisor.adapters.web.launcher_channel import LAUNCHER_PREFIX, LauncherGoal, LauncherPoll, goal_signed
from supervisor.agent.daemon_url import daemon_urls, run_endpoint
from supervisor.domain.wire_auth import wire_token

log = structlog.get_logger(__name__)

MAX_ANSWER = 1 << 16  # bytes read of an answer; a goal is a few hundred
_NOT_THE_LEADER = frozenset({0, 503})  # no answer, or a standby daemon (adapters.web.launcher_channel)


class ChannelClient:
    """``url``: one daemon URL or several, comma-separated (``daemon_url.daemon_urls``): one per
    login node of the instance. Each poll goes to the one that answered last; when it gives no
    answer or says it stands by (503), to the others in turn, and the first that answers is kept."""

    def __init__(self, url: str, run: str, token: str, timeout_s: float = 5.0) -> None:
        self._endpoints = [run_endpoint(one, LAUNCHER_PREFIX, run) for one in daemon_urls(url)]
        self._current = 0
        self._run, self._token = run, token
        self.timeout_s = timeout_s
        self._decoder = msgspec.json.Decoder(LauncherGoal)
        self._problem: str | None = None

    def poll(self, report: LauncherPoll) -> LauncherGoal | None:
        """Report; the goal the daemon answers, or None when it does not (said once in the log)."""
        status, body = self._post_to_leader(msgspec.json.encode(report))
        if status != 200:
            self._say(f"{status or 'no answer'}: {body[:200]!r}")
            return None
        try:
            goal = self._decoder.decode(body)
        except (msgspec.ValidationError, msgspec.DecodeError) as exc:
            self._say(f"unreadable answer: {exc}")
            return None
        if not goal_signed(goal, self._run, self._token):
            self._say("an answer the run's daemon did not sign (rewritten on the way?); not acted on")
            return None
        self._say(None)
        return goal if goal.job_id == report.job_id else None

    @property
    def path(self) -> str:
        """The run's endpoint on the daemon polled now."""
        return self._endpoints[self._current][1]

    def _post_to_leader(self, body: bytes) -> tuple[int, bytes]:
        """The answer of the daemon that answered last, else of the first other that answers as
        the leader (a standby's 503 and no answer move on; any other answer is the leader's)."""
        count = len(self._endpoints)
        status, answer = 0, b""
        for step in range(count):
            index = (self._current + step) % count
            status, answer = self._post(self._endpoints[index], body)
            if status not in _NOT_THE_LEADER:
                self._current = index
                break
        return status, answer

    def _post(self, endpoint: tuple[urllib.parse.SplitResult, str], body: bytes) -> tuple[int, bytes]:
        p, path = endpoint
        cls = http.client.HTTPSConnection if p.scheme == "https" else http.client.HTTPConnection
        conn = cls(p.hostname or "", p.port, timeout=self.timeout_s)
        headers = {"Content-Type": "application/json", "Authorization": f"Bearer {wire_token(self._token)}"}
        try:
            conn.request("POST", path, body=body, headers=headers)
            response = conn.getresponse()
            return response.status, response.read(MAX_ANSWER)
        except (OSError, http.client.HTTPException) as exc:
            return 0, f"{type(exc).__name__}: {exc}".encode()
        finally:
            conn.close()

    def _say(self, problem: str | None) -> None:
        if problem != self._problem:
            if problem is None:
                log.info("launcher_daemon_reachable")
            else:
                log.warning("launcher_daemon_unreachable", problem=problem)
            self._problem = problem
