"""In-allocation recovery on the simulator: the real engine swaps a hot spare into the step of
the same job (``--no-kill``), and falls back to resubmission once the hot spares are spent."""

from __future__ import annotations

import json
from dataclasses import replace

from supervisor.adapters.sqlite import SqliteStore
from supervisor.domain.cluster import JobState, NodeChange, SubmitRequest
from supervisor.domain.records import EventKind
from supervisor.sim.clock import VirtualClock
from supervisor.sim.faults.failures import TABLE5, Failure
from supervisor.sim.runner import Simulation
from supervisor.sim.slurm.cluster import SimCluster
from supervisor.sim.training.settings import Mode, SimSettings

CATS = {c.component: c for c in TABLE5}
# 4 nodes for the step, 1 hot spare in the job, 2 idle nodes in the partition for a resubmission.
SMALL = SimSettings(gpus=32, gpus_per_node=8, spares=3, hot_spares=1, days=0.4, seed=5)


def strike(at: float, name: str, u_node: float) -> Failure:
    """A failure on the step's node at ``u_node`` of its node list (0: the batch host)."""
    return Failure(at, CATS[name], u_node, 0.5, 0.5)


def request(nodes: int, *extra: str) -> SubmitRequest:
    return SubmitRequest("r", "/s", "r", "main", nodes, "c", extra_args=extra)


def test_a_no_kill_job_loses_a_down_node_and_keeps_running_and_keeps_a_drained_one():
    cluster = SimCluster(VirtualClock(), 4)
    job = cluster.submit(request(3, "--no-kill"))
    cluster.set_node_state("n002", NodeChange.DOWN, "dead")
    info = cluster.job_info(job)
    assert info.state is JobState.RUNNING and info.nodes == ("n001", "n003")
    cluster.health_check_drain("n003", "NHC: GPU check failed")
    assert cluster.job_info(job).nodes == ("n001", "n003")  # drained but alive: stays in the allocation
    plain = SimCluster(VirtualClock(), 4)
    other = plain.submit(request(3))
    plain.set_node_state("n002", NodeChange.DOWN, "dead")
    assert plain.job_info(other).state is JobState.NODE_FAIL  # without --no-kill the job ends


def test_a_crashed_node_of_a_no_kill_job_leaves_it_after_slurmd_timeout():
    clock = VirtualClock()
    cluster = SimCluster(clock, 4, slurmd_timeout=10.0, down_after=20.0)
    job = cluster.submit(request(3, "-k"))
    cluster.crash_node("n003")
    clock.advance(21.0)
    info = cluster.job_info(job)
    assert info.state is JobState.RUNNING and info.nodes == ("n001", "n002")


def test_a_node_crash_is_swapped_in_the_same_job_and_spent_spares_fall_back_to_resubmission(tmp_path):
    faults = [strike(2 * 3600.0 + 3.3, "Faulty GPU", 0.5), strike(6 * 3600.0 + 7.7, "Faulty GPU", 0.3)]
    result = Simulation(SMALL, Mode.IN_ALLOCATION, tmp_path / "ia").run(faults)
    store = SqliteStore(tmp_path / "ia")
    try:
        events = store.events(result.run)
        sizes = [len(a.nodes) for a in store.attempts(result.run)]
    finally:
        store.close()
    first_job = min(e.job_id for e in events if e.job_id is not None)
    kinds = [_kind(e) for e in events if e.job_id == first_job and _kind(e)]
    assert kinds[:3] == ["fault", "swap", "resumed"], kinds
    assert "no hot spare left" in " ".join(e.message for e in events if e.kind is EventKind.FAULT)
    jobs = {e.job_id for e in events if e.job_id is not None}
    assert len(jobs) == 2  # one swap in the first job, then one resubmission
    assert sizes == [5, 5]  # the resubmission holds nodes + hot_spares again: the spare is replenished
    swap_attempt = result.extra["step_attempts"]
    assert swap_attempt == [(first_job, 0, 0), (first_job, 0, 1), (max(jobs), 0, 0)]
    assert result.interruptions == 2 and len(result.recover_times()) == 2
    swap_s, resubmit_s = result.recover_times()
    t = SMALL.trainer
    assert swap_s < SMALL.poll_interval_s + SMALL.step_relaunch_s + t.restore_s + 15.0
    assert resubmit_s > t.startup_s + t.restore_s  # a new job pays the start-up again
    resubmitted = Simulation(SMALL, Mode.SUPERVISOR, tmp_path / "rs").run(faults)
    assert swap_s < resubmitted.recover_times()[0] - 40.0  # no job start-up: ~50 s sooner
    assert result.ettr >= resubmitted.ettr


def test_in_allocation_pool_holds_the_hot_spares_in_the_job():
    assert SMALL.pool(Mode.IN_ALLOCATION) == SMALL.nodes_per_job + 3
    assert replace(SMALL, spares=0).pool(Mode.IN_ALLOCATION) == SMALL.nodes_per_job + 1


def _kind(event) -> str | None:
    phase = (event.evidence or {}).get("in_allocation")
    if event.kind is EventKind.FAULT and phase is None:
        return "fault"
    return phase if phase in ("swap", "resumed") else None


def test_a_fault_on_the_batch_host_falls_back_at_once(tmp_path):
    result = Simulation(SMALL, Mode.IN_ALLOCATION, tmp_path).run([strike(2 * 3600.0 + 3.3, "Faulty GPU", 0.0)])
    store = SqliteStore(tmp_path)
    try:
        faults = [e.message for e in store.events(result.run) if e.kind is EventKind.FAULT]
    finally:
        store.close()
    assert "the batch host n001 (where the launcher runs) is faulty" in faults[0]
    assert [k[2] for k in result.extra["step_attempts"]] == [0, 0]  # a new job, no swap


def test_simulate_command_runs_the_demo_in_allocation(tmp_path):
    from click.testing import CliRunner

    from supervisor.cli import main

    out = CliRunner().invoke(
        main, ["simulate", "--demo", "--mode", "in-allocation", "--json", "--no-logbook", "--state-dir", str(tmp_path)]
    )
    assert out.exit_code == 0, out.output
    figures = json.loads(out.output.strip().splitlines()[-1])["figures"]
    assert set(figures) == {"in-allocation"} and figures["in-allocation"]["interruptions"] == 4


def test_deciding_for_a_2048_node_allocation_costs_about_what_resubmission_mode_costs(tmp_path):
    """decide_in_allocation on 2,064 nodes: set lookups, not a scan of the step per node (was
    ~90 ms a tick, O(nodes²), and made a 54-day simulation take 10+ minutes)."""
    big = SimSettings(days=0.25, seed=3)
    alloc = Simulation(big, Mode.IN_ALLOCATION, tmp_path / "ia").run([])
    resubmit = Simulation(big, Mode.SUPERVISOR, tmp_path / "rs").run([])
    assert alloc.cpu_s / alloc.ticks < 2.0 * resubmit.cpu_s / resubmit.ticks


def test_a_dead_host_leaves_the_allocation_and_the_step_runs_on_a_spare_in_the_same_job(tmp_path):
    result = Simulation(SMALL, Mode.IN_ALLOCATION, tmp_path).run([strike(3 * 3600.0 + 1.1, "Host Maintenance", 0.6)])
    assert result.extra["step_attempts"] == [(1000, 0, 0), (1000, 0, 1)]
    (recover,) = result.recover_times()
    assert recover < SMALL.poll_interval_s + SMALL.probe_confirm_s + 11.0 + SMALL.trainer.restore_s + 10.0
