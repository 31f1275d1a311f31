"""The synthetic trainer: what a Megatron-style job does and writes, on virtual time.

Each attempt (one incarnation of the run's job) starts up (``startup_s``: launch, NCCL init),
restores its checkpoint (``restore_s``), then trains: steps of ``step_s`` with noise (slower on a
slow node), a loss curve with occasional spikes, and a Megatron iteration line every
``log_every`` steps. Every ``checkpoint_steps`` steps it saves (``save_s``, blocking) into the
``SimCheckpointStore``. An attempt ends when its job ends, or hangs (no more lines).

Two scripted troubles, off by default, make attempts exit non-zero by themselves (the ``World``
ends the job at ``Attempt.exit_at``): ``doomed_from_s`` — every attempt starting from then on dies
``doomed_after_s`` after it starts, its log ending with ``doomed_line`` (a cause unrelated to
checkpoints: a missing module, a broken mount); ``unloadable_steps`` — an attempt resuming from one
of these saves logs Megatron's ``loading checkpoint from ... at iteration N`` and then a load error
(``unloadable_line``), and exits ``unloadable_after_s`` after it starts.

Lines are generated lazily (possibly ahead of the clock, so the simulator can see when the next
line matters) and handed to the engine only once their virtual time has come, through an
in-memory ``LogSource`` given to the real ``ProgressWatch`` by the ``LogOpener`` port. Ground truth
is kept too: the steps each attempt reached, the checkpoint it resumed from, the time it began
computing — the figures ETTR is computed from.
"""

from __future__ import annotations

import json
import math
import random
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field

from supervisor.sim.clock import VirtualClock
from supervisor.sim.training.checkpoints import SimCheckpointStore, SimSave
from supervisor.sim.training.peer_copies import PeerMemory

ENV_RESUME_STEP = "SSV_RESUME_STEP"


@dataclass(frozen=True)
class TrainerSettings:
    step_s: float = 6.0  # Llama 3 405B on 16K H100s: ~16M tokens per step at ~400 TFLOP/s per GPU
    step_noise: float = 0.02  # relative standard deviation of one log interval's duration
    log_every: int = 10  # steps per iteration line (Megatron's --log-interval)
    checkpoint_steps: int = 150  # steps between saves
    save_s: float = 5.0  # blocking part of one save (asynchronous saves stall only to stage to host memory)
    restore_s: float = 60.0  # loading the checkpoint at start
    startup_s: float = 60.0  # launch, NCCL init, data loader, before the restore
    crash_at_start_s: float = 30.0  # a job started on a node with a broken GPU dies this soon
    total_steps: int = 100_000_000
    global_batch: int = 2048
    spike_per_line: float = 0.001
    # Sustained divergences (loss ×4 for ``diverge_lines`` log lines) starting at these steps, each
    # once per simulation: the run that rolls back past one and skips its data does not meet it
    # again. None by default (the planning runs have none).
    diverge_at: tuple[int, ...] = ()
    diverge_lines: int = 30
    # Every attempt starting at or after ``doomed_from_s`` (seconds after the simulation's start)
    # writes ``doomed_line`` and exits non-zero ``doomed_after_s`` after it starts, whatever it
    # resumes from: a failure unrelated to checkpoints. None: off.
    doomed_from_s: float | None = None
    doomed_after_s: float = 20.0
    doomed_line: str = "ModuleNotFoundError: No module named 'apex'"
    # Saves at these steps fail to load: an attempt resuming from one writes Megatron's
    # "loading checkpoint from ... at iteration N", then ``unloadable_line``, and exits non-zero
    # ``unloadable_after_s`` after it starts.
    unloadable_steps: tuple[int, ...] = ()
    unloadable_after_s: float = 30.0
    unloadable_line: str = "RuntimeError: Error(s) in loading state_dict for GPTModel:"
    # Save on failure (just-in-time checkpointing, ``survivors.py``): when one node's ranks die, the
    # surviving replicas save the step in progress, taking this long, then exit. None: they do not.
    survivor_save_s: float | None = None
    # In-memory peer copies of a sharded state (``peer_copies.py``): every this many steps (a
    # multiple of ``log_every``; None: off), a snapshot stalling the step ``peer_copy_s``, complete
    # ``peer_exchange_s`` later; a relaunch in the job restores from them in ``peer_restore_s``.
    peer_copies_steps: int | None = None
    peer_copy_s: float = 0.1
    peer_exchange_s: float = 5.0
    peer_restore_s: float = 10.0

    def __post_init__(self) -> None:
        for name in (
            "step_s",
            "save_s",
            "restore_s",
            "startup_s",
            "crash_at_start_s",
            "doomed_after_s",
            "unloadable_after_s",
            "doomed_from_s",  # these two may be None (off)
            "survivor_save_s",
            "peer_copy_s",
            "peer_exchange_s",
            "peer_restore_s",
        ):
            value = getattr(self, name)
            if value is not None and (not (math.isfinite(value) and value >= 0) or (name == "step_s" and value <= 0)):
                raise ValueError(f"trainer {name} must be a non-negative number of seconds (got {value!r})")
        if self.log_every < 1 or self.checkpoint_steps < self.log_every:
            raise ValueError(f"need 1 <= log_every ({self.log_every}) <= checkpoint_steps ({self.checkpoint_steps})")
        every = self.peer_copies_steps
        if every is not None and (every < self.log_every or every % self.log_every):
            raise ValueError(f"peer_copies_steps ({every}) must be a multiple of log_every ({self.log_every})")

    @property
    def line_s(self) -> float:
        return self.log_every * self.step_s


