"""Which jobs a tick asks Slurm for: the supervised jobs by id, or the account's whole list.

Every job a decision reads is known by id — each run's current attempt's, each open intent's —
except one: the job of a submission whose answer was never journaled (a crash, a timed-out
sbatch), which only its tag finds (engine/act/intents.py). So the account's whole list is asked for
when such a job may exist — the first read after a start, a submission still open — and otherwise
only as a rate-limited safety net (``every_s``; put off while the tick already reads the whole node
table), or beyond ``MAX_IDS``. The scheduler serves the ids the cheapest way it knows
(adapters/slurm/reads.py: a single-job lookup each where the account's list is not cheap — as root,
22.05 sends every job in the cluster for it: bench/README.md).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from supervisor.domain.actions import ActionKind
from supervisor.domain.records import RunRecord
from supervisor.ports import Intent

ACCOUNT_EVERY_S = 60.0  # as the whole node table: at least once a minute
MAX_IDS = 32  # where each is a client call of its own, beyond this one list costs less


@dataclass(frozen=True)
class JobReadPlan:
    ids: frozenset[int] | None  # the jobs to read by id; None: the account's whole list
    reason: str  # why (logged with the read)


def plan_job_read(
    runs: Iterable[RunRecord],
    open_intents: Iterable[Intent],
    *,
    account_age_s: float | None,
    every_s: float = ACCOUNT_EVERY_S,
    max_ids: int = MAX_IDS,
    busy: bool = False,
) -> JobReadPlan:
    """``account_age_s``: since the account's list was last read (None: never, in this process);
    ``busy``: the tick reads the whole node table already (a refresh waits for the next tick)."""
    intents = list(open_intents)
    if account_age_s is None:
        return JobReadPlan(None, "first read")
    if any(i.kind == ActionKind.SUBMIT for i in intents):
        return JobReadPlan(None, "submission open")
    runs = list(runs)
    ids = {r.attempt.job_id for r in runs if r.attempt is not None}
    ids |= {r.successor.job_id for r in runs if r.successor is not None}  # a pre-queued next job
    ids |= {int(i.params["job_id"]) for i in intents if "job_id" in i.params}
    if len(ids) > max_ids:
        return JobReadPlan(None, "many jobs")
    if account_age_s >= every_s and not busy:
        return JobReadPlan(None, "refresh")
    return JobReadPlan(frozenset(ids), "by id")
