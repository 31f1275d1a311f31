"""Jobs the controller forgot, read back from accounting.

squeue drops a finished job MinJobAge (300 s by default) after it ended: a daemon stopped longer
than that finds jobs it follows gone. Their records are read from accounting (``sacct``; one
batched call per tick, only while such jobs exist) and join the snapshot, so each run is decided
as it would have been had the daemon seen its job end. Ended records do not change: they are
remembered for as long as the job is still followed. What could not be read is said per job
(``Forgotten``), for the logbook: no accounting, no record, or not yet (asked again next tick).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import replace

import structlog

from supervisor.domain.cluster import ClusterSnapshot, JobInfo
from supervisor.domain.observation import Forgotten
from supervisor.domain.records import RunRecord
from supervisor.engine.facts.cancellers import Cancellers
from supervisor.ports import Accounting, PermanentError, TransientError

log = structlog.get_logger()

NO_ACCOUNTING = (
    "the cluster keeps no job accounting (slurm.conf AccountingStorageType=accounting_storage/none: no "
    "slurmdbd), so sacct cannot tell"
)
FOUND = "its outcome was read from Slurm's accounting (sacct)"


class ForgottenJobs:
    """The observer's reader of accounting (None: the cluster keeps none)."""

    def __init__(self, accounting: Accounting | None) -> None:
        self.accounting = accounting
        self._ended: dict[int, JobInfo] = {}  # job id -> its final record, while still followed
        self.cancellers = Cancellers(accounting)  # who cancelled a job by hand (engine.facts.cancellers)

    def look_up(self, runs: Iterable[RunRecord], snap: ClusterSnapshot) -> tuple[ClusterSnapshot, dict[int, Forgotten]]:
        """The snapshot with the ended records of followed jobs squeue no longer lists, and what
        accounting said of each such job; a job cancelled by hand with who did it, where named."""
        runs = list(runs)
        snap, notes = self._forgotten(runs, snap)
        return self.cancellers.name(runs, snap), notes

    def _forgotten(self, runs: list[RunRecord], snap: ClusterSnapshot) -> tuple[ClusterSnapshot, dict[int, Forgotten]]:
        missing = sorted({r.attempt.job_id for r in runs if r.attempt is not None} - set(snap.jobs))
        self._ended = {j: info for j, info in self._ended.items() if j in missing}
        if not missing:
            return snap, {}
        if self.accounting is None:
            return snap, {j: Forgotten(NO_ACCOUNTING) for j in missing}
        notes = self._ask([j for j in missing if j not in self._ended])
        notes.update({j: Forgotten(FOUND, found=True) for j in self._ended})
        return replace(snap, jobs={**snap.jobs, **self._ended}), notes

    def _ask(self, job_ids: list[int]) -> dict[int, Forgotten]:
        """Ask accounting for ``job_ids``; remember the ended ones, say why for the others."""
        if not job_ids:
            return {}
        assert self.accounting is not None
        try:
            records: Mapping[int, JobInfo] = self.accounting.job_records(job_ids)
        except TransientError as exc:
            log.warning("accounting_unreachable", jobs=job_ids, error=str(exc))
            return {j: Forgotten(f"accounting did not answer ({exc}); asking again", final=False) for j in job_ids}
        except PermanentError as exc:
            log.error("accounting_failed", jobs=job_ids, error=str(exc))
            return {j: Forgotten(f"sacct failed: {exc}") for j in job_ids}
        notes = {}
        for job_id in job_ids:
            record = records.get(job_id)
            if record is not None and record.state.finished:
                self._ended[job_id] = record
            elif record is not None:
                why = f"accounting still shows it {record.state.value}: its end is not recorded yet; asking again"
                notes[job_id] = Forgotten(why, final=False)
            else:
                notes[job_id] = Forgotten("Slurm's accounting (sacct) has no record of it")
        return notes
