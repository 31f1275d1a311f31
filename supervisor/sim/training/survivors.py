"""Save on failure: the synthetic trainer's surviving replicas save the step in progress and exit.

"Just-in-time checkpointing" (Gupta et al., EuroSys'24; Megatron's exit handler; ByteRobust's
in-memory checkpoints): when one node's ranks die while the others live, every data-parallel
replica on the other nodes still holds the whole model and optimizer state, so the survivors save
the step they are at and exit; a restart loses about one step instead of the work since the last
periodic save. ``TrainerSettings.survivor_save_s`` turns it on (None: off, today's trainer).

Covered (``covers``): a GPU fault (XID), an uncorrectable ECC error, a dead NIC — one node's ranks
die, the node's peers get an error from the collective and are left with a healthy replica. Not
covered, the work since the last save is lost as before: a dead host (the survivors hang in the
collective until NCCL's watchdog kills them), a fabric error or a software bug (every rank dies),
silent data corruption (no replica to trust), a hang.

The step saved is the last one completed at the crash: the steps of the last logged line plus those
of the log interval in progress, each taking ``1/log_every`` of that interval's drawn duration
(none during a blocking save, whose step is saved again). The save goes through the
``SimCheckpointStore`` as any save: begun at the crash, committed ``survivor_save_s`` later, when
the processes exit; whatever stops them sooner (the supervisor cancels the job, relaunches the
step) tears it — what the daemon's hold (``CheckpointPolicy.save_on_failure_s``) is for.
"""

from __future__ import annotations

import math

from supervisor.sim.faults.failures import FailureModel, Manifestation
from supervisor.sim.training.settings import SimSettings
from supervisor.sim.training.trainer import Attempt, SimTrainer

COVERED = frozenset((Manifestation.XID, Manifestation.ECC, Manifestation.NIC))


def covers(shows: Manifestation) -> bool:
    """One node's ranks die and the others live with the state: the survivors can save."""
    return shows in COVERED


def step_at(trainer: SimTrainer, a: Attempt, at: float) -> int:
    """The last step the attempt completed by ``at`` (logged or not)."""
    trainer.reached(a, at)  # generation reaches ``at``: the interval in progress is drawn
    every = trainer.settings.log_every
    for start, step, duration in reversed(a.intervals):
        if start <= at:
            return step + min(every, math.floor((at - start) * every / duration))
    return a.resume_step


def save_on_failure(trainer: SimTrainer, a: Attempt, shows: Manifestation, at: float) -> float | None:
    """The survivors of a crash at ``at`` save the step in progress: when their processes exit
    (``at`` when that step is saved already). None: no save on failure — the processes die now."""
    save_s = trainer.settings.survivor_save_s
    if save_s is None or not covers(shows) or at < a.computing_at or a.frozen_at is not None or not a.active:
        return None
    step = step_at(trainer, a, at)
    trainer.freeze(a, at)  # no step completes any more; a periodic save in flight is torn
    saved = trainer.store.get(step)
    if saved is not None and saved.committed(at) and not saved.bad:
        return at
    trainer.store.begin_save(step, at, at + save_s)
    return at + save_s


def lost_work_mtbf_s(model: FailureModel, gpus: int) -> float:
    """The mean time between the failures that still lose the work since the last save: those that
    interrupt and are not covered."""
    total = sum(c.count for c in model.categories)
    losing = sum(c.count for c in model.categories if c.shows.interrupts and not covers(c.shows))
    rate = model.rate_per_s(gpus) * losing / total
    return math.inf if rate <= 0 else 1.0 / rate


def covered_share(model: FailureModel) -> float:
    """The share of the model's failures the survivors' save covers."""
    return sum(c.count for c in model.categories if covers(c.shows)) / sum(c.count for c in model.categories)


def daemon_grace_s(settings: SimSettings) -> float:
    """The run spec's ``[checkpoints] save_on_failure_s``: how long the daemon holds its recovery
    for a step or job that still runs after a node of it faulted (0: the trainer does not save on
    failure). Twice the save: headroom for a save slower than its typical time (every survivor
    writes at once; the storage's load varies), as a grace that ends when the typical save does
    tears every slow one. Plus one poll: the daemon sees its hold run out, and the job's exit, only
    on its ticks. Spent in full only when the job hangs instead of exiting (a dead host: its peers
    wait in the collective); a covered crash ends the hold when the survivors exit."""
    save_s = settings.trainer.survivor_save_s
    return 0.0 if save_s is None else 2.0 * save_s + settings.poll_interval_s