@dataclass
class Attempt:
    """One incarnation's ground truth and its generated-but-unread log lines."""

    key: tuple[int, ...]  # (job id, restart count[, step generation in in-allocation mode])
    path: str
    nodes: tuple[str, ...]
    started_at: float
    resume_step: int
    resume_torn: bool
    computing_at: float
    rng: random.Random
    step: int = 0  # the last step generated
    cursor: float = 0.0  # virtual time up to which lines are generated
    next_save: int = 0
    slow: float = 1.0
    frozen_at: float | None = None
    ended_at: float | None = None
    lines: deque[tuple[float, int, str]] = field(default_factory=deque)  # (time, step, text), unread
    line_times: list[float] = field(default_factory=list)  # of the first lines, for the simulator
    last_line: tuple[float, int] | None = None  # the newest generated line (time, step)
    last_read: tuple[float, int] | None = None  # the newest line handed to the engine
    pending_dur: float | None = None  # the drawn duration of the log interval in progress
    # The newest log intervals drawn, (start, step at start, duration): the step at any moment (survivors.py).
    intervals: deque[tuple[float, int, float]] = field(default_factory=lambda: deque(maxlen=64))
    exit_at: float | None = None  # its processes exit non-zero by themselves then (doomed, unloadable)
    # (time, text): lines other than steps, not yet generated
    notes: deque[tuple[float, str]] = field(default_factory=deque)

    @property
    def active(self) -> bool:
        return self.ended_at is None

    @property
    def stopped_at(self) -> float | None:
        """When it stopped computing: frozen, exited by itself or ended, whichever came first."""
        times = [t for t in (self.frozen_at, self.exit_at, self.ended_at) if t is not None]
        return min(times) if times else None


