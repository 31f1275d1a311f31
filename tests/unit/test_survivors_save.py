"""Save on failure ([checkpoints] save_on_failure_s): a step or job that still runs when a node of
it faults (a fatal finding: the node's ranks died, the others did not) is left that long, from the
fault's onset, to save and exit by itself; then it is stopped as before. Faults whose peers hang (a
dead, DOWN or silent node) are not waited for."""

from dataclasses import replace

from supervisor.domain.actions import Cancel, SwapStep
from supervisor.domain.alloc_step import AllocationStep, LauncherReport
from supervisor.domain.cluster import ClusterSnapshot, JobInfo, JobState, NodeInfo, NodeState
from supervisor.domain.decide.policy import Observation, Policy, decide
from supervisor.domain.health.findings import NodeFinding, Severity
from supervisor.domain.records import AttemptRecord, Event, RunRecord
from supervisor.domain.run import CheckpointPolicy, RestartMode, RunState
from supervisor.testing.kit.specs import spec

SAVES = CheckpointPolicy(root="/ckpt", save_on_failure_s=120.0)
SPEC = spec(script="/s.sh", restart_mode=RestartMode.IN_ALLOCATION, hot_spares=1, checkpoints=SAVES)
A0 = AttemptRecord("llm", 0, 7, 0, 10.0, nodes=("n1", "n2", "n3"), started_at=20.0)
JOB = JobInfo(7, "llm", JobState.RUNNING, nodes=("n1", "n2", "n3"), partition="main", start_time=20.0)
ALIVE = LauncherReport(7, 0, True, ("n1", "n2"), "n1", at=99.0)
XID = NodeFinding("n2", Severity.FATAL, "XID 79: GPU fallen off the bus (gpu 3)", "xid-79@1", at=100.0)


def snap(now, n2=NodeState.ALLOCATED, flags=frozenset()):
    nodes = {f"n{i}": NodeInfo(f"n{i}", NodeState.ALLOCATED, frozenset(), "", ("main",)) for i in range(1, 5)}
    nodes["n2"] = NodeInfo("n2", n2, flags, "", ("main",))
    return ClusterSnapshot(now, {7: JOB}, nodes)


def run(spec=SPEC, report=ALIVE):
    return RunRecord(spec=spec, state=RunState.RUNNING, attempt=A0, step=AllocationStep(report=report))


def of(decision, cls):
    return [x for x in decision.records + decision.actions if isinstance(x, cls)]


def test_a_running_step_is_left_to_its_survivors_save_until_the_grace_from_the_fault_runs_out():
    held = decide(run(), Observation(snap(110.0), findings={"n2": XID}), Policy())
    assert not of(held, SwapStep) and not of(held, Cancel)
    assert held.recheck_at == 220.0  # the finding's time + save_on_failure_s: decide again then
    (note,) = of(held, Event)
    assert "n2" in note.message and "120 s" in note.message and "save" in note.message
    still = replace(ALIVE, at=219.0)  # the launcher kept reporting the step alive
    late = decide(run(report=still), Observation(snap(220.0), findings={"n2": XID}), Policy())
    assert of(late, SwapStep)


def test_a_step_that_ended_after_its_survivors_saved_is_swapped_at_once():
    ended = replace(ALIVE, alive=False, exit_code=1, at=130.0, ended_at=130.0)
    d = decide(run(report=ended), Observation(snap(131.0), findings={"n2": XID}), Policy())
    (swap,) = of(d, SwapStep)
    assert swap.out == ("n2",)


def test_without_save_on_failure_the_faulty_node_is_swapped_at_once():
    plain = replace(SPEC, checkpoints=replace(SAVES, save_on_failure_s=0.0))
    assert of(decide(run(plain), Observation(snap(110.0), findings={"n2": XID}), Policy()), SwapStep)


def test_a_dead_or_down_node_is_not_waited_for_its_peers_hang_and_save_nothing():
    dead = Observation(snap(110.0), findings={"n2": XID}, dead={"n2": "probe: no route"}, dead_since={"n2": 100.0})
    assert of(decide(run(), dead, Policy()), SwapStep)
    down = Observation(snap(110.0, NodeState.DOWN), findings={"n2": XID})
    assert of(decide(run(), down, Policy()), SwapStep)


def test_a_resubmitting_run_does_not_cancel_a_running_job_while_its_survivors_save():
    spec = replace(SPEC, restart_mode=RestartMode.RESUBMIT, hot_spares=0)
    job = replace(JOB, nodes=("n1", "n2"))
    a = replace(A0, nodes=("n1", "n2"))
    r = RunRecord(spec=spec, state=RunState.RUNNING, attempt=a)
    obs = lambda now: Observation(replace(snap(now), jobs={7: job}), findings={"n2": XID})  # noqa: E731
    held = decide(r, obs(110.0), Policy())
    assert not of(held, Cancel) and held.recheck_at == 220.0
    assert of(decide(r, obs(220.0), Policy()), Cancel)
