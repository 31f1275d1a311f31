"""Following each running attempt's training log: records in, hang verdicts out.

One watch per run, bound to the attempt (job id, restart count) it reads: a new attempt gets a new
parser and a new hang detector. A requeued attempt writing to the same file (``--open-mode=append``)
is followed from the file's end, so the old attempt's steps are not taken for new progress.
"""

from __future__ import annotations

import statistics
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from typing import Any

import structlog

from supervisor.domain.alloc_step import StepGoal
from supervisor.domain.checkpoints.memory import MemoryGeneration, MemoryRestore, memory_event
from supervisor.domain.cluster import ClusterSnapshot, JobInfo, JobState
from supervisor.domain.decide.in_allocation import current_step
from supervisor.domain.health.findings import NodeFinding
from supervisor.domain.pace.peer_groups import Imbalance
from supervisor.domain.progress import ProgressParser, ProgressRecord, parser_for
from supervisor.domain.progress.frameworks.ssv import NAME as SSV_FORMAT
from supervisor.domain.progress.hang import HangDetector, HangPace, HangSettings, HangVerdict
from supervisor.domain.progress.loads import LoadWatch, load_segments
from supervisor.domain.progress.outputs import output_path
from supervisor.domain.progress.pauses import ends_pause, pause_of
from supervisor.domain.progress.ranks import RankProgress, suspects
from supervisor.domain.progress.series import ProgressPoint, point_of
from supervisor.domain.records import AttemptRecord, RunRecord
from supervisor.domain.run import RestartMode, SpikePolicy
from supervisor.domain.spikes.detector import SpikeDetector
from supervisor.domain.spikes.events import Notice, SpikeSettings
from supervisor.engine.watch.pace import Pace
from supervisor.ports import LogOpener, LogSource, ProgressLedger

log = structlog.get_logger("supervisor.progress")


@dataclass
class _Watch:
    key: tuple[int, int]
    path: str
    source: LogSource
    parser: ProgressParser
    detector: HangDetector
    spikes: SpikeDetector | None = None
    pace: Pace | None = None
    seq: int | None = None  # the attempt's seq: the progress series' points carry it (with the run)
    generation: int = 0  # in-allocation: the step's generation followed (each relaunch is a new one)
    run: str = ""
    last_step: int | None = None
    records: int = 0
    problem: str | None = None  # why the file cannot be read now (logged once, not every tick)
    recent: list[str] = field(default_factory=list)
    load: LoadWatch = field(default_factory=LoadWatch)  # what the log said of its checkpoint load
    ranks: RankProgress = field(default_factory=RankProgress)  # each self-reporting rank's last step
    save_started: float | None = None  # when the read that brought a save's start line came
    saves: deque[float] = field(default_factory=lambda: deque(maxlen=32))  # measured save stalls (s)
    # (step, loss, grad_norm, lr) of the last records: the evidence around a spike
    series: deque[tuple[int, float | None, float | None, float | None]] = field(
        default_factory=lambda: deque(maxlen=SERIES_LEN)
    )


SERIES_LEN = 40


@dataclass(frozen=True)
class SpikeNotice:
    """A spike event or outcome on a run's log, with the series around it."""

    run: str
    attempt_key: tuple[int, int]
    notice: Notice
    series: tuple[tuple[int, float | None, float | None, float | None], ...]


def spike_settings(policy: SpikePolicy) -> SpikeSettings:
    return replace(
        SpikeSettings(),
        heal_window_steps=policy.heal_window_steps,
        min_steps_before=policy.min_steps_before,
        skip_batches=policy.skip_batches,
    )


