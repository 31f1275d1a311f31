"""Issue 31, item 7: the simulator knows time limits, chains of jobs, the queue and preemption
(supervisor/sim/training/chain.py, time_limits.py). A 4-node run with no failures on a partition with a
2 h limit: under the supervisor each job saves on the signal and is continued, its pre-queued
successor running within a poll of its end; the hand-made chain (the job script saves on
--signal and submits itself again) waits in the queue each time."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
from click.testing import CliRunner

from supervisor.adapters.sqlite import SqliteStore
from supervisor.cli import main
from supervisor.sim.faults.failures import TABLE5, Failure
from supervisor.sim.runner import RUN, Simulation
from supervisor.sim.training.chain import ChainSettings, signal_lead
from supervisor.sim.training.settings import Mode, SimSettings
from supervisor.sim.training.time_limits import chain_summary
from supervisor.sim.training.trainer import TrainerSettings

LIMIT_S = 2 * 3600.0
WAIT_S = 600.0
TRAINER = TrainerSettings(checkpoint_steps=300)  # a save every 30 min of training
CHAIN = ChainSettings(max_job_s=LIMIT_S, prequeue_s=1800, queue_wait_median_s=WAIT_S, queue_wait_sigma=0.5)
SMALL = SimSettings(gpus=32, gpus_per_node=8, spares=1, baseline_spares=1, days=0.5, trainer=TRAINER, chain=CHAIN)


def simulate(mode: Mode, tmp_path, settings: SimSettings = SMALL, failures: list[Failure] | None = None):
    sim = Simulation(settings, mode, tmp_path / mode.value if mode.supervised else None)
    return sim, sim.run(failures or [])


def logbook(sim: Simulation) -> list[tuple[str, str]]:
    store = SqliteStore(sim.state_dir)
    try:
        return [(e.kind.value, e.message) for e in store.events(RUN)]
    finally:
        store.close()


def restarts_spent(sim: Simulation) -> int:
    store = SqliteStore(sim.state_dir)
    try:
        (run,) = store.runs()
        return run.restarts_spent
    finally:
        store.close()


def jobs(sim: Simulation):
    return sorted(sim.world.cluster._archive.values(), key=lambda j: j.job_id)


def test_the_supervisor_continues_each_job_from_its_signal_save_and_its_successor_runs_at_once(tmp_path):
    sim, result = simulate(Mode.SUPERVISOR, tmp_path)
    chain = result.extra["chain"]
    assert chain["planned_ends"] >= 5 and chain["timeouts"] == 0, chain  # 12 h of 2 h jobs
    chain_jobs = jobs(sim)
    for job, successor in zip(chain_jobs, chain_jobs[1:]):  # released once the end is judged, or its wait is over
        queue_left = max(0.0, successor.eligible_at - job.end_time)
        assert successor.start_time - job.end_time <= queue_left + 2 * SMALL.poll_interval_s, job.job_id
    assert sorted(chain["gaps_s"])[len(chain["gaps_s"]) // 2] <= 2 * SMALL.poll_interval_s, chain
    assert restarts_spent(sim) == 0
    kinds = [k for k, _ in logbook(sim)]
    assert kinds.count("continued") == chain["planned_ends"] and "fault" not in kinds, kinds
    for earlier, later in zip(sim.world.attempts(), sim.world.attempts()[1:]):
        assert later.resume_step == earlier.step  # each job resumes from the save its predecessor made at the signal
        assert later.started_at >= earlier.ended_at  # never two incarnations at once


def test_the_successor_is_queued_prequeue_s_before_the_limit_and_waits_in_the_queue_meanwhile(tmp_path):
    # Fails without the simulator's tick at a decision's own time (Engine.recheck_at): the
    # pre-queue then waited for the next event, the signal 600 s before the limit, and the
    # successor's queue wait no longer overlapped its predecessor.
    sim, _ = simulate(Mode.SUPERVISOR, tmp_path)
    chain_jobs = jobs(sim)
    for job, successor in zip(chain_jobs, chain_jobs[1:]):
        assert job.start_time is not None and successor.start_time is not None
        due = job.start_time + LIMIT_S - CHAIN.prequeue_s
        assert due <= successor.submit_time <= due + SMALL.poll_interval_s, (job.job_id, successor.submit_time - due)
        assert successor.queued_at == successor.submit_time  # its wait ran while its predecessor trained


def test_the_handmade_chain_resubmits_at_the_end_and_waits_in_the_queue_each_time(tmp_path):
    sup_sim, sup = simulate(Mode.SUPERVISOR, tmp_path)
    sim, hand = simulate(Mode.BASELINE, tmp_path)
    chain = hand.extra["chain"]
    assert chain["planned_ends"] >= 4 and chain["timeouts"] == 0, chain
    waits = [j.queue_wait for j in jobs(sim)[1:]]
    assert chain["gaps_s"] == pytest.approx(sorted(waits)), (chain, waits)  # the whole wait, each time
    assert hand.ettr < sup.ettr


def test_without_accrue_always_a_held_successor_waits_from_its_release(tmp_path):
    settings = replace(SMALL, chain=replace(CHAIN, accrue_always=False))
    sim, result = simulate(Mode.SUPERVISOR, tmp_path, settings)
    gaps = result.extra["chain"]["gaps_s"]
    assert min(gaps) >= 0.5 * WAIT_S * 0.3 and sum(gaps) / len(gaps) > WAIT_S / 2, gaps  # no overlap gained
    assert restarts_spent(sim) == 0  # still continuations


@pytest.mark.parametrize("grace_s, continued", [(300.0, True), (1.0, False)])
def test_a_preemption_with_grace_for_a_save_is_a_continuation_and_without_it_a_fault(tmp_path, grace_s, continued):
    chain = replace(CHAIN, max_job_s=None, preempt_per_day=6.0, grace_s=grace_s)
    sim, result = simulate(Mode.SUPERVISOR, tmp_path, replace(SMALL, chain=chain))
    report = result.extra["chain"]
    assert report["preemptions"] >= 1, report
    kinds = [(k, m) for k, m in logbook(sim)]
    preempted = [m for k, m in kinds if "preempted" in m and k in ("continued", "fault")]
    assert preempted, kinds
    if continued:
        assert report["preempted_unsaved"] == 0 and restarts_spent(sim) == 0
        assert all(k != "fault" for k, _ in kinds)
    else:
        assert report["preempted_unsaved"] == report["preemptions"]
        assert any(k == "fault" for k, _ in kinds)


def test_a_job_that_cannot_save_before_its_limit_times_out_as_a_fault(tmp_path):
    # A hang 100 min into the first job, 20 min before its limit: no step and no save on the signal;
    # the hang detector (its 30 min cap) and the watchdog are slower than the limit.
    hang = next(c for c in TABLE5 if c.shows.value == "hang")
    chain = replace(CHAIN, queue_wait_median_s=0.0)  # the first job starts at once: its limit 2 h in
    settings = replace(SMALL, nccl_timeout_s=3 * 3600.0, hang_multiple=1000.0, days=0.25, chain=chain)
    sim, result = simulate(Mode.SUPERVISOR, tmp_path, settings, [Failure(6000.0, hang, 0.5, 0.5, 0.5)])
    assert result.extra["chain"]["timeouts"] == 1, result.extra
    kinds = [k for k, _ in logbook(sim)]
    assert "fault" in kinds and kinds.index("fault") < kinds.index("continued"), kinds


def test_the_signal_lead_is_read_from_the_job_s_last_signal_option():
    assert signal_lead(["--signal=B:USR1@600"]) == 600
    assert signal_lead(["--signal=USR2@90", "--time=60", "--signal=B:USR1@120"]) == 120
    assert signal_lead(["--time=60"]) is None


def test_chain_settings_name_what_is_wrong():
    with pytest.raises(ValueError, match="max_job_s"):
        ChainSettings(max_job_s=600.0)
    with pytest.raises(ValueError, match="prequeue_s"):
        ChainSettings(max_job_s=3600.0, prequeue_s=3600)


def test_chain_summary_takes_the_gap_quantiles_over_every_seed():
    doc = chain_summary([{"planned_ends": 2, "gaps_s": [1.0, 3.0]}, {"planned_ends": 4, "gaps_s": [2.0]}])
    assert doc["planned_ends"] == 3 and doc["gap_s_p50"] == 2.0


def test_simulate_takes_a_partition_time_limit_and_prints_the_chain(tmp_path):
    args = ["simulate", "--gpus", "32", "--spares", "1", "--days", "0.5", "--max-job-hours", "2"]
    args += ["--queue-wait-minutes", "10", "--prequeue-minutes", "30", "--compare", "--no-progress"]
    out = CliRunner().invoke(main, [*args, "--state-dir", str(tmp_path), "--json"])
    assert out.exit_code == 0, out.output
    doc = json.loads(out.output)
    assert doc["figures"]["supervisor"]["chain"]["planned_ends"] >= 5
    assert doc["figures"]["baseline"]["chain"]["gap_s_p50"] > doc["figures"]["supervisor"]["chain"]["gap_s_p50"]
    assert "time limit 2 h" in doc["assumptions"]["chain of jobs"]
    bad = CliRunner().invoke(main, [*args[:-1], "--max-job-hours", "0.1"])
    assert bad.exit_code == 2 and "max_job_s" in bad.output
