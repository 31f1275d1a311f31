"""A run past the partition's time limit is a chain of jobs: what the simulator assumes of it.

``ChainSettings`` (``SimSettings.chain``) says what the partition and its queue do:

* **the time limit** (``max_job_s``, Slurm's partition ``MaxTime``; ``simulate --max-job-hours``):
  each job is ended TIMEOUT that long after it started. A job submitted with ``--signal=[B:]SIG@N``
  (the supervisor's ``[continuation]``, and the hand-made script's own) is signalled N seconds
  before; the simulated trainer saves at its next log-line boundary and exits (the continue code
  under the supervisor; the hand-made script exits 0 and submits itself again, from the back of
  the queue). A save that cannot be committed before the limit is no save: the job times out and
  the work since the last periodic save is lost.
* **the queue**: every job that enters the queue — a submission or a requeue, in every mode —
  waits ``QueueWait`` before it may start even on free nodes: the time it takes to reach the head
  of the queue. Log-normal, the family that fits the queue delays of batch-scheduled machines
  (Brevik, Nurmi and Wolski, PPoPP 2006: 9 years of scheduler logs of 7 HPC centres; heavy-tailed,
  so a p99 far above the median); its median and spread are the site's, given as settings, and
  the defaults are assumptions, not a measurement. Off (median 0) unless asked for. A pre-queued
  successor (the supervisor's ``prequeue_s``) waits in the queue while its predecessor still runs:
  with ``PriorityFlags=ACCRUE_ALWAYS`` (``accrue_always``) its age counts from its submission, so
  its wait overlaps the running job and it starts ``max(0, wait - prequeue_s)`` after its
  predecessor's end; without it Slurm counts no age while a job is held or waits on a dependency,
  and its wait starts at its release — no better than a submission at the end.
* **preemption** (``preempt_per_day``): a higher-priority job takes the run's nodes at Poisson
  times. Slurm sends SIGTERM ``grace_s`` (``GraceTime``) before it kills the job; the trainer saves
  on it as on the limit's signal. Under the supervisor the partition's ``PreemptMode=CANCEL``
  ends the job PREEMPTED (continued when it saved); the hand-made chain relies on
  ``PreemptMode=REQUEUE``. Either way the next job waits in the queue again.

The figures (``chain_report``): the gaps between a job's planned end and its successor's start,
the planned ends, the time-outs and the preemptions.
"""

from __future__ import annotations

import math
import random
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass

_SIGNAL_ARG = re.compile(r"^--signal=(?:[A-Z]+:)?[A-Z0-9]+@(\d+)$")


@dataclass(frozen=True)
class ChainSettings:
    max_job_s: float | None = None  # the partition's time limit (MaxTime); None: none
    lead_s: int = 600  # the signal before the limit: [continuation] lead_s, and the hand-made --signal
    prequeue_s: int = 3600  # the supervisor's [continuation] prequeue_s (0: submit after the end)
    queue_wait_median_s: float = 0.0  # a job's wait to reach the head of the queue; 0: none
    queue_wait_sigma: float = 1.0  # of the log-normal (1.0: p99 = 10 x the median)
    accrue_always: bool = True  # PriorityFlags=ACCRUE_ALWAYS: a held job's age counts from its submission
    preempt_per_day: float = 0.0  # preemptions of the run's job per day
    grace_s: float = 300.0  # the partition's GraceTime: SIGTERM this long before a preempted job is killed

    def __post_init__(self) -> None:
        problems = []
        if self.max_job_s is not None and not (math.isfinite(self.max_job_s) and self.max_job_s >= 3600.0):
            problems.append(f"max_job_s must be at least 3600 s (got {self.max_job_s!r})")
        if not 60 <= self.lead_s <= 65535:
            problems.append(f"lead_s must be 60 to 65535 s, as [continuation] takes (got {self.lead_s})")
        if self.max_job_s is not None and not 0 <= self.prequeue_s < self.max_job_s:
            problems.append(f"prequeue_s must be 0 or more and below max_job_s (got {self.prequeue_s})")
        for name in ("queue_wait_median_s", "queue_wait_sigma", "preempt_per_day", "grace_s"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value >= 0):
                problems.append(f"{name} must be a non-negative number (got {value!r})")
        if problems:
            raise ValueError("chain settings: " + "; ".join(problems))

    @property
    def queues(self) -> bool:
        return self.queue_wait_median_s > 0

    def queue_wait(self, seed: int) -> Callable[[], float] | None:
        """One wait per job entering the queue, drawn in order from the seed (None: no queue)."""
        if not self.queues:
            return None
        rng = random.Random(f"queue:{seed}")
        mu = math.log(self.queue_wait_median_s)
        return lambda: rng.lognormvariate(mu, self.queue_wait_sigma)

    def preemptions(self, seed: int, seconds: float) -> list[float]:
        """The preemption times (seconds after the start): a Poisson process."""
        if self.preempt_per_day <= 0:
            return []
        rng = random.Random(f"preempt:{seed}")
        rate = self.preempt_per_day / 86400.0
        times, t = [], rng.expovariate(rate)
        while t < seconds:
            times.append(t)
            t += rng.expovariate(rate)
        return times

    def describe(self) -> str:
        limit = "none" if self.max_job_s is None else f"{self.max_job_s / 3600:g} h (signal {self.lead_s} s before)"
        queue = (
            f"log-normal, median {self.queue_wait_median_s / 60:g} min, sigma {self.queue_wait_sigma:g}"
            f"{'' if self.accrue_always else ', no age while held'}"
            if self.queues
            else "none (a job starts once nodes are free)"
        )
        preempt = (
            f"{self.preempt_per_day:g} a day, GraceTime {self.grace_s:g} s" if self.preempt_per_day > 0 else "none"
        )
        return f"time limit {limit}; pre-queue {self.prequeue_s} s ahead; queue wait {queue}; preemption {preempt}"


def signal_lead(extra_args: Sequence[str]) -> int | None:
    """The N of the job's last ``--signal=[B:]SIG@N`` (sbatch takes the last one), None without one."""
    lead = None
    for arg in extra_args:
        m = _SIGNAL_ARG.match(arg)
        if m:
            lead = int(m.group(1))
    return lead


@dataclass
class ChainLog:
    """What the chain did, for the figures: each planned end and the next job's start."""

    planned_ends: list[float]  # a job ended on purpose after its save (limit's signal, preemption)
    starts: list[float]  # every job incarnation's start
    timeouts: int = 0  # jobs that reached the limit without a committed save
    preemptions: int = 0
    preempted_unsaved: int = 0  # the grace time was too short for a save

    def gaps(self) -> list[float]:
        """Per planned end: seconds until the next job started (an end with none after it: left out)."""
        out, starts = [], sorted(self.starts)
        for end in self.planned_ends:
            later = next((s for s in starts if s >= end), None)
            if later is not None:
                out.append(later - end)
        return out


def chain_report(log: ChainLog) -> dict[str, object]:
    gaps = sorted(log.gaps())
    return {
        "planned_ends": len(log.planned_ends),
        "timeouts": log.timeouts,
        "preemptions": log.preemptions,
        "preempted_unsaved": log.preempted_unsaved,
        "gaps_s": gaps,
    }