class ProgressWatch:
    def __init__(
        self,
        opener: LogOpener,
        settings: HangSettings,
        log_format: str | None = None,
        ledger: ProgressLedger | None = None,
    ) -> None:
        self.opener = opener
        self.settings = settings
        self.ledger = ledger  # where the points read go (the store): curves and goodput's evidence
        self._points: list[ProgressPoint] = []
        self.log_format = log_format  # a format name (or alias) every log is read as; None: detect per log
        self._watches: dict[str, _Watch] = {}
        self._notices: list[SpikeNotice] = []
        self._last_steps: dict[tuple[int, int], int] = {}  # (job id, restart count) -> newest step logged
        self._step_times: dict[tuple[int, int], float] = {}  # ... -> its latest seconds per step
        self._load_failures: dict[tuple[int, int], str] = {}  # ... -> why its log shows its load failed
        self._before_load: dict[tuple[int, int], str] = {}  # ... -> what it died of before any load
        self._findings: list[NodeFinding] = []  # stragglers named from per-rank step times
        self._slowdowns: list[tuple[str, tuple[int, int], dict[str, Any]]] = []
        self._imbalances: list[tuple[str, tuple[int, int], Imbalance]] = []
        self._memory: dict[tuple[int, int], MemoryGeneration] = {}  # ... -> newest peer copies reported
        self._restores: list[tuple[str, tuple[int, int], MemoryRestore]] = []

    def memory(self, job_id: int, restart_count: int) -> MemoryGeneration | None:
        """The newest generation of peer copies the attempt reported complete (None: none)."""
        return self._memory.get((job_id, restart_count))

    def take_restores(self) -> list[tuple[str, tuple[int, int], MemoryRestore]]:
        """(run, attempt key, restore) of relaunched steps that restored from memory, since the last call."""
        out, self._restores = self._restores, []
        return out

    def last_step(self, job_id: int, restart_count: int) -> int | None:
        """The newest step an attempt logged (None: never followed, or nothing parsed)."""
        return self._last_steps.get((job_id, restart_count))

    def load_failure(self, job_id: int, restart_count: int) -> str | None:
        """Why the attempt's log shows its checkpoint load failed: a load error, or (once it ended)
        a load that began and was followed by neither a step nor a finished load. None: no such
        evidence (or never followed)."""
        return self._load_failures.get((job_id, restart_count))

    def failed_before_load(self, job_id: int, restart_count: int) -> str | None:
        """What the attempt's log shows it died of before any checkpoint load began (once it ended):
        evidence that the checkpoint it was handed is not to blame."""
        return self._before_load.get((job_id, restart_count))

    def save_s(self, job_id: int, restart_count: int) -> float | None:
        """The median time the attempt's checkpoint saves stalled its log (between the reads that
        brought the save's start and end lines: a poll's resolution); None: none measured."""
        watch = next((w for w in self._watches.values() if w.key == (job_id, restart_count)), None)
        return statistics.median(watch.saves) if watch is not None and watch.saves else None

    def hang_pace(self, job_id: int, restart_count: int) -> HangPace | None:
        """What the hang detector learned of the attempt's pace (None: not followed now)."""
        watch = next((w for w in self._watches.values() if w.key == (job_id, restart_count)), None)
        return watch.detector.pace if watch is not None else None

    def step_time(self, job_id: int, restart_count: int) -> float | None:
        """The attempt's latest logged seconds per step (None: its log prints none)."""
        return self._step_times.get((job_id, restart_count))

    def take_findings(self) -> list[NodeFinding]:
        """Straggler findings (degraded) named since the last call."""
        out, self._findings = self._findings, []
        return out

    def take_slowdowns(self) -> list[tuple[str, tuple[int, int], dict[str, Any]]]:
        """(run, attempt key, evidence) of throughput drops first sustained since the last call."""
        out, self._slowdowns = self._slowdowns, []
        return out

    def take_imbalances(self) -> list[tuple[str, tuple[int, int], Imbalance]]:
        """(run, attempt key, imbalance) of nodes found slower together from the start (uneven work,
        not stragglers) since the last call."""
        out, self._imbalances = self._imbalances, []
        return out

    def take_notices(self) -> list[SpikeNotice]:
        """Spike events and outcomes read since the last call."""
        out, self._notices = self._notices, []
        return out

    def update(self, runs: Iterable[RunRecord], snap: ClusterSnapshot, now: float) -> dict[str, dict[str, Any]]:
        """Read new log lines of every running attempt; return hang evidence per run name."""
        hangs: dict[str, dict[str, Any]] = {}
        seen: set[str] = set()
        for run in runs:
            a = run.attempt
            job = snap.jobs.get(a.job_id) if a else None
            if a is None or job is None or job.state is not JobState.RUNNING or a.started_at is None:
                continue
            seen.add(run.name)
            goal, nodes = _step_of(run, a, job)
            watch = self._watch(run, (a.job_id, a.restart_count), a.started_at, nodes, job.stdout)
            if watch is None:
                continue
            if goal is not None and goal.generation != watch.generation:
                _relaunched(watch, run, goal)
            self._read(run.name, watch, now)
            verdict = watch.detector.check(now)
            if verdict is not None:
                hangs[run.name] = self._hang_evidence(watch, verdict)
        for name in set(self._watches) - seen:
            watch = self._watches.pop(name)
            self._read(name, watch, now)  # the lines the attempt wrote before it ended: its last step
            self._close(watch)
        if self.ledger is not None and self._points:
            self.ledger.record_progress(self._points)
        self._points = []
        return hangs

    def _hang_evidence(self, watch: _Watch, verdict: HangVerdict) -> dict[str, Any]:
        """The hang's numbers, and which rank (node) stopped when per-rank progress singles it out."""
        found = suspects(watch.ranks, watch.pace.nodes if watch.pace is not None else ())
        who: dict[str, Any] = {}
        if found is not None:
            who = {
                "suspects": found.summary,
                "ranks_reporting": len(watch.ranks.steps),
                "ranks_behind": list(found.ranks[:64]),
                "suspect_nodes": list(found.nodes),
            }
        return who | {
            "reason": verdict.reason + (f"; {found.summary}" if found is not None else ""),
            "last_step": verdict.last_step,
            "silent_s": round(verdict.since_s, 1),
            "step_interval_s": verdict.interval_s,
            "threshold_s": verdict.threshold_s,
            "step_time_s": self._step_times.get(watch.key),
            "log": watch.path,
            "records_read": watch.records,
            "last_lines": list(watch.recent),
        }

    def next_deadline(self, now: float) -> float | None:
        """The earliest time a followed attempt would be called hung if no new step arrives before
        it (None when nothing is followed). Read-only: for drivers that skip quiet ticks (the
        simulator), so a tick still falls on the first poll after the deadline."""
        probe = now + 1e7  # far past any threshold: check() then reports the silence and the limit
        deadlines = []
        for watch in self._watches.values():
            verdict = watch.detector.check(probe)
            if verdict is not None:
                deadlines.append(probe - verdict.since_s + verdict.threshold_s)
        return min(deadlines) if deadlines else None

    def _watch(
        self, run: RunRecord, key: tuple[int, int], started_at: float, nodes: tuple[str, ...] = (), reported: str = ""
    ) -> _Watch | None:
        """The attempt's watch, on the output file Slurm reports for its job (else the spec's)."""
        current = self._watches.get(run.name)
        if current is not None and current.key == key:
            return current
        path = output_path(run.spec, key[0], reported=reported)
        if path is None:
            return None
        same_file = current is not None and current.path == path
        if current is not None:
            self._close(current)
        watch = _Watch(
            key,
            path,
            self.opener(path, same_file),
            parser_for(self.log_format),
            HangDetector(self.settings, started_at=started_at),
            SpikeDetector(spike_settings(run.spec.spikes)),
            Pace(run.name, tuple(nodes)),
        )
        a = run.attempt
        watch.seq = a.seq if a is not None and (a.job_id, a.restart_count) == key else None
        watch.run = run.name
        if a is not None and a.hang_pace is not None and (a.job_id, a.restart_count) == key:
            watch.detector.learn(a.hang_pace)  # a restarted daemon: the pace it already knew
        self._watches[run.name] = watch
        log.info("progress_following", run=run.name, log=path, attempt_key=list(key))
        return watch

    def _stepped(self, watch: _Watch, record: ProgressRecord, now: float) -> None:
        """A record with a step: the hang detector's pace, the attempt's last step and step time
        (bounded memory: the newest 256 attempts), the series spike notices carry."""
        assert record.step is not None
        watch.detector.observe(record.step, now)
        if record.rank is not None and record.source_format == SSV_FORMAT:
            watch.ranks.observe(record.rank, record.step, now)  # the protocol's rank is global
        if record.step > self._last_steps.get(watch.key, -1):
            _bounded_put(self._last_steps, watch.key, record.step)
        if record.step_time_s and record.step_time_s > 0:
            _bounded_put(self._step_times, watch.key, record.step_time_s)
        watch.series.append((record.step, record.loss, record.grad_norm, record.lr))
        if self.ledger is not None and watch.seq is not None and record.rank is None:
            self._points.append(point_of(watch.run, watch.seq, record, now))

    def _read(self, run: str, watch: _Watch, now: float) -> None:
        lines = _new_lines(run, watch)
        if lines:
            watch.recent = (watch.recent + [ln[:200] for ln in lines])[-3:]
            _note_pauses(watch, lines, now)
            self._note_memory(run, watch, lines)
        for record in self._records(watch, lines):
            watch.records += 1
            if record.step is not None:
                self._stepped(watch, record, now)
            if watch.pace is not None:
                found, slow = watch.pace.feed(record, now)
                self._findings += found
                if slow is not None:
                    self._slowdowns.append((run, watch.key, slow))
                self._imbalances += [(run, watch.key, imb) for imb in watch.pace.take_imbalances()]
            if watch.spikes is not None:
                for notice in watch.spikes.feed(record):
                    self._notices.append(SpikeNotice(run, watch.key, notice, tuple(watch.series)))

    def _note_memory(self, run: str, watch: _Watch, lines: list[str]) -> None:
        for said in map(memory_event, lines):
            if isinstance(said, MemoryRestore):
                self._restores.append((run, watch.key, said))
            elif said is not None and said.step > getattr(self._memory.get(watch.key), "step", 0):
                _bounded_put(self._memory, watch.key, said)

    def _records(self, watch: _Watch, lines: list[str]) -> list[ProgressRecord]:
        """The lines' records, noting what the lines say of the checkpoint load in order with the
        steps (a step after the load began says it finished)."""
        out: list[ProgressRecord] = []
        for mark, segment in load_segments(lines):
            if mark is not None:
                watch.load.mark(mark, segment[0])
                out += watch.parser.feed_all(segment[:1])  # a step on the mark's own line is not one after it
                segment = segment[1:]
            records = watch.parser.feed_all(segment)
            if any(r.step is not None for r in records):
                watch.load.stepped()
            else:
                watch.load.lines(segment)
            out += records
        self._note_load(watch, ended=False)
        return out

    def _close(self, watch: _Watch) -> None:
        """The attempt ended (or was replaced): a load it began and never finished is evidence now."""
        self._note_load(watch, ended=True)
        watch.source.close()

    def _note_load(self, watch: _Watch, *, ended: bool) -> None:
        _keep(self._load_failures, watch.key, watch.load.failure(ended=ended))
        _keep(self._before_load, watch.key, watch.load.before_load() if ended else None)


