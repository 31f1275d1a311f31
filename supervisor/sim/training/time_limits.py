"""The partition's time limit and preemption in the simulated world (``chain.ChainSettings``).

Each job incarnation that starts gets its limit (Slurm ends it TIMEOUT ``max_job_s`` after its
start) and, when it was submitted with ``--signal=[B:]SIG@N``, the signal N seconds before; a
preemption at a drawn time gives the running job's trainer ``grace_s`` of SIGTERM. On either
signal the trainer saves at its next log-line boundary and exits (``SimTrainer.end_on_purpose``):

* under the supervisor with the continue code (``SSV_CONTINUE_EXIT_CODE``), or, preempted, Slurm
  ends the job PREEMPTED (``PreemptMode=CANCEL``) with that code — the engine decides the rest;
* in the hand-made chain (baseline mode) the batch script exits 0 and submits itself again at its
  end (``sbatch "$0"``: a new job, from the back of the queue) — also after a time-out, as the
  scripts that trap the signal and resubmit in the trap do; preempted, Slurm requeues the job
  (``PreemptMode=REQUEUE``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from supervisor.domain.cluster import JobState
from supervisor.sim.slurm.records import Incarnation
from supervisor.sim.training.chain import ChainLog, signal_lead
from supervisor.sim.training.results import quantile
from supervisor.sim.training.settings import Mode
from supervisor.sim.training.trainer import Attempt

if TYPE_CHECKING:
    from supervisor.sim.training.world import World

DEFAULT_CONTINUE_CODE = 75


class TimeLimits:
    def __init__(self, world: World) -> None:
        self.world = world
        self.chain = world.settings.chain
        self.log = ChainLog([], [])
        self._limits: dict[tuple[int, int], float] = {}  # per incarnation: when its time runs out

    def schedule(self) -> None:
        """The preemptions of the whole run, drawn from the seed."""
        s = self.world.settings
        for t in self.chain.preemptions(s.seed, s.seconds):
            self.world.clock.call_at(self.world.start + t, self._preempt)

    # -- a job's life ---------------------------------------------------------------------------

    def started(self, inc: Incarnation, a: Attempt | None) -> None:
        self.log.starts.append(inc.start)
        limit = self.chain.max_job_s
        if limit is None:
            return
        key = (inc.job_id, inc.restart_count)
        self._limits[key] = ends = inc.start + limit
        self.world.clock.call_at(ends, self._time_out, key)
        lead = signal_lead(self.world.cluster.job_request(inc.job_id).extra_args)
        if lead is not None and a is not None:
            self.world.later(a, max(inc.start, ends - lead), self._signalled)

    def _signalled(self, a: Attempt) -> None:
        deadline = self._limits.get((a.key[0], a.key[1]))
        now = self.world.clock.now()
        done = self.world.trainer.end_on_purpose(a, now, deadline if deadline is not None else now)
        if done is not None:
            self.world.later(a, done, self._saved_and_exits)

    def _saved_and_exits(self, a: Attempt) -> None:
        job = self._running(a)
        if job is None:
            return
        self.log.planned_ends.append(self.world.clock.now())
        code = int(self.world.cluster.job_request(job).env.get("SSV_CONTINUE_EXIT_CODE", DEFAULT_CONTINUE_CODE))
        if self.world.mode is Mode.BASELINE:
            self.world.cluster.finish_job(job, 0)
            self._resubmit(job)
        else:
            self.world.cluster.finish_job(job, code)

    def _time_out(self, key: tuple[int, int]) -> None:
        job_id, restart_count = key
        self._limits.pop(key, None)
        try:
            info = self.world.cluster.job_info(job_id)
        except Exception:  # noqa: BLE001 - purged: it ended long ago
            return
        if info.state is not JobState.RUNNING or info.restart_count != restart_count:
            return
        self.log.timeouts += 1
        self.world.cluster.time_out(job_id)
        if self.world.mode is Mode.BASELINE:
            self._resubmit(job_id)

    def _resubmit(self, job_id: int) -> None:
        """The hand-made script's last line: ``sbatch "$0"``, the same request as a new job."""
        self.world.cluster.submit(self.world.cluster.job_request(job_id))

    # -- preemption -----------------------------------------------------------------------------

    def _preempt(self) -> None:
        a = self.world.trainer.current()
        if a is None or self._running(a) is None or a.exit_at is not None:
            return  # between jobs (the preemptor takes idle nodes), or the job is ending by itself
        self.log.preemptions += 1
        now = self.world.clock.now()
        done = self.world.trainer.end_on_purpose(a, now, now + self.chain.grace_s)
        if done is None:
            self.log.preempted_unsaved += 1
        self.world.later(a, now + self.chain.grace_s if done is None else done, self._preempted, done is not None)

    def _preempted(self, a: Attempt, saved: bool) -> None:
        job = self._running(a)
        if job is None:
            return
        if saved:
            self.log.planned_ends.append(self.world.clock.now())
        if self.world.mode is Mode.BASELINE:
            self.world.cluster.requeue(job)  # PreemptMode=REQUEUE
            return
        code = self.world.cluster.job_request(job).env.get("SSV_CONTINUE_EXIT_CODE", str(DEFAULT_CONTINUE_CODE))
        self.world.cluster.preempt(job, int(code) if saved else None)

    def _running(self, a: Attempt) -> int | None:
        """The attempt's job id while that incarnation still runs (else None)."""
        job_id = a.key[0]
        try:
            info = self.world.cluster.job_info(job_id)
        except Exception:  # noqa: BLE001 - purged
            return None
        if info.state is not JobState.RUNNING or info.restart_count != a.key[1] or not a.active:
            return None
        return job_id


def chain_summary(reports: Sequence[object]) -> dict[str, object]:
    """``chain_report`` over seeds: means, and the gap quantiles over every planned end of every seed."""
    docs = [r for r in reports if isinstance(r, dict)]
    gaps = sorted(g for d in docs for g in d.get("gaps_s", ()))
    n = max(1, len(docs))
    return {
        "planned_ends": sum(int(d.get("planned_ends", 0)) for d in docs) / n,
        "timeouts": sum(int(d.get("timeouts", 0)) for d in docs) / n,
        "preemptions": sum(int(d.get("preemptions", 0)) for d in docs) / n,
        "preempted_unsaved": sum(int(d.get("preempted_unsaved", 0)) for d in docs) / n,
        "gap_s_p50": quantile(gaps, 0.5),
        "gap_s_p99": quantile(gaps, 0.99),
        "gap_s_mean": sum(gaps) / len(gaps) if gaps else None,
    }
