"""The simulated trainer that saves on failure (just-in-time checkpointing, supervisor/sim/training/survivors.py):
when one node's ranks die (XID, ECC, NIC) the surviving replicas save the step in progress and exit;
a restart resumes from it, in every mode, unless something stops them before the save is written."""

from __future__ import annotations

import json
import math
from dataclasses import replace

import pytest
from click.testing import CliRunner

from supervisor.cli import main
from supervisor.sim.clock import VirtualClock
from supervisor.sim.faults.failures import TABLE5, Failure, FailureModel, Manifestation
from supervisor.sim.plan import assumptions, make_plan
from supervisor.sim.runner import Simulation, checkpoint_policy
from supervisor.sim.training.checkpoints import SimCheckpointStore
from supervisor.sim.training.results import SimResult
from supervisor.sim.training.settings import Mode, SimSettings
from supervisor.sim.training.survivors import covers, daemon_grace_s, lost_work_mtbf_s, save_on_failure, step_at
from supervisor.sim.training.trainer import SimTrainer, TrainerSettings

CATS = {c.component: c for c in TABLE5}
SAVE_S = 20.0
# A periodic save every 600 steps (an hour of training), no step noise: the step at any moment is known.
TRAINER = TrainerSettings(step_noise=0.0, checkpoint_steps=600, survivor_save_s=SAVE_S)
# 4 nodes for the job, 1 hot spare in the job (in-allocation), the rest idle in the partition.
SMALL = SimSettings(gpus=32, gpus_per_node=8, spares=3, hot_spares=1, baseline_spares=2, days=0.25, trainer=TRAINER)
CRASH = 1.5 * 3600.0 + 3.3  # after the save at step 600, before the one at 1200


def fault(name: str, at: float = CRASH) -> Failure:
    """On the job's third node (not the batch host), caught by the site health check at once."""
    return Failure(at, CATS[name], 0.6, 0.5, 0.0)


def run(mode: Mode, failures: list[Failure], tmp_path, settings: SimSettings = SMALL) -> tuple[Simulation, SimResult]:
    sim = Simulation(settings, mode, tmp_path / mode.value if mode.supervised else None)
    return sim, sim.run(failures)


