"""In-allocation recovery's decisions on plain data (supervisor.domain.decide.in_allocation): a faulty
node of the step is swapped for a hot spare; without a spare, with the batch host dead or the
launcher silent, the run falls back to resubmission with the reason in the logbook."""

from dataclasses import replace

from supervisor.domain.actions import Cancel, ChangeNode, Exclude, SetState, SwapStep
from supervisor.domain.alloc_step import AllocationStep, LauncherReport, StepGoal
from supervisor.domain.cluster import ClusterSnapshot, JobInfo, JobState, NodeChange, NodeInfo, NodeState
from supervisor.domain.decide.policy import Observation, Policy, decide
from supervisor.domain.records import AttemptRecord, Event, EventKind, RunRecord
from supervisor.domain.run import RestartMode, RunState
from supervisor.testing.kit.specs import spec

SPEC = spec(script="/s.sh", restart_mode=RestartMode.IN_ALLOCATION, hot_spares=1)
A0 = AttemptRecord("llm", 0, 7, 0, 10.0, nodes=("n1", "n2", "n3"), started_at=20.0)
JOB = JobInfo(7, "llm", JobState.RUNNING, nodes=("n1", "n2", "n3"), partition="main", start_time=20.0)
HEARD = LauncherReport(7, 0, True, ("n1", "n2"), "n1", at=99.0)


def snap(now=100.0, job=JOB, **states):
    nodes = {}
    for i in range(1, 5):
        name, kind = f"n{i}", states.get(f"n{i}", "ALLOC")
        flags = (
            frozenset({"NOT_RESPONDING"}) if kind == "NR" else frozenset({"DRAIN"}) if kind == "OURS" else frozenset()
        )
        base = (
            NodeState.ALLOCATED
            if kind in ("ALLOC", "NR")
            else NodeState.DOWN
            if kind == "OURS"
            else NodeState.parse(kind)
        )
        reason = "slurm-supervisor: run llm: dead" if kind == "OURS" else ""
        nodes[name] = NodeInfo(name, base, flags, reason, ("main",))
    return ClusterSnapshot(now, {job.job_id: job}, nodes)


def run(step=AllocationStep(report=HEARD), **kw):
    return RunRecord(spec=kw.pop("spec", SPEC), state=kw.pop("state", RunState.RUNNING), attempt=A0, step=step, **kw)


def of(decision, cls):
    return [x for x in decision.records + decision.actions if isinstance(x, cls)]


def test_a_dead_run_node_is_swapped_for_the_hot_spare_in_the_same_job():
    d = decide(run(), Observation(snap(n2="NR"), dead={"n2": "probe: connection refused"}), Policy())
    (swap,) = of(d, SwapStep)
    assert (swap.job_id, swap.generation, swap.nodes, swap.out, swap.into) == (7, 1, ("n1", "n3"), ("n2",), ("n3",))
    assert [(c.node, c.change) for c in of(d, ChangeNode)] == [("n2", NodeChange.DOWN), ("n2", NodeChange.DRAIN)]
    assert [e.node for e in of(d, Exclude)] == ["n2"]
    assert not of(d, Cancel) and not of(d, SetState)  # the job is kept, no restart spent
    assert any(e.kind is EventKind.FAULT and "n2" in e.message for e in of(d, Event))


def test_once_the_goal_names_the_spare_nothing_more_is_asked():
    goal = StepGoal(7, 1, ("n1", "n3"), "n2 died", 100.0)
    job = replace(JOB, nodes=("n1", "n3"))  # Slurm removed n2 from the allocation
    d = decide(
        run(AllocationStep(goal, HEARD), excluded={"n2": "dead"}), Observation(snap(101.0, job, n2="OURS")), Policy()
    )
    assert not of(d, SwapStep) and not of(d, Cancel) and not of(d, ChangeNode)


def test_a_swapped_out_node_a_crashed_daemon_did_not_drain_is_drained_now():
    goal = StepGoal(7, 1, ("n1", "n3"), "n2 died", 100.0)  # the goal written, the DOWN/DRAIN never sent
    d = decide(run(AllocationStep(goal, HEARD), excluded={"n2": "dead"}), Observation(snap(101.0, n2="NR")), Policy())
    assert [(c.node, c.change) for c in of(d, ChangeNode)] == [("n2", NodeChange.DOWN), ("n2", NodeChange.DRAIN)]
    assert not of(d, SwapStep) and not of(d, Cancel)


