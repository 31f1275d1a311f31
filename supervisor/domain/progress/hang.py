"""Hang detection from progress records: no new step for longer than the run's own pace allows.

Pure: times are passed in (seconds on any one clock), nothing is read or logged here.

A ``HangDetector`` follows one run. It is fed ``observe(step, at)`` for every progress record
(the step the record reports, and the time it was read) and asked ``check(now)``:

- It learns the pace robustly. Observations are grouped by read time (a poll hands out several
  lines at once, all read at the same time); between two reads it takes a sample
  ``(seconds, steps advanced)``. The per-step time is the median of ``seconds / steps`` over the last
  ``window`` samples, the logging stride the median of the step advances between distinct logged
  steps. Their product is the *interval*: the time one expects between two new logged steps. So a
  backlog read in one go, a checkpoint pause or a slow first step moves the medians little.
- The first ``skip_samples`` samples after a (re)start are ignored: they include start-up (data
  loader warm-up, compilation, autotuning).
- With at least ``min_samples`` samples the *threshold* is
  ``clamp(multiple × interval, floor_s, cap_s)``; before that it is ``startup_grace_s``.
- ``check(now)`` returns a ``HangVerdict`` when the time since the last new step (or, before any
  step, since the attempt's start) exceeds the threshold; ``None`` otherwise. It says so on every
  check while the run stays hung: acting once is the caller's business.

A step lower than the last one means the trainer restarted from a checkpoint within the job: the
pace learned so far is kept (same job, same nodes) but start-up is skipped again. ``reset(at)``
starts a new attempt: everything learned is forgotten (the next attempt may run on other nodes).
``relaunched(at)``: the step was launched again within the same job (in-allocation mode); the
start-up grace applies from ``at`` until its first step, the pace is kept.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass
from statistics import median
from typing import Any

RELAUNCH_SETTLE_S = 30.0  # after a relaunch in the job, the old generation's lines stop within this


@dataclass(frozen=True)
class HangSettings:
    """How patient the detector is. ``multiple × interval`` is clamped to ``[floor_s, cap_s]``."""

    multiple: float = 5.0
    floor_s: float = 120.0
    cap_s: float = 1800.0
    startup_grace_s: float = 1800.0  # before ``min_samples`` samples are known
    window: int = 64  # samples the medians are taken over
    skip_samples: int = 2  # samples ignored after a (re)start
    min_samples: int = 5  # samples needed before the learned threshold applies
    pause_cap_s: float = 3600.0  # while the log says a checkpoint save or an evaluation runs

    def __post_init__(self) -> None:
        problems = []
        for name in ("multiple", "floor_s", "cap_s", "startup_grace_s", "pause_cap_s"):
            value = getattr(self, name)
            if not (isinstance(value, (int, float)) and math.isfinite(value) and value > 0):
                problems.append(f"{name} must be a positive number of seconds (got {value!r})")
        if not problems and self.floor_s > self.cap_s:
            problems.append(f"floor_s ({self.floor_s}) must not exceed cap_s ({self.cap_s})")
        if self.window < 1 or self.min_samples < 1 or self.min_samples > self.window:
            problems.append(f"need 1 <= min_samples ({self.min_samples}) <= window ({self.window})")
        if self.skip_samples < 0:
            problems.append(f"skip_samples must be 0 or more (got {self.skip_samples})")
        if problems:
            raise ValueError("HangSettings: " + "; ".join(problems))


@dataclass(frozen=True)
class HangPace:
    """What a detector has learned of an attempt's pace: its samples (seconds, steps between two
    reads that brought new steps) and the strides between logged steps. Kept in the store, so a
    restarted daemon judges the attempt on the pace it already knows, not the start-up grace."""

    samples: tuple[tuple[float, int], ...] = ()
    strides: tuple[int, ...] = ()

    def to_json(self) -> dict[str, list[list[float]] | list[int]]:
        return {"samples": [[seconds, steps] for seconds, steps in self.samples], "strides": list(self.strides)}

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> HangPace:
        samples = tuple((float(x[0]), int(x[1])) for x in d.get("samples") or ())
        return cls(samples, tuple(int(x) for x in d.get("strides") or ()))


@dataclass(frozen=True)
class HangVerdict:
    """The run made no progress for too long, with the numbers that say so."""

    reason: str  # one sentence for the logbook
    last_step: int | None  # None: no step seen in this attempt
    since_s: float  # seconds without a new step (or since the attempt started)
    interval_s: float | None  # the learned time between logged steps; None while still learning
    threshold_s: float  # the limit since_s exceeded
    learned: bool  # threshold from the learned interval (True) or the start-up grace (False)


class HangDetector:
    """Follows one run's steps; see the module docstring."""

    def __init__(self, settings: HangSettings | None = None, *, started_at: float | None = None) -> None:
        self.settings = settings or HangSettings()
        self._samples: deque[tuple[float, int]] = deque(maxlen=self.settings.window)
        self._strides: deque[int] = deque(maxlen=self.settings.window)
        self._started_at: float | None = None
        self._last_step: int | None = None
        self._last_progress_at: float | None = None  # when the last new step was read
        self._base_at: float | None = None  # the read a pending sample starts from ...
        self._base_step = 0  # ... and the last step it brought
        self._read_at = -math.inf  # the latest read, and the last step it brought
        self._read_step = 0
        self._to_skip = 0  # samples still to ignore after a (re)start
        self._pause: str | None = None  # a save or an evaluation the log announced, until the next step
        self._relaunch_grace = False  # relaunched within the job: start-up grace until its first step
        self._relaunch_floor: int | None = None  # the last step seen before the relaunch
        self.reset(started_at)

    # ------------------------------------------------------------------------ feeding

    def reset(self, at: float | None) -> None:
        """A new attempt started at ``at`` (``None``: unknown; judged from the first step)."""
        self._samples.clear()
        self._strides.clear()
        self._started_at = at if at is not None and math.isfinite(at) else None
        self._relaunch_grace = False
        self._restart()

    def relaunched(self, at: float) -> None:
        """The step was launched again within the job at ``at`` (in-allocation: a swap, a relaunch
        in place): it loads its checkpoint before its first step, so the start-up grace applies
        until then, from ``at``; the pace learned is kept (the same run, the same work)."""
        # Steps past the last one seen, read within RELAUNCH_SETTLE_S, are the old generation's
        # last lines (it is stopped at the launcher's next poll, SIGKILL 10 s later); the new one
        # resumes from a checkpoint — at or below the last step seen, unless the log lagged.
        self._relaunch_floor = self._last_step
        self._restart()
        if math.isfinite(at):
            self._started_at = at
        self._relaunch_grace = True

    def observe(self, step: int | None, at: float) -> None:
        """A progress record reporting ``step`` was read at ``at``. Records without a step, repeats
        of the last step (several ranks print it) and non-finite times change nothing."""
        if step is None or not math.isfinite(at):
            return
        if self._old_generation(step, at):
            return
        if self._last_step is not None and step < self._last_step:
            self._restart()
            self._started_at = at
        last_step, last_at = self._last_step, self._last_progress_at
        if last_step is not None and step == last_step:
            return
        self._pause = None  # a new step: whatever paused the log is over
        self._relaunch_grace = False
        at = at if last_at is None else max(at, last_at)  # a clock step backwards is no pace
        if last_step is not None:
            self._strides.append(step - last_step)
        if self._base_at is None:
            self._base_at, self._base_step = at, step
        elif at > self._read_at:
            # A new read: the previous read's last step closes a sample against the read before.
            self._close_sample()
            self._base_at, self._base_step = self._read_at, self._read_step
        self._read_at, self._read_step = at, step
        self._last_step, self._last_progress_at = step, at

    @property
    def pace(self) -> HangPace:
        return HangPace(tuple(self._samples), tuple(self._strides))

    def learn(self, pace: HangPace) -> None:
        """Start from a pace learned earlier (by a daemon before a restart)."""
        self._samples.extend(pace.samples)
        self._strides.extend(pace.strides)

    def pause(self, what: str) -> None:
        """The log announced a save or an evaluation: the limit is ``pause_cap_s`` until it ends."""
        self._pause = what

    def unpause(self) -> None:
        self._pause = None

    def _old_generation(self, step: int, at: float) -> bool:
        """A line of the generation stopped by a relaunch, written before it was stopped."""
        if not self._relaunch_grace or self._relaunch_floor is None or self._started_at is None:
            return False
        return step > self._relaunch_floor and at < self._started_at + RELAUNCH_SETTLE_S

    # ------------------------------------------------------------------------ judging

    @property
    def last_step(self) -> int | None:
        return self._last_step

    @property
    def interval_s(self) -> float | None:
        """The learned time between two new logged steps; ``None`` while still learning."""
        samples = list(self._samples)
        if len(samples) < self.settings.min_samples or not self._strides:
            return None
        per_step = median(seconds / steps for seconds, steps in samples)
        return per_step * median(self._strides)

    def threshold_s(self) -> tuple[float, bool]:
        """The current limit in seconds, and whether it comes from the learned interval."""
        s = self.settings
        interval = self.interval_s
        if interval is None:
            limit, learned = s.startup_grace_s, False
        else:
            limit, learned = min(max(s.multiple * interval, s.floor_s), s.cap_s), True
        if self._pause is not None:
            limit = max(limit, s.pause_cap_s)
        if self._relaunch_grace:
            limit = max(limit, s.startup_grace_s)
        return limit, learned

    def check(self, now: float) -> HangVerdict | None:
        """A verdict when no new step came for longer than the threshold; else ``None``."""
        reference = self._last_progress_at if self._last_progress_at is not None else self._started_at
        if reference is None or not math.isfinite(now):
            return None
        since = now - reference
        threshold, learned = self.threshold_s()
        if since <= threshold:
            return None
        interval = self.interval_s
        return HangVerdict(
            reason=self._wording(since, threshold, interval),
            last_step=self._last_step,
            since_s=since,
            interval_s=interval,
            threshold_s=threshold,
            learned=learned,
        )

    # ------------------------------------------------------------------------ internals

    def _restart(self) -> None:
        """Forget the current attempt's position; keep the learned pace."""
        self._last_step = None
        self._last_progress_at = None
        self._base_at = None
        self._base_step = 0
        self._read_at = -math.inf
        self._read_step = 0
        self._to_skip = self.settings.skip_samples

    def _close_sample(self) -> None:
        assert self._base_at is not None
        seconds = self._read_at - self._base_at
        steps = self._read_step - self._base_step
        if seconds <= 0 or steps <= 0:
            return
        if self._to_skip > 0:
            self._to_skip -= 1
            return
        self._samples.append((seconds, steps))

    def _wording(self, since: float, threshold: float, interval: float | None) -> str:
        s = self.settings
        if self._last_step is None:
            what = f"no progress step reported {since:.0f} s after the attempt started"
        else:
            what = f"no new step for {since:.0f} s after step {self._last_step}"
        if interval is None:
            why = f"the start-up grace of {threshold:.0f} s (step interval not learned yet)"
        else:
            raw = s.multiple * interval
            bound = (
                ""
                if s.floor_s < raw < s.cap_s
                else (
                    f", raised to the {s.floor_s:.0f} s floor" if raw <= s.floor_s else f", capped at {s.cap_s:.0f} s"
                )
            )
            why = f"the limit of {threshold:.0f} s ({s.multiple:g} x the learned step interval {interval:.1f} s{bound})"
        if self._pause is not None:
            why = f"the {s.pause_cap_s:.0f} s allowed while {self._pause}"
        return f"{what}, longer than {why}"