def resumes_after_crash(sim: Simulation) -> tuple[int, list[int], float]:
    """The step completed at the crash (exact: no noise), the resume steps of the attempts that
    started after it, and when step+1 would have completed."""
    attempts = sim.world.attempts()
    first = attempts[0]
    crash = sim.world.start + CRASH
    periodic = (crash - first.computing_at) // TRAINER.step_s  # steps, ignoring the one blocking save
    step = int((crash - first.computing_at - TRAINER.save_s) // TRAINER.step_s) if periodic > 600 else int(periodic)
    next_done = first.computing_at + (step + 1) * TRAINER.step_s + TRAINER.save_s
    return step, [a.resume_step for a in attempts if a.started_at > crash], next_done


# -- the trainer ---------------------------------------------------------------------------------


def trainer(**options):
    clock = VirtualClock()
    store = SimCheckpointStore(clock)
    return clock, store, SimTrainer(replace(TRAINER, log_every=10, **options), clock, store)


def test_the_survivors_save_the_exact_step_in_progress_not_the_last_logged_one():
    clock, store, tr = trainer()
    a = tr.start((1, 0), "/logs/a.out", ("n001", "n002"), {})
    crash = a.computing_at + 6.0 * 123 + 2.5  # 123 steps done, the 124th half-way
    clock.advance_to(crash)
    assert tr.reached(a, crash) == 120  # the last logged line
    assert step_at(tr, a, crash) == 123
    exit_at = save_on_failure(tr, a, Manifestation.XID, crash)
    assert exit_at == crash + SAVE_S
    save = store.get(123)
    assert save is not None and save.committed_at == exit_at
    clock.advance_to(exit_at)
    tr.end(a, exit_at)  # the processes exit once it is written: the exit does not tear it
    assert store.newest(committed_only=True).step == 123


def test_the_step_is_exact_even_when_lines_were_generated_ahead_of_the_crash():
    clock, _, tr = trainer()
    a = tr.start((1, 0), "/logs/a.out", ("n001",), {})
    tr.learning_times(a)  # the simulator reads ahead: lines past the crash exist already
    crash = a.computing_at + 6.0 * 37 + 0.1
    clock.advance_to(crash)
    assert a.last_line[1] > 40 and step_at(tr, a, crash) == 37


def test_a_crash_during_a_blocking_save_saves_that_step_again_and_one_just_after_a_save_saves_nothing_new():
    clock, store, tr = trainer(checkpoint_steps=100)
    a = tr.start((1, 0), "/logs/a.out", ("n001",), {})
    at_save = a.computing_at + 600.0 + 2.0  # the save of step 100 blocks from +600 s for 5 s
    clock.advance_to(at_save)
    assert step_at(tr, a, at_save) == 100 and save_on_failure(tr, a, Manifestation.ECC, at_save) == at_save + SAVE_S
    clock.advance_to(at_save + SAVE_S)
    tr.end(a, clock.now())
    assert store.newest(committed_only=True).step == 100
    b = tr.start((1, 1), "/logs/b.out", ("n001",), {})
    just_after = b.computing_at + 0.5  # resumed from 100, nothing trained since: already saved
    clock.advance_to(just_after)
    assert save_on_failure(tr, b, Manifestation.XID, just_after) == just_after
    assert store.get(100).committed(just_after)


def test_a_stop_before_the_save_ends_tears_it():
    clock, store, tr = trainer()
    a = tr.start((1, 0), "/logs/a.out", ("n001", "n002"), {})
    crash = a.computing_at + 6.0 * 50 + 1.0
    clock.advance_to(crash)
    save_on_failure(tr, a, Manifestation.NIC, crash)
    clock.advance_to(crash + SAVE_S / 2)
    tr.end(a, clock.now())  # cancelled, or relaunched, before the survivors were done
    assert store.get(50).committed_at is None and store.newest(committed_only=True) is None


def test_only_one_nodes_ranks_dying_with_a_healthy_replica_left_is_covered():
    assert {m for m in Manifestation if covers(m)} == {Manifestation.XID, Manifestation.ECC, Manifestation.NIC}
    clock, _, tr = trainer()
    a = tr.start((1, 0), "/logs/a.out", ("n001",), {})
    clock.advance_to(a.computing_at + 100.0)
    for shows in (Manifestation.SOFTWARE, Manifestation.HOST_DOWN, Manifestation.SDC, Manifestation.NCCL_ERROR):
        assert save_on_failure(tr, a, shows, clock.now()) is None
    early = tr.start((2, 0), "/logs/b.out", ("n001",), {})  # still starting: nothing trained to save
    assert save_on_failure(tr, early, Manifestation.XID, clock.now() + 1.0) is None
    off = SimTrainer(TrainerSettings(), clock, SimCheckpointStore(clock))
    b = off.start((3, 0), "/logs/c.out", ("n001",), {})
    assert save_on_failure(off, b, Manifestation.XID, b.computing_at + 100.0) is None  # off by default


def test_survivor_save_s_is_validated():
    with pytest.raises(ValueError, match="survivor_save_s"):
        TrainerSettings(survivor_save_s=-1.0)
    with pytest.raises(ValueError, match="survivor_save_s"):
        TrainerSettings(survivor_save_s=math.nan)


# -- every mode ----------------------------------------------------------------------------------


def test_baseline_a_covered_crash_resumes_from_the_step_in_progress(tmp_path):
    sim, result = run(Mode.BASELINE, [fault("Faulty GPU")], tmp_path)
    step, resumes, next_done = resumes_after_crash(sim)
    assert step > 600 and resumes and set(resumes) == {step}  # within a step: step + 1 was not done
    assert next_done > sim.world.start + CRASH
    assert result.extra["survivor_saves"] == 1 and result.extra["survivor_saves_torn"] == 0


@pytest.mark.parametrize("name", ["Software Bug", "Host Maintenance"])
def test_an_uncovered_failure_resumes_from_the_last_periodic_save(tmp_path, name):
    for mode in (Mode.BASELINE, Mode.SUPERVISOR):
        sim, result = run(mode, [fault(name)], tmp_path / name)
        _, resumes, _ = resumes_after_crash(sim)
        assert resumes and resumes[-1] == 600, (mode, resumes)
        assert result.extra["survivor_saves"] == 0


def test_without_the_option_a_covered_crash_resumes_from_the_last_periodic_save(tmp_path):
    off = replace(SMALL, trainer=replace(TRAINER, survivor_save_s=None))
    sim, result = run(Mode.BASELINE, [fault("Faulty GPU")], tmp_path, off)
    _, resumes, _ = resumes_after_crash(sim)
    assert set(resumes) == {600}


# These two need the daemon's hold (CheckpointPolicy.save_on_failure_s in the engine): without it the
# engine swaps or cancels within one agent sample, before the survivors' save is written, and tears it.
def test_resubmit_a_covered_crash_resumes_from_the_step_in_progress(tmp_path):
    sim, result = run(Mode.SUPERVISOR, [fault("GPU HBM3 Memory")], tmp_path)
    step, resumes, _ = resumes_after_crash(sim)
    assert resumes and resumes[0] == step, (step, resumes)
    assert result.extra["survivor_saves_torn"] == 0


def test_in_allocation_a_covered_crash_resumes_from_the_step_in_progress(tmp_path):
    sim, result = run(Mode.IN_ALLOCATION, [fault("Faulty GPU")], tmp_path)
    step, resumes, _ = resumes_after_crash(sim)
    assert resumes and resumes[0] == step, (step, resumes)
    assert [k[2] for k in result.extra["step_attempts"]] == [0, 1]  # swapped in the same job
    assert result.extra["survivor_saves_torn"] == 0


# -- the plan and the daemon's grace -------------------------------------------------------------


def test_young_daly_uses_the_failures_that_still_lose_the_work_since_the_last_save():
    plain = make_plan(SimSettings(), "auto")
    saving = make_plan(SimSettings(trainer=TrainerSettings(survivor_save_s=30.0)), "auto")
    model = FailureModel()
    share = sum(c.count for c in TABLE5 if not covers(c.shows)) / sum(c.count for c in TABLE5)
    assert lost_work_mtbf_s(model, 16384) == pytest.approx(model.mtbf_s(16384) / share)
    # sqrt(419 / 150) = 1.67 times longer, in whole log lines (60 s): 540 s against 360 s
    assert saving.checkpoint_interval_s >= 1.5 * plain.checkpoint_interval_s
    said = dict(assumptions(saving))
    assert "save on failure" in said and "save on failure" not in dict(assumptions(plain))
    assert "Young/Daly" in said["save on failure"]


def test_the_run_spec_gives_the_survivors_a_grace_above_their_save():
    assert checkpoint_policy(SMALL, "sim://c/").save_on_failure_s == daemon_grace_s(SMALL) > SAVE_S
    off = replace(SMALL, trainer=replace(TRAINER, survivor_save_s=None))
    assert checkpoint_policy(off, "sim://c/").save_on_failure_s == 0.0


def test_the_command_takes_save_on_failure_and_says_so():
    args = ["simulate", "--gpus", "32", "--days", "0.05", "--spares", "2", "--baseline", "--json"]
    doc = json.loads(CliRunner().invoke(main, [*args, "--save-on-failure", "30"]).output)
    assert "30 s" in doc["assumptions"]["save on failure"]
    bad = CliRunner().invoke(main, [*args, "--save-on-failure", "-5"])
    assert bad.exit_code == 2 and "survivor_save_s" in bad.output