def test_a_second_fault_swaps_again_with_the_next_generation_only_when_a_spare_is_left():
    goal = StepGoal(7, 1, ("n1", "n3"), "n2 died", 100.0)
    job = replace(JOB, nodes=("n1", "n3"))
    d = decide(
        run(AllocationStep(goal, HEARD), excluded={"n2": "dead"}),
        Observation(snap(101.0, job, n2="OURS", n3="NR")),
        Policy(),
    )
    assert not of(d, SwapStep)
    (fallback,) = [e for e in of(d, Event) if "falling back" in e.message]
    assert "no hot spare left for n3" in fallback.message
    assert of(d, Cancel) and of(d, SetState)[0].state is RunState.RECOVERING


def test_the_batch_host_dying_falls_back_to_resubmission():
    d = decide(run(), Observation(snap(n1="NR")), Policy())
    (fallback,) = [e for e in of(d, Event) if "falling back" in e.message]
    assert "batch host n1" in fallback.message
    assert of(d, Cancel) and not of(d, SwapStep)


def test_before_the_launcher_reports_the_batch_host_is_the_allocations_first_node():
    d = decide(run(AllocationStep()), Observation(snap(n1="NR")), Policy())
    assert "batch host n1" in [e for e in of(d, Event) if "falling back" in e.message][0].message


def test_a_launcher_silent_beyond_its_timeout_falls_back():
    quiet = AllocationStep(report=replace(HEARD, at=100.0 - SPEC.launcher_timeout_s - 1))
    d = decide(run(quiet), Observation(snap()), Policy())
    (fallback,) = [e for e in of(d, Event) if "falling back" in e.message]
    assert "launcher in job 7 has been silent" in fallback.message
    assert [c.job_id for c in of(d, Cancel)] == [7]


def test_silence_counts_only_while_the_daemon_listened():
    """A daemon stopped for longer than the timeout heard nothing: its launcher was not silent."""
    old = AllocationStep(report=replace(HEARD, at=10.0), listening_since=99.5)
    assert not of(decide(run(old), Observation(snap()), Policy()), Cancel)


def test_a_launcher_that_never_reported_is_given_its_timeout_from_the_job_start():
    assert not of(decide(run(AllocationStep()), Observation(snap(60.0)), Policy()), Cancel)
    late = decide(run(AllocationStep()), Observation(snap(20.0 + SPEC.launcher_timeout_s + 1)), Policy())
    assert "has not reported" in [e for e in of(late, Event) if "falling back" in e.message][0].message


def test_the_relaunched_generation_is_one_logbook_line_naming_the_checkpoint():
    goal = StepGoal(7, 1, ("n1", "n3"), "n2 died", 100.0)
    report = LauncherReport(7, 1, True, ("n1", "n3"), "n1", at=101.5)
    job = replace(JOB, nodes=("n1", "n3"))
    d = decide(
        run(AllocationStep(goal, report), excluded={"n2": "dead"}), Observation(snap(102.0, job, n2="OURS")), Policy()
    )
    (resumed,) = [e for e in of(d, Event) if e.evidence.get("in_allocation") == "resumed"]
    assert "generation 1 running again on n1,n3 in the same job 7" in resumed.message
    assert resumed.key == "llm:0:note:resumed-1" and resumed.evidence["swap_s"] == 1.5


def test_a_faulty_hot_spare_is_contained_without_touching_the_step():
    d = decide(run(), Observation(snap(n3="NR")), Policy())
    assert [e.node for e in of(d, Exclude)] == ["n3"] and not of(d, SwapStep) and not of(d, Cancel)


def test_resubmit_mode_is_unchanged():
    spec = replace(SPEC, restart_mode=RestartMode.RESUBMIT)
    d = decide(run(spec=spec), Observation(snap(n2="NR")), Policy())
    assert of(d, Cancel) and not of(d, SwapStep)