def _keep(memory: dict[tuple[int, int], str], key: tuple[int, int], why: str | None) -> None:
    if why is not None:
        _bounded_put(memory, key, why)
    else:
        memory.pop(key, None)


def _new_lines(run: str, watch: _Watch) -> list[str]:
    """The lines the attempt's output gained; none when it cannot be read (a refused path: a link,
    a FIFO, a file of the daemon's), which is logged once, not on every tick."""
    try:
        lines = watch.source.read_lines()
    except OSError as exc:
        if str(exc) != watch.problem:
            log.warning("progress_unreadable", run=run, log=watch.path, error=str(exc))
        watch.problem = str(exc)
        return []
    watch.problem = None
    return lines


def _note_pauses(watch: _Watch, lines: list[str], now: float) -> None:
    """A save or an evaluation the log announces stalls it without a hang; a save's stall is
    measured between the reads that brought its start and end lines (its cost, for Young/Daly)."""
    for line in lines:
        if ends_pause(line):
            watch.detector.unpause()
            if watch.save_started is not None and now > watch.save_started:
                watch.saves.append(now - watch.save_started)
            watch.save_started = None
        elif (what := pause_of(line)) is not None:
            watch.detector.pause(what)
            if what == "a checkpoint save" and watch.save_started is None:
                watch.save_started = now


def _bounded_put(memory: dict[tuple[int, int], Any], key: tuple[int, int], value: Any) -> None:
    memory[key] = value
    if len(memory) > 256:
        memory.pop(next(iter(memory)))


def _step_of(run: RunRecord, a: AttemptRecord, job: JobInfo) -> tuple[StepGoal | None, tuple[str, ...]]:
    """The nodes the training's ranks run on: an in-allocation step's (the job holds its hot
    spares too, and other nodes after a swap), else the job's."""
    if run.spec.restart_mode is not RestartMode.IN_ALLOCATION:
        return None, job.nodes
    return current_step(run, a, job.nodes)


def _relaunched(watch: _Watch, run: RunRecord, goal: StepGoal) -> None:
    """A new generation of the step: its ranks are on its nodes, it restores before its first
    step (the hang detector's start-up grace, from its launch), and it trains again from its
    checkpoint's step (a new spike detector, as a new job gets: the old one took those steps for
    duplicated lines and ignored them — a rollback's replay among them)."""
    watch.generation = goal.generation
    watch.pace = Pace(run.name, goal.nodes)
    watch.spikes = SpikeDetector(spike_settings(run.spec.spikes))
    watch.ranks = RankProgress()
    watch.detector.relaunched(goal.decided_at)
