"""A loss spike that does not heal, in an in-allocation run: the rollback relaunches the step in
place — the same job and nodes, the step's next generation, from the rollback's checkpoint with its
data skipped, one restart spent — instead of cancelling the job and queueing again."""

from test_in_allocation import A0, JOB, SPEC, of, run, snap

from supervisor.adapters.sqlite import SqliteStore
from supervisor.domain.actions import Cancel, SetState, SwapStep
from supervisor.domain.alloc_step import AllocationStep, LauncherReport
from supervisor.domain.decide.policy import Observation, Policy, decide
from supervisor.domain.spikes.rollback import RollbackRecord, RollbackStatus, SkipRange
from supervisor.sim.runner import Simulation
from supervisor.sim.training.settings import Mode, SimSettings
from supervisor.sim.training.trainer import TrainerSettings

NOW = A0.started_at + 3600.0
ALIVE = LauncherReport(7, 0, True, ("n1", "n2"), "n1", at=NOW - 1)
PLANNED = RollbackRecord(
    "llm", 0, 3300, RollbackStatus.PLANNED, NOW - 2, "not healed", 3150, SkipRange(3290, 3600), 1.0
)


def test_a_planned_rollback_relaunches_the_step_in_place_and_spends_one_restart():
    d = decide(run(AllocationStep(report=ALIVE)), Observation(snap(NOW), rollbacks={"llm": PLANNED}), Policy())
    (relaunch,) = of(d, SwapStep)
    assert (relaunch.job_id, relaunch.generation, relaunch.nodes, relaunch.out) == (7, 1, ("n1", "n2"), ())
    assert relaunch.restart and "loss spike at step 3300" in relaunch.reason
    assert not of(d, Cancel) and not of(d, SetState)  # the job is kept


def test_with_the_restart_budget_spent_the_job_is_stopped_as_before():
    spent = run(AllocationStep(report=ALIVE), restarts_spent=SPEC.max_restarts)
    d = decide(spent, Observation(snap(NOW), rollbacks={"llm": PLANNED}), Policy())
    assert not of(d, SwapStep) and [c.job_id for c in of(d, Cancel)] == [JOB.job_id]


def test_on_the_simulator_the_rollback_stays_in_the_job_and_skips_the_data(tmp_path):
    settings = SimSettings(
        gpus=32, gpus_per_node=8, spares=3, hot_spares=1, days=0.3, seed=5,
        trainer=TrainerSettings(diverge_at=(3300,), checkpoint_steps=150),
    )  # fmt: skip
    result = Simulation(settings, Mode.IN_ALLOCATION, tmp_path / "ia").run([])
    store = SqliteStore(tmp_path / "ia")
    try:
        (rollback,) = store.rollbacks(result.run)
        jobs = {a.job_id for a in store.attempts(result.run)}
        swaps = [e for e in store.events(result.run) if e.evidence.get("in_allocation") == "swap"]
        spent = store.get_run(result.run).restarts_spent
    finally:
        store.close()
    assert rollback.status is RollbackStatus.DONE and len(jobs) == 1  # no second job
    (swap,) = swaps
    assert "loss spike at step" in swap.message and swap.evidence["resume_step"] == rollback.checkpoint_step
    assert spent == 1
    steps = result.extra["step_attempts"]
    assert [key[2] for key in steps] == [0, 1]  # generation 0, then the rollback's generation 1
