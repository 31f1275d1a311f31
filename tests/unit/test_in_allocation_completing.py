"""An in-allocation job that completes after a swap: the node swapped out is dead (DOWN and drained
by us), but it left the step and Slurm's allocation with the swap. Seen while Slurm completes the
job, it was taken for a node the job was killed on — the run, trained to its end, was set
recovering and resubmitted (tests/e2e/test_torch_peers_slurm.py under load)."""

from dataclasses import replace

from test_in_allocation import A0, JOB, run, snap

from supervisor.domain.actions import SetState
from supervisor.domain.alloc_step import AllocationStep, LauncherReport, StepGoal
from supervisor.domain.cluster import JobState
from supervisor.domain.decide.policy import Observation, Policy, decide
from supervisor.domain.run import RunState

GOAL = StepGoal(7, 1, ("n1", "n3"), "n2 died", 100.0)  # n2 out, the hot spare n3 in
DONE = LauncherReport(7, 1, False, ("n1", "n3"), "n1", at=200.0, exit_code=0)


def test_a_job_completing_after_a_swap_is_not_taken_for_one_killed_on_the_node_swapped_out():
    completing = replace(JOB, state=JobState.COMPLETING, nodes=("n1", "n3"), exit_code=0)
    record = run(AllocationStep(GOAL, DONE))
    d = decide(record, Observation(snap(201.0, completing, n2="OURS")), Policy())
    assert not [s for s in d.records if isinstance(s, SetState) and s.state is RunState.RECOVERING], d
    completed = replace(completing, state=JobState.COMPLETED)
    d = decide(record, Observation(snap(202.0, completed, n2="OURS")), Policy())
    assert [s.state for s in d.records if isinstance(s, SetState)] == [RunState.COMPLETED], d
    assert A0.nodes == ("n1", "n2", "n3")  # the attempt still lists the node it started on


def test_a_job_completing_with_a_step_node_dead_is_still_the_fault():
    completing = replace(JOB, state=JobState.COMPLETING, nodes=("n1", "n3"))
    d = decide(run(AllocationStep(GOAL, DONE)), Observation(snap(201.0, completing, n3="OURS")), Policy())
    assert [s.state for s in d.records if isinstance(s, SetState)] == [RunState.RECOVERING]
