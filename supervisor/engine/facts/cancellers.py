"""Who cancelled a followed job by hand, read from accounting when the job is found cancelled.

On Slurm 22.05 only accounting names who cancelled a job (sacct's State "CANCELLED by 1001"):
squeue and scontrol keep the Reason the job had before (docs/operations.md). So the per-tick read
stays as it is, and accounting is asked once per job, only for a followed job squeue shows
CANCELLED that the supervisor did not cancel itself (no cancel requested, not recovering) — a rare
event. What it names joins the snapshot's ``JobInfo.cancelled_by``; when it cannot tell (no
accounting, slurmdbd unreachable, the cancel not recorded yet) the job goes unnamed and the logbook
says so: the run is never held up waiting for a name.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import replace

import structlog

from supervisor.domain.cluster import Canceller, ClusterSnapshot, JobState
from supervisor.domain.records import RunRecord
from supervisor.domain.run import RunState
from supervisor.ports import Accounting, PermanentError, TransientError

log = structlog.get_logger()


class Cancellers:
    """The observer's reader of who cancelled jobs (``accounting`` None: the cluster keeps none)."""

    def __init__(self, accounting: Accounting | None) -> None:
        self.accounting = accounting
        self._asked: dict[int, Canceller | None] = {}  # job id -> what accounting named, while followed

    def name(self, runs: Iterable[RunRecord], snap: ClusterSnapshot) -> ClusterSnapshot:
        """The snapshot with the canceller of each job cancelled by hand, where accounting names one."""
        wanted = _cancelled_by_hand(runs, snap)
        self._asked = {j: who for j, who in self._asked.items() if j in wanted}
        new = [j for j in wanted if j not in self._asked]
        if new:
            self._asked.update(self._ask(new))
        named = {j: replace(snap.jobs[j], cancelled_by=who) for j, who in self._asked.items() if who is not None}
        return replace(snap, jobs={**snap.jobs, **named}) if named else snap

    def _ask(self, job_ids: list[int]) -> dict[int, Canceller | None]:
        """Once per job: what accounting names (None when it does not, or cannot be asked)."""
        if self.accounting is None:
            return dict.fromkeys(job_ids)
        try:
            records = self.accounting.job_records(job_ids)
        except (TransientError, PermanentError) as exc:
            log.warning("canceller_unknown", jobs=job_ids, error=str(exc))
            return dict.fromkeys(job_ids)
        return {j: records[j].cancelled_by if j in records else None for j in job_ids}


def _cancelled_by_hand(runs: Iterable[RunRecord], snap: ClusterSnapshot) -> list[int]:
    """Jobs of runs still followed that Slurm shows cancelled, not by the supervisor's own doing."""
    out = []
    for run in runs:
        a = run.attempt
        job = snap.jobs.get(a.job_id) if a is not None else None
        if job is None or job.state is not JobState.CANCELLED or job.cancelled_by is not None:
            continue
        if not (run.state.terminal or run.cancel_requested or run.state is RunState.RECOVERING):
            out.append(job.job_id)
    return out
