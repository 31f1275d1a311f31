"""Replaying finished training logs through the daemon's own watch, offline: what the supervisor
would have decided, and when (``slurm-supervisor analyze``, docs/analyze.md).

Nothing is re-implemented here. Each log is one attempt of one run; its lines are handed to the
daemon's ``ProgressWatch`` the way the daemon reads a live log — in polls, every ``poll_s`` seconds
of the log's own time (``domain.progress.line_clock``) — with a snapshot that shows the attempt's
job running, and what the watch reports goes through the same engine functions as in a tick:
spike notices through ``engine.watch.spikes.spike_records`` (logbook events, rollback decisions against
the run's store), stragglers, slowdowns and imbalances as the watch names them, hang verdicts from
``ProgressWatch.update``. Between two polls that bring lines, a poll is made where the watch's own
``next_deadline`` falls, as the simulator does, so a silence is called a hang at the first poll past
its limit.

Checkpoints: a save the log reports finished is taken as a verified checkpoint at its step (the
daemon would verify it in storage; offline there is only the log's word), registered in the store
after the poll that read its end, where the daemon's checkpoint watch would find it; with
``checkpoint_every`` one is assumed every that many steps as well.

Bounded: lines are taken from an iterator (the caller streams the file); a poll reads at most
``MAX_BATCH`` lines; at most ``limit`` entries of each kind are kept, the rest counted.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from itertools import chain
from typing import Any

from supervisor.domain.checkpoints.manifest import CheckpointRef, Guarantee, Level, Outcome, VerifyResult
from supervisor.domain.cluster import ClusterSnapshot, JobInfo, JobState
from supervisor.domain.progress import parse_trainer_state, parser_for
from supervisor.domain.progress.hang import HangDetector, HangSettings
from supervisor.domain.progress.line_clock import ClockSource, LineClock, SaveTracker
from supervisor.domain.records import Event, EventKind, RunRecord
from supervisor.domain.run import CheckpointPolicy, RunSpec, SpikePolicy
from supervisor.domain.spikes.rollback import RollbackRecord
from supervisor.engine.watch.pace import imbalance_events
from supervisor.engine.watch.progress import ProgressWatch
from supervisor.engine.watch.spikes import spike_records
from supervisor.ports import Store

MAX_BATCH = 4096  # lines one poll reads at most (the daemon reads at most 4 MiB per poll)
ASSUMED_PER_STEP = 64  # checkpoints assumed (--checkpoint-every) per record at most
HEAD_LINES = 5000  # lines looked at for a timestamp before the replay starts ...
HEAD_CHARS = 4 * 1024 * 1024  # ... and characters
_STOPS = {EventKind.ROLLBACK.value: "a rollback", "hang": "a hang"}


@dataclass(frozen=True)
class ReplaySettings:
    hang: HangSettings = field(default_factory=HangSettings)
    spikes: SpikePolicy = field(default_factory=SpikePolicy)
    poll_s: float = 5.0  # the daemon's poll interval ([daemon] poll_interval_s)
    nodes: tuple[str, ...] = ()  # the job's nodes, in Slurm's order: per-rank times are folded onto them
    checkpoint_every: int | None = None  # assume a verified checkpoint every this many steps
    run: str = "replay"
    limit: int = 200  # entries kept per kind

    def __post_init__(self) -> None:
        if not (math.isfinite(self.poll_s) and self.poll_s > 0) or self.limit < 1:
            raise ValueError("poll_s must be a positive number of seconds and limit at least 1")
        if self.checkpoint_every is not None and self.checkpoint_every < 1:
            raise ValueError("checkpoint_every must be at least 1 step")


@dataclass(frozen=True)
class AttemptLog:
    """One attempt's log: a name for people, its lines in order, and the format it is read as
    (``None``: detected as the daemon does)."""

    name: str
    lines: Iterable[str]
    log_format: str | None = None
    format_note: str = ""  # how the format was chosen, for people ("forced", "trainer_state.json")
    shown_format: str | None = None  # the format to name, when the lines were converted from another


@dataclass(frozen=True)
class Entry:
    """One thing the supervisor would have seen or done."""

    at: float
    attempt: int
    kind: str
    message: str
    step: int | None = None
    after_stop: bool = False  # the supervisor would have stopped this attempt before it
    evidence: Mapping[str, Any] = field(default_factory=dict)


@dataclass
class AttemptSummary:
    index: int
    log: str
    format: str | None = None
    format_note: str = ""
    clock: str = ClockSource.STEP_TIMES.value
    lines: int = 0
    records: int = 0
    first_step: int | None = None
    last_step: int | None = None
    started_at: float = 0.0
    ended_at: float = 0.0
    step_time_s: float | None = None
    hang_interval_s: float | None = None
    hang_threshold_s: float | None = None
    saves: int = 0
    save_median_s: float | None = None
    stopped: str | None = None  # why the supervisor would have stopped it (a rollback, a hang)
    stopped_at: float | None = None


@dataclass
class ReplayReport:
    settings: ReplaySettings
    attempts: list[AttemptSummary] = field(default_factory=list)
    entries: list[Entry] = field(default_factory=list)
    counts: dict[str, int] = field(default_factory=dict)  # per kind, kept and omitted
    omitted: dict[str, int] = field(default_factory=dict)


class _ReplayClock:
    """The Clock port at the replay's time; it never waits."""

    def __init__(self) -> None:
        self.t = 0.0

    def now(self) -> float:
        return self.t

    def wait(self, seconds: float) -> bool:
        return True


