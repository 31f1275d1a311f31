"""In-memory peer copies on the simulator (supervisor/sim/training/peer_copies.py): the synthetic trainer of
a sharded state reports its generations, the real engine names the newest one in the relaunch's
plan and the relaunched step restores it instead of the older checkpoint it is offered — in the
same job only: a resubmission (a new job) resumes from storage."""

from __future__ import annotations

from dataclasses import replace

import pytest

from supervisor.adapters.sqlite import SqliteStore
from supervisor.domain.records import EventKind
from supervisor.sim.faults.failures import TABLE5, Failure, FailureModel, Manifestation
from supervisor.sim.runner import Simulation
from supervisor.sim.training.peer_copies import PeerMemory, storage_mtbf_s
from supervisor.sim.training.settings import Mode, SimSettings
from supervisor.sim.training.trainer import TrainerSettings

CATS = {c.component: c for c in TABLE5}
TRAINER = TrainerSettings(checkpoint_steps=150, peer_copies_steps=10)
# 4 nodes for the step, 1 hot spare in the job, 2 idle nodes in the partition for a resubmission.
SMALL = SimSettings(gpus=32, gpus_per_node=8, spares=3, hot_spares=1, days=0.4, seed=5, trainer=TRAINER)
FAULTS = [
    Failure(2 * 3600.0 + 3.3, CATS["Faulty GPU"], 0.5, 0.5, 0.5),  # a swap: the hot spare in
    Failure(6 * 3600.0 + 7.7, CATS["Faulty GPU"], 0.3, 0.5, 0.5),  # no spare left: a new job
]


def _events(result, root):
    store = SqliteStore(root)
    try:
        return store.events(result.run)
    finally:
        store.close()


def test_a_swap_restores_the_newest_generation_from_memory_and_a_new_job_resumes_from_storage(tmp_path):
    result = Simulation(SMALL, Mode.IN_ALLOCATION, tmp_path / "ia").run(FAULTS)
    events = _events(result, tmp_path / "ia")
    (swap,) = [e for e in events if e.evidence.get("in_allocation") == "swap"]
    offered = swap.evidence["resume_step"]
    assert "peer copies in memory hold step" in swap.message, swap.message
    (restored,) = [e for e in events if e.evidence.get("in_allocation") == "memory_restored"]
    step = restored.evidence["resume_step"]
    assert step > offered and step % 10 == 0 and step - offered < 150  # newer than the periodic save
    assert f"instead of the checkpoint at step {offered}" in restored.message
    assert restored.job_id == swap.job_id and restored.evidence["generation"] == 1
    resubmitted = [e for e in events if e.kind is EventKind.RESTARTED]
    assert resubmitted and "peer copies" not in resubmitted[0].message  # a new job: no copies to name
    assert result.extra["memory_restores"] == 1


def test_the_copies_raise_the_ettr_on_the_same_draw(tmp_path):
    plain = replace(SMALL, trainer=replace(TRAINER, peer_copies_steps=None))
    without = Simulation(plain, Mode.IN_ALLOCATION, tmp_path / "p").run(FAULTS)
    with_copies = Simulation(SMALL, Mode.IN_ALLOCATION, tmp_path / "c").run(FAULTS)
    assert with_copies.ettr > without.ettr
    assert with_copies.extra["loss_s"]["rework_s"] < without.extra["loss_s"]["rework_s"]


def test_a_generation_not_complete_when_the_step_stopped_never_was_and_a_rollback_is_not_restored():
    memory = PeerMemory(copy_s=0.1, exchange_s=5.0)
    memory.boundary(7, 100.0, 40)
    memory.boundary(7, 160.0, 50)
    memory.truncate(7, 162.0)  # crashed 2 s into generation 50's exchange
    assert memory.resume_point(7, {}, 30, now=200.0) == 40
    assert memory.resume_point(7, {"SSV_RESUME_MEMORY_STEP": "40"}, 30, now=200.0) == 40
    assert memory.resume_point(7, {"SSV_RESUME_MEMORY_STEP": ""}, 30, now=200.0) is None  # a rollback
    assert memory.resume_point(7, {}, 40, now=200.0) is None  # not newer than the checkpoint
    assert memory.resume_point(8, {}, 0, now=200.0) is None  # another job: none


def test_the_storage_interval_trades_against_the_resubmissions_only():
    model = FailureModel()
    node_losing = {Manifestation.XID, Manifestation.ECC, Manifestation.NIC, Manifestation.HOST_DOWN}
    share = sum(c.count for c in model.categories if c.shows in node_losing) / sum(c.count for c in model.categories)
    assert storage_mtbf_s(model, 16384, 16) == pytest.approx(16 * model.mtbf_s(16384) / share)


def test_copies_off_a_log_line_are_refused():
    with pytest.raises(ValueError, match="multiple of log_every"):
        TrainerSettings(peer_copies_steps=15)