class SimTrainer:
    """The run's training program: one ``Attempt`` per incarnation of its job."""

    LEARN_LINES = 8  # skip_samples + min_samples + 1 of HangSettings: the first lines of each attempt are read on the daemon's real poll grid

    def __init__(
        self,
        settings: TrainerSettings,
        clock: VirtualClock,
        store: SimCheckpointStore,
        seed: int = 0,
        *,
        resume_uncommitted: bool = False,
        resume_files: Mapping[str, str] | None = None,
    ) -> None:
        self.settings = settings
        self.clock = clock
        self.store = store
        self.seed = seed
        self.resume_uncommitted = resume_uncommitted  # the baseline: the last save, whatever its state
        self.resume_files = resume_files if resume_files is not None else {}  # a pre-queued job's checkpoint
        self.attempts: list[Attempt] = []
        self._by_path: dict[str, Attempt] = {}
        self._diverging: dict[int, int] = {}  # divergence onset step -> the attempt (id) living it
        self.origin = clock.now()  # the simulation's start: ``doomed_from_s`` counts from it
        self.peers = PeerMemory(settings.peer_copy_s, settings.peer_exchange_s)

    # -- attempts -------------------------------------------------------------------------------

    def start(
        self,
        key: tuple[int, ...],
        path: str,
        nodes: tuple[str, ...],
        env: dict[str, str],
        slow: float = 1.0,
        startup_s: float | None = None,
    ) -> Attempt:
        """``startup_s``: before the restore (default the settings' job start-up; a step relaunched
        inside the job pays less)."""
        now = self.clock.now()
        save = self._resume_point(env)
        s = self.settings
        startup = s.startup_s if startup_s is None else startup_s
        offered = save.step if save else 0
        memory = self.peers.resume_point(key[0], env, offered, now) if s.peer_copies_steps else None
        restore_s = s.peer_restore_s if memory else s.restore_s if save else 0.0
        a = Attempt(
            key,
            path,
            nodes,
            now,
            memory or offered,
            memory is None and save is not None and not save.committed(now),
            now + startup + restore_s,
            random.Random(f"trainer:{self.seed}:{len(self.attempts)}"),
            slow=slow,
        )
        if memory:  # the relaunched step restored the newer generation from its peers' memory
            a.notes.append((a.computing_at, self.peers.restored_line(key[0], memory, offered, restore_s)))
        a.step = a.resume_step
        a.cursor = a.computing_at
        a.next_save = (a.step // s.checkpoint_steps + 1) * s.checkpoint_steps
        if a.resume_torn:
            a.frozen_at = a.computing_at  # the load fails: nothing is trained
        self._script_exit(a)
        self.attempts.append(a)
        self._by_path[path] = a
        return a

    def _script_exit(self, a: Attempt) -> None:
        """A doomed attempt, or one resuming from an unloadable save: its last lines and exit time."""
        s = self.settings
        if s.doomed_from_s is not None and a.started_at >= self.origin + s.doomed_from_s:
            a.exit_at = a.started_at + s.doomed_after_s
            a.notes.extend(
                [(max(a.started_at, a.exit_at - 1.0), "Traceback (most recent call last):"), (a.exit_at, s.doomed_line)]
            )
        elif a.resume_step in s.unloadable_steps and self.store.get(a.resume_step) is not None:
            a.exit_at = a.started_at + s.unloadable_after_s
            a.computing_at = a.cursor = max(a.computing_at, a.exit_at)  # the load fails: nothing is trained
            began = a.started_at + min(s.startup_s, s.unloadable_after_s / 2)
            where = self.store.location(a.resume_step)
            a.notes.extend(
                [
                    (began, f" loading checkpoint from {where} at iteration {a.resume_step}"),
                    (max(began, a.exit_at - 1.0), "Traceback (most recent call last):"),
                    (a.exit_at, s.unloadable_line),
                ]
            )

    def _resume_point(self, env: dict[str, str]) -> SimSave | None:
        """The supervisor's choice (``SSV_RESUME_STEP``) when it gave one, else the trainer's own:
        the newest committed save (the baseline: the newest save, whatever its state)."""
        text = env.get(ENV_RESUME_STEP)
        if env.get("SSV_RESUME_FROM_FILE") == "1":  # a pre-queued job: the file as of its start
            text = _step_in_file(self.resume_files.get(env.get("SSV_RESUME_FILE", "")))
        if text is not None and text.strip().isdigit():
            return self.store.get(int(text))
        return self.store.newest(committed_only=not self.resume_uncommitted)

    def current(self) -> Attempt | None:
        a = self.attempts[-1] if self.attempts else None
        return a if a is not None and a.active else None

    def end(self, a: Attempt, at: float) -> None:
        """The attempt's processes are gone at ``at``: drop what it would have done later."""
        if not a.active:
            return
        self._generate(a, at)
        a.ended_at = at
        self._truncate(a, at)
        self.store.attempt_ended(at)
        if a.resume_torn:
            torn = self.store.get(a.resume_step)
            if torn is not None:
                torn.bad = True  # the next restart falls back to the save before it

    def freeze(self, a: Attempt, at: float) -> None:
        """The attempt hangs at ``at``: processes stay, no step completes any more."""
        if not a.active or (a.frozen_at is not None and a.frozen_at <= at):
            return
        self._generate(a, at)
        a.frozen_at = at
        self._truncate(a, at)
        self.store.attempt_ended(at)

    def end_on_purpose(self, a: Attempt, at: float, deadline: float) -> float | None:
        """A signal at ``at`` (a time limit's, a preemption's grace): the trainer saves at its next
        log-line boundary (the periodic save there, if one is due, is that save) and exits once the
        save is committed; that moment, or None when it cannot commit by ``deadline`` (it is killed
        then, with the work since its last save). Signalled before it computes, it exits at once:
        it has trained nothing since the checkpoint it resumed from."""
        if not a.active or a.frozen_at is not None or (a.exit_at is not None and a.exit_at <= at):
            return None
        if at < a.computing_at:
            done = at
        else:
            boundary, step = self._boundary(a, at)
            save = self.store.get(step)
            if save is not None and save.started_at == boundary:  # the periodic save of that line
                done = save.committed_at if save.committed_at is not None else boundary + self.settings.save_s
            else:
                done = boundary + self.settings.save_s
                if done <= deadline:
                    self.store.begin_save(step, boundary, done)
            if done <= deadline:
                self._truncate(a, boundary)  # lines generated ahead of it were never written
                a.step = step
        if done > deadline:
            return None
        a.exit_at = done
        return done

    def _boundary(self, a: Attempt, at: float) -> tuple[float, int]:
        """The first log line at or after ``at`` (written now if it was not yet), or the last one
        before it when its save is still being written: (its time, its step)."""
        self._generate(a, at)
        for start, step, duration in a.intervals:
            if start + duration >= at:
                self._generate(a, start + duration)
                return start + duration, step + self.settings.log_every
        start, step, duration = a.intervals[-1]  # at lies in the save after the newest line
        return start + duration, step + self.settings.log_every

    def set_slow(self, a: Attempt, factor: float) -> None:
        self._generate(a, self.clock.now())
        a.slow = factor

    # -- what the simulator needs to know -------------------------------------------------------

    def reached(self, a: Attempt, at: float | None = None) -> int:
        """The last step the attempt completed (and logged) by ``at`` (default: now)."""
        at = self.clock.now() if at is None else at
        self._generate(a, at)
        step = a.last_read[1] if a.last_read is not None and a.last_read[0] <= at else a.resume_step
        for t, s_, _ in a.lines:
            if t > at:
                break
            step = s_
        return step

    def learning_times(self, a: Attempt) -> list[float]:
        """Times of the attempt's first lines: the hang detector learns the pace from them."""
        stop = a.stopped_at
        while len(a.line_times) < self.LEARN_LINES and a.active and (stop is None or a.cursor < stop):
            before = len(a.line_times)
            self._generate(a, a.cursor + 2 * self.settings.line_s * a.slow + self.settings.save_s + 1.0)
            if len(a.line_times) == before:
                break
        return list(a.line_times)

    def lookahead_s(self, a: Attempt) -> float:
        """A span that surely holds the attempt's last line before any moment (when it computes)."""
        s = self.settings
        return 3.0 * s.line_s * a.slow + s.save_s + s.startup_s + s.restore_s

    def writes_by(self, a: Attempt, at: float) -> bool:
        """Will the engine find an unread line by ``at``? (Then no hang deadline can run out first.)"""
        self._generate(a, at)
        return bool(a.lines) and a.lines[0][0] <= at

    def last_line_before(self, a: Attempt, at: float) -> float | None:
        self._generate(a, at)
        best = None
        for t, _, _ in a.lines:
            if t > at:
                break
            best = t
        return best

    # -- the log, as the engine reads it ---------------------------------------------------------

    def read(self, path: str) -> list[str]:
        a = self._by_path.get(path)
        if a is None:
            return []
        now = self.clock.now()
        self._generate(a, now)
        out: list[str] = []
        while a.lines and a.lines[0][0] <= now:
            t, step, text = a.lines.popleft()
            a.last_read = (t, step)
            out.append(text)
        return out

    def opener(self, path: str, at_end: bool) -> InMemoryLog:
        """The ``LogOpener`` port: follow the attempt that writes ``path``."""
        return InMemoryLog(self, path)

    # -- generation -----------------------------------------------------------------------------

    def _generate(self, a: Attempt, until: float) -> None:
        s = self.settings
        stop = a.stopped_at
        limit = until if stop is None else min(until, stop)
        while a.cursor < limit and a.step < s.total_steps:
            if a.pending_dur is None:
                a.pending_dur = s.line_s * a.slow * max(0.5, 1.0 + a.rng.gauss(0.0, s.step_noise))
                a.intervals.append((a.cursor, a.step, a.pending_dur))
            t = a.cursor + a.pending_dur
            if t > limit:
                break
            self._notes_until(a, t, before=True)
            a.step += s.log_every
            a.cursor = t
            a.lines.append((t, a.step, self._line(a, a.pending_dur)))
            a.pending_dur = None
            a.last_line = (t, a.step)
            if len(a.line_times) < self.LEARN_LINES:
                a.line_times.append(t)
            if s.peer_copies_steps and a.step % s.peer_copies_steps == 0:
                done, line = self.peers.boundary(a.key[0], t, a.step)
                a.lines.append((done, a.step, line))  # before the next step's line: the exchange is short
                a.cursor += s.peer_copy_s
            if a.step >= a.next_save:
                self.store.begin_save(a.step, a.cursor, a.cursor + s.save_s)
                a.cursor += s.save_s
                a.next_save += s.checkpoint_steps
        self._notes_until(a, limit)

    @staticmethod
    def _notes_until(a: Attempt, at: float, before: bool = False) -> None:
        """The attempt's other lines written by ``at`` (``before``: earlier than ``at``) join its log,
        in time order with the steps."""
        while a.notes and (a.notes[0][0] < at or (not before and a.notes[0][0] == at)):
            t, text = a.notes.popleft()
            a.lines.append((t, a.step, text))

    def _truncate(self, a: Attempt, at: float) -> None:
        self.peers.truncate(a.key[0], at)
        while a.lines and a.lines[-1][0] > at:
            a.lines.pop()
        while a.notes and a.notes[-1][0] > at:
            a.notes.pop()
        a.line_times = [t for t in a.line_times if t <= at]
        if a.last_line is not None and a.last_line[0] > at:
            a.last_line = (a.lines[-1][0], a.lines[-1][1]) if a.lines else a.last_read
        a.cursor = min(a.cursor, at)

    def _diverges(self, a: Attempt, step: int) -> bool:
        """The step lies in a divergence that this attempt is the first to meet (or is living)."""
        span = self.settings.diverge_lines * self.settings.log_every
        for onset in self.settings.diverge_at:
            if onset <= step < onset + span and self._diverging.setdefault(onset, id(a)) == id(a):
                return True
        return False

    def _line(self, a: Attempt, elapsed_s: float) -> str:
        s = self.settings
        step = a.step
        loss = 1.6 + 9.0 * (1.0 + step / 2000.0) ** -0.35
        if a.rng.random() < s.spike_per_line:
            loss *= 1.5 + a.rng.random()
        if self._diverges(a, step):
            loss *= 4.0
        ms = 1000.0 * elapsed_s / s.log_every
        lr = 8e-5 * min(1.0, (step + 1) / 8000.0)
        return (
            f" iteration {step:>8d}/{s.total_steps:>10d} | consumed samples: {step * s.global_batch:>12d} |"
            f" elapsed time per iteration (ms): {ms:.1f} | learning rate: {lr:.3E} |"
            f" global batch size: {s.global_batch:>5d} | lm loss: {loss:.6E} | loss scale: 1.0 |"
            f" grad norm: {0.8 + 0.4 * a.rng.random():.3f} | number of skipped iterations:   0 |"
            " number of nan iterations:   0 |"
        )


def _step_in_file(text: str | None) -> str | None:
    """The checkpoint step a resume file names (None: no file, or no checkpoint in it)."""
    if text is None:
        return None
    step = (json.loads(text).get("checkpoint") or {}).get("step")
    return str(step) if isinstance(step, int) else None


class InMemoryLog:
    """A ``LogSource`` over the trainer's generated lines (no files: 54 days stay cheap)."""

    def __init__(self, trainer: SimTrainer, path: str) -> None:
        self.trainer = trainer
        self.path = path
        self.closed = False

    def read_lines(self) -> list[str]:
        return [] if self.closed else self.trainer.read(self.path)

    def close(self) -> None:
        self.closed = True
