"""Evidence before the kill (issue 35): between the hang verdict and the cancel, every rank's
Python stacks are captured (the ``StackCapture`` port: an overlapping step in the job), judged
(``domain.stacks.verdict``), kept (the ``StackArchive``), and added to the hang's evidence.

When the stacks single out ranks and the per-rank progress did not, their nodes become the hang's
``suspect_nodes``: the decision that follows keeps them out of the restart (or the in-allocation
relaunch) exactly as it does for per-rank steps. Otherwise the evidence says "no single rank" and
nobody is blamed. A capture that fails (py-spy missing, ptrace refused, a node that does not
answer) delays nothing beyond its deadline; the hang's reason says why there are no stacks.

Once per hung attempt (job, restart count, step generation): the next ticks, until the cancel is
done, reuse the result. Several hung runs are captured at once (at most ``MAX_AT_ONCE``; more
runs hung together are cancelled without stacks), so a tick waits one deadline at most. Not kept across a daemon restart: a restarted daemon captures again.
Only the leader captures (``may_act``, which raises otherwise): a standby does not reach into jobs.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import structlog

from supervisor.domain.cluster import ClusterSnapshot
from supervisor.domain.decide.in_allocation import current_step
from supervisor.domain.records import RunRecord
from supervisor.domain.stacks.dumps import Capture
from supervisor.domain.stacks.verdict import StackVerdict, judge
from supervisor.ports import Clock, StackArchive, StackCapture

log = structlog.get_logger("supervisor.engine")

Key = tuple[int, int, int]  # job id, restart count, step generation
MAX_AT_ONCE = 8  # captures in one tick (run in parallel: the tick waits one deadline)


class HangStacks:
    def __init__(
        self,
        capture: StackCapture,
        archive: StackArchive | None,
        clock: Clock,
        may_act: Callable[[], None] | None = None,
    ) -> None:
        self.capture, self.archive, self.clock = capture, archive, clock
        self.may_act = may_act
        self._done: dict[str, tuple[Key, dict[str, Any]]] = {}  # run -> the examined attempt, its additions

    def examine(
        self, runs: Iterable[RunRecord], snap: ClusterSnapshot, hangs: Mapping[str, Mapping[str, Any]]
    ) -> dict[str, Mapping[str, Any]]:
        """``hangs`` with each hung run's stacks added (captured once per hung attempt)."""
        todo: list[tuple[RunRecord, Key, tuple[str, ...]]] = []
        current: dict[str, Key] = {}  # the hung attempt each run is examined for now
        for run in runs:
            a = run.attempt
            job = snap.jobs.get(a.job_id) if a is not None and run.name in hangs else None
            if a is None or job is None:
                continue
            goal, nodes = current_step(run, a, job.nodes)
            key = current[run.name] = (a.job_id, a.restart_count, goal.generation if goal is not None else 0)
            done = self._done.get(run.name)
            if done is None or done[0] != key:
                todo.append((run, key, tuple(nodes)))
        self._capture_all(todo, hangs)
        for name in set(self._done) - set(hangs):
            del self._done[name]
        fresh = {name: done[1] for name, done in self._done.items() if current.get(name) == done[0]}
        return {name: merged(h, fresh[name]) if name in fresh else h for name, h in hangs.items()}

    def _capture_all(self, todo: list[tuple[RunRecord, Key, tuple[str, ...]]], hangs: Mapping[str, Mapping[str, Any]]) -> None:  # fmt: skip
        """Every run's capture at once (the tick waits one deadline, however many runs hang): at
        most ``MAX_AT_ONCE``; the others are cancelled without stacks (many runs hanging together
        is a job-wide cause, which stacks would not pin on one rank)."""
        if not todo:
            return
        if self.may_act is not None:
            self.may_act()  # raises NotLeading: the tick is interrupted, as the gated scheduler's commands are
        now, busy = todo[:MAX_AT_ONCE], todo[MAX_AT_ONCE:]
        with ThreadPoolExecutor(max_workers=len(now), thread_name_prefix="hang-stacks") as pool:
            found = list(pool.map(lambda item: self.capture.capture(item[1][0], item[2]), now))
        for (run, key, nodes), capture in zip(now, found, strict=True):
            self._done[run.name] = (key, self._kept(run, key, nodes, capture, hangs[run.name]))
        for run, key, _ in busy:
            why = f"more than {MAX_AT_ONCE} runs hung at once: no stacks taken for this one"
            self._done[run.name] = (
                key,
                {"stacks": {"captured": False, "why": why}, "reason_stacks": f"no stacks: {why}"},
            )

    def _kept(self, run: RunRecord, key: Key, nodes: tuple[str, ...], capture: Capture, hang: Mapping[str, Any]) -> dict[str, Any]:  # fmt: skip
        verdict = judge(capture.dumps, nodes, capture.missing)
        name = f"job{key[0]}-r{key[1]}-g{key[2]}-{self.clock.now():.0f}"
        path = self.archive.keep(run.name, name, capture, verdict) if self.archive is not None else None
        log.info("hang_stacks", run=run.name, job=key[0], summary=verdict.summary, took_s=round(capture.took_s, 2), file=path)  # fmt: skip
        return additions(capture, verdict, path, already_named=bool(hang.get("suspect_nodes")))


def additions(capture: Capture, verdict: StackVerdict, path: str | None, already_named: bool) -> dict[str, Any]:
    """What the stacks add to a hang's evidence: their summary and groups, the capture's time and
    file; the suspects, when they single ranks out and the per-rank progress named none."""
    stacks = {
        "captured": verdict.ranks > 0,
        "capture_s": round(capture.took_s, 3),
        "missing": dict(list(capture.missing.items())[:16]),
        "file": path,
        **verdict.evidence(),
    }
    out: dict[str, Any] = {"stacks": stacks}
    said = verdict.summary if verdict.ranks else f"{verdict.summary} (after {capture.took_s:.1f} s; the cancel follows)"
    out["reason_stacks"] = f"stacks: {said}"
    if verdict.singled_out and not already_named:
        out["suspects"] = f"stacks: {verdict.summary}"
        out["suspect_nodes"] = list(verdict.nodes)
    return out


def merged(hang: Mapping[str, Any], added: Mapping[str, Any]) -> dict[str, Any]:
    """The hang's evidence with the stacks' additions; the stacks' sentence joins its reason."""
    extra = {k: v for k, v in added.items() if k != "reason_stacks"}
    reason = str(hang.get("reason", "no progress"))
    return {**hang, **extra, "reason": f"{reason}; {added['reason_stacks']}"}