class _Lines:
    """The LogSource the watch reads: the lines of the current poll."""

    def __init__(self) -> None:
        self.lines: list[str] = []

    def read_lines(self) -> list[str]:
        out, self.lines = self.lines, []
        return out

    def close(self) -> None:
        self.lines = []


def replay(logs: Sequence[AttemptLog], store: Store, settings: ReplaySettings) -> ReplayReport:
    """Replay ``logs`` (consecutive attempts of one run) into an empty ``store``."""
    player = _Replayer(store, settings)
    for index, log in enumerate(logs):
        player.attempt(index, log)
    return player.report


class _Replayer:
    def __init__(self, store: Store, settings: ReplaySettings) -> None:
        self.store, self.s = store, settings
        self.clock = _ReplayClock()
        self.source = _Lines()
        self.progress = ProgressWatch(lambda path, at_end: self.source, settings.hang)
        spec = RunSpec(
            name=settings.run, script="/dev/null", partition="replay", nodes=max(1, len(settings.nodes)),
            workdir="/", checkpoints=CheckpointPolicy(root="log://"), spikes=settings.spikes,
        )  # fmt: skip
        store.add_run(spec, 0.0)
        self.report = ReplayReport(settings)
        self.end = 0.0  # where the previous attempt's log ended

    # ------------------------------------------------------------------ one attempt

    def attempt(self, index: int, log: AttemptLog) -> None:
        lines = iter(log.lines)
        head = _head(lines)
        self.progress.log_format = log.log_format
        clock = LineClock.start(parser_for(log.log_format), head, self.end)
        self.line_clock, self.saves, self.shown_format = clock, SaveTracker(), log.shown_format
        self.summary = AttemptSummary(index, log.name, format_note=log.format_note, clock=clock.source.value)
        self.summary.started_at = self.summary.ended_at = self.clock.t = clock.now
        self.pending_ckpts: list[int] = []
        self.assumed_to = 0  # the step up to which checkpoints were assumed (checkpoint_every)
        self.hung_after: set[int | None] = set()
        self.start_attempt(index, clock.now)
        self._stream(chain(head, lines))
        self._finish()

    def start_attempt(self, index: int, at: float) -> None:
        a = self.store.add_attempt(self.s.run, index + 1, 0, at)
        self.store.attempt_started(self.s.run, a.seq, self.s.nodes, at)
        self.store.rollbacks_done(self.s.run, a.seq)  # the previous attempt's planned rollback was carried out
        run = self.store.get_run(self.s.run)
        assert run is not None and run.attempt is not None
        self.run: RunRecord = run
        self.origin, self.job = (
            at,
            JobInfo(a.job_id, self.s.run, JobState.RUNNING, nodes=self.s.nodes, stdout="/replay"),
        )

    def _stream(self, lines: Iterator[str]) -> None:
        pending: list[str] = []
        pending_at = self.origin
        for line in lines:
            self.summary.lines += 1
            at, record = self.line_clock.time_of(line)
            self._note(line, at, record)
            poll = self._poll_after(at)
            if pending and (poll > pending_at or len(pending) >= MAX_BATCH):
                self._tick(pending, pending_at)
                pending = []
            if not pending and self.line_clock.judges_hangs:
                self._silence(poll)
            pending.append(line)
            pending_at = max(pending_at, poll)
        if pending:
            self._tick(pending, pending_at)

    def _note(self, line: str, at: float, record: Any) -> None:
        """What the replay itself keeps of a line: steps seen, and checkpoint saves."""
        if record is not None:
            s = self.summary
            s.first_step = record.step if s.first_step is None else s.first_step
            s.last_step = record.step
            self._assume_checkpoints(record.step)
        done = self.saves.feed(line, at, record)
        if done is not None:
            self._saved(*done)

    def _assume_checkpoints(self, step: int) -> None:
        """With ``checkpoint_every``: the multiples of it passed since the last step (the newest
        ``ASSUMED_PER_STEP`` of them: a jump of a million steps assumes no million checkpoints)."""
        every = self.s.checkpoint_every
        if every is None:
            return
        newest = step // every * every
        oldest = max(every, (self.assumed_to // every + 1) * every, newest - (ASSUMED_PER_STEP - 1) * every)
        self.pending_ckpts += range(oldest, newest + 1, every)
        self.assumed_to = max(self.assumed_to, step)

    def _saved(self, began: float, ended: float, step: int | None) -> None:
        self.summary.saves += 1
        timed = self.line_clock.judges_hangs
        took = f": {ended - began:.1f} s from its first line to its end" if timed else ""
        evidence = {"began": began, "ended": ended, "seconds": round(ended - began, 3) if timed else None}
        self._add(ended, "save", f"checkpoint saved at step {step}{took}", step, evidence)
        if step is not None:
            self.pending_ckpts.append(step)

    def _poll_after(self, at: float) -> float:
        """The first poll at or after ``at`` (polls every ``poll_s`` from the attempt's start)."""
        return self.origin + math.ceil(max(0.0, at - self.origin) / self.s.poll_s) * self.s.poll_s

    def _silence(self, until: float) -> None:
        """Polls where the watch's deadlines fall before the poll at ``until``: a hang, if any."""
        for _ in range(3):  # a deadline, and a poll just after it; never loops on rounding
            deadline = self.progress.next_deadline(self.clock.t)
            if deadline is None:
                return
            at = max(self._poll_after(deadline), self.clock.t + self.s.poll_s)
            if at >= until or self._tick([], at):
                return

    def _tick(self, lines: list[str], at: float) -> bool:
        """One poll of the daemon at ``at`` that reads ``lines``; whether it called the attempt hung."""
        self.clock.t = self.summary.ended_at = at
        self.source.lines = lines
        snap = ClusterSnapshot(at, {self.job.job_id: self.job})
        hangs = self.progress.update([self.run], snap, at)
        hung = self.s.run in hangs and self.line_clock.judges_hangs and self._hang(hangs[self.s.run], at)
        for record in spike_records(self.progress.take_notices(), [self.run], self.store, self.clock):
            if isinstance(record, RollbackRecord):
                if self.summary.stopped is None:  # after a stop the daemon would have decided nothing more
                    self.store.record_rollback(record)
            elif isinstance(record, Event):
                self._event(record)
        self._pace(at)
        self._register_checkpoints(at)
        return hung

    def _hang(self, evidence: dict[str, Any], at: float) -> bool:
        """A hang verdict, once per silence (the watch repeats it on every poll)."""
        step = evidence.get("last_step")
        if step in self.hung_after:
            return False
        self.hung_after.add(step)
        message = f"hang: {evidence['reason']}; the supervisor would stop the job and restart the run"
        self._add(at, "hang", message, step, evidence)
        return True

    def _event(self, e: Event) -> None:
        ev = e.evidence
        step = ev.get("decided_step", ev.get("onset_step"))
        self._add(e.at, e.kind.value, e.message, step, ev)

    def _pace(self, at: float) -> None:
        for f in self.progress.take_findings():
            message = f"{f.node}: {f.reason}; kept out from the next restart (degraded)"
            self._add(at, "straggler", message, f.evidence.get("step"), {"node": f.node, **f.evidence})
        for _run, _key, slow in self.progress.take_slowdowns():
            blame = slow.get("stragglers") or {}
            linked = f"; explained by straggler {', '.join(sorted(blame))}" if blame else "; no straggler named"
            self._add(at, "slowdown", f"slowdown: {slow['reason']}{linked}", slow.get("step"), slow)
        for e in imbalance_events([self.run], self.progress.take_imbalances(), at):
            self._add(at, "imbalance", e.message, e.evidence.get("steps"), e.evidence)

    def _register_checkpoints(self, at: float) -> None:
        """Saves read up to this poll become verified checkpoints, as the checkpoint watch would
        find them after the poll (rollbacks decided in it did not know them yet)."""
        for step in dict.fromkeys(self.pending_ckpts):
            location = f"log://step-{step}"
            if self.store.checkpoint_state(self.s.run, location) is not None:
                continue
            ref = CheckpointRef(location, f"step-{step}", step, Guarantee.MANIFEST, seen_at=at)
            self.store.checkpoint_seen(self.s.run, ref, at)
            why = "the log reports it saved (analyze takes the log's word)"
            self.store.checkpoint_result(
                self.s.run, VerifyResult(location, step, Level.METADATA, Outcome.VERIFIED, why, at=at)
            )
        self.pending_ckpts = []

    def _finish(self) -> None:
        """The attempt's log ended: what the watch learned, then the job ends (the watch closes)."""
        s, key = self.summary, (self.job.job_id, 0)
        s.format, s.records = self.shown_format or self.line_clock.parser.format, self.line_clock.records
        s.step_time_s = self.progress.step_time(*key)
        s.save_median_s = self.progress.save_s(*key) if self.line_clock.judges_hangs else None
        pace = self.progress.hang_pace(*key)
        if pace is not None:
            detector = HangDetector(self.s.hang)
            detector.learn(pace)
            s.hang_interval_s = detector.interval_s
            s.hang_threshold_s = detector.threshold_s()[0] if s.hang_interval_s is not None else None
        self.progress.update([self.run], ClusterSnapshot(s.ended_at), s.ended_at)
        for why in {self.progress.load_failure(*key), self.progress.failed_before_load(*key)} - {None}:
            self._add(s.ended_at, "load_failed", f"checkpoint load: {why}", s.last_step, {"why": why})
        self.end = s.ended_at
        self.report.attempts.append(s)

    # ------------------------------------------------------------------ entries, bounded

    def _add(self, at: float, kind: str, message: str, step: Any, evidence: Mapping[str, Any]) -> None:
        s, report = self.summary, self.report
        after = s.stopped is not None
        if not after and kind in _STOPS:
            s.stopped, s.stopped_at = _STOPS[kind], at
        report.counts[kind] = report.counts.get(kind, 0) + 1
        if report.counts[kind] > self.s.limit:
            report.omitted[kind] = report.omitted.get(kind, 0) + 1
            return
        step = step if isinstance(step, int) and not isinstance(step, bool) else None
        report.entries.append(Entry(at, s.index, kind, message, step, after, dict(evidence)))


def _head(lines: Iterator[str]) -> list[str]:
    """The first lines of a log, bounded in count and characters: where its clock is chosen."""
    head: list[str] = []
    chars = 0
    for line in lines:
        head.append(line)
        chars += len(line)
        if len(head) >= HEAD_LINES or chars >= HEAD_CHARS:
            break
    return head


def trainer_state_lines(text: str) -> list[str]:
    """The training records of a Hugging Face ``trainer_state.json`` as lines of our JSONL protocol
    (``ssv-jsonl``), for a replay; ``[]`` when the text is not one. Entries without a step are left
    out (the watch needs steps)."""
    out = []
    for r in parse_trainer_state(text):
        if r.step is None:
            continue
        fields = {"ssv": 1, "step": r.step, "loss": r.loss, "grad_norm": r.grad_norm, "lr": r.lr, "epoch": r.epoch}
        out.append(json.dumps({k: v for k, v in fields.items() if v is not None}))
    return out
