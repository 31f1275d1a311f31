"""A step that dies with no node at fault (a software bug, an NCCL error, a data check) in an
in-allocation run: relaunched in place — the same nodes, the step's next generation, from the
newest verified checkpoint, one restart spent — instead of ending the job and queueing again.
A fast failure, a spent budget or a do-not-restart code keep today's paths."""

from dataclasses import replace

from test_in_allocation import A0, JOB, SPEC, of, run, snap

from supervisor.domain.actions import Cancel, ChangeNode, Defer, SetState, SwapStep
from supervisor.domain.alloc_step import AllocationStep, LauncherReport, StepGoal
from supervisor.domain.decide.in_allocation import swap_event
from supervisor.domain.decide.policy import Observation, Policy, decide
from supervisor.domain.records import Event, EventKind
from supervisor.domain.run import RunState

LONG = A0.started_at + 3600.0  # the step had trained an hour when it died
DIED = LauncherReport(7, 0, False, ("n1", "n2"), "n1", at=LONG, exit_code=1)


def died(report=DIED, goal=None, **kw):
    return run(AllocationStep(goal, report), **kw)


def test_a_step_that_died_with_no_faulty_node_is_relaunched_in_place_in_the_same_job():
    d = decide(died(), Observation(snap(LONG + 1)), Policy())
    (relaunch,) = of(d, SwapStep)
    assert (relaunch.job_id, relaunch.generation, relaunch.nodes) == (7, 1, ("n1", "n2"))
    assert relaunch.out == () and relaunch.into == () and relaunch.restart
    assert not of(d, Cancel) and not of(d, SetState)  # the job is kept
    (fault,) = [e for e in of(d, Event) if e.kind is EventKind.FAULT]
    assert "generation 0 exited with code 1" in fault.message and "no node" in fault.message
    assert fault.evidence["in_allocation"] == "step_died" and fault.evidence["exit_code"] == 1


def test_once_the_next_generation_is_asked_for_nothing_more_is():
    goal = StepGoal(7, 1, ("n1", "n2"), "relaunch", LONG + 1)
    d = decide(died(goal=goal), Observation(snap(LONG + 2)), Policy())  # the launcher has not polled yet
    assert not of(d, SwapStep) and not of(d, Cancel)


def test_a_relaunched_generation_that_dies_later_is_relaunched_again():
    goal = StepGoal(7, 1, ("n1", "n2"), "relaunch", LONG)
    report = replace(DIED, generation=1, at=LONG + 3600.0)
    d = decide(died(report, goal), Observation(snap(LONG + 3601)), Policy())
    assert [s.generation for s in of(d, SwapStep)] == [2]


def test_a_step_that_succeeded_is_left_to_end_the_job():
    d = decide(died(replace(DIED, exit_code=0)), Observation(snap(LONG + 1)), Policy())
    assert not of(d, SwapStep) and not of(d, Cancel)


def test_a_do_not_restart_code_is_not_relaunched():
    spec = replace(SPEC, do_not_restart_exit_codes=frozenset({93}))
    d = decide(died(replace(DIED, exit_code=93), spec=spec), Observation(snap(LONG + 1)), Policy())
    assert not of(d, SwapStep) and not of(d, Cancel)  # the launcher exits 93; the run fails as before


def test_with_agents_on_the_step_nodes_their_evidence_is_awaited_first():
    obs = Observation(snap(LONG + 1), agents=frozenset({"n1", "n2"}))
    d = decide(died(), obs, Policy(evidence_wait_s=12.0))
    assert not of(d, SwapStep) and d.recheck_at == LONG + 12.0
    later = decide(died(), replace(obs, snapshot=snap(LONG + 13)), Policy(evidence_wait_s=12.0))
    assert [s.nodes for s in of(later, SwapStep)] == [("n1", "n2")]


def test_a_node_found_faulty_meanwhile_is_swapped_out_rather_than_relaunched_upon():
    d = decide(died(), Observation(snap(LONG + 1, n2="NR"), dead={"n2": "probe: refused"}), Policy())
    (swap,) = of(d, SwapStep)
    assert swap.out == ("n2",) and swap.into == ("n3",)


def test_a_fast_failure_falls_back_to_the_paced_resubmission():
    quick = replace(DIED, at=A0.started_at + 30.0)
    d = decide(died(quick), Observation(snap(A0.started_at + 31)), Policy())
    assert not of(d, SwapStep) and [c.job_id for c in of(d, Cancel)] == [7]
    assert of(d, SetState)[0].state is RunState.RECOVERING
    (note,) = [e for e in of(d, Event) if "falling back" in e.message]
    assert "30 s after its launch" in note.message


def test_a_spent_restart_budget_falls_back_and_the_ordinary_path_gives_up():
    spec = replace(SPEC, max_restarts=2)
    d = decide(died(spec=spec, restarts_spent=2), Observation(snap(LONG + 1)), Policy())
    assert not of(d, SwapStep) and of(d, Cancel)
    assert "restart budget spent" in [e for e in of(d, Event) if "falling back" in e.message][0].message


def test_the_relaunch_logbook_line_says_same_nodes_and_no_spare():
    action = SwapStep("llm", 7, 1, ("n1", "n2"), (), (), "step generation 0 exited with code 1", restart=True)
    e = swap_event(run(), action, LONG + 1)
    assert "relaunched in job 7 on the same nodes" in e.message and "hot spare" not in e.message
    assert e.evidence["in_allocation"] == "swap" and e.evidence["into"] == [] and e.evidence["relaunch"]
    assert e.evidence["generation"] == 1 and JOB.job_id == 7


def test_the_store_keeps_when_the_step_was_first_heard_dead_while_the_launcher_repeats_it(tmp_path):
    """The launcher repeats its report every poll: the evidence wait and the fast-failure rule
    count from the first report of the death, not from the newest (which never runs out)."""
    from supervisor.adapters.sqlite import SqliteStore

    store = SqliteStore(tmp_path)
    store.add_run(SPEC, 1.0)
    alive = replace(DIED, alive=True, exit_code=None, at=100.0)
    store.launcher_reported("llm", alive)
    assert store.launcher_report("llm", 7).ended_at is None
    for at in (110.0, 111.0, 112.0):
        store.launcher_reported("llm", replace(DIED, at=at))
    heard = store.launcher_report("llm", 7)
    assert (heard.at, heard.ended_at) == (112.0, 110.0)
    store.launcher_reported("llm", replace(DIED, generation=1, alive=True, exit_code=None, at=113.0))
    store.launcher_reported("llm", replace(DIED, generation=1, at=120.0))
    assert store.launcher_report("llm", 7).ended_at == 120.0  # a new generation's death counts anew


def test_the_evidence_wait_runs_from_the_first_report_of_the_death():
    obs = Observation(snap(LONG + 13), agents=frozenset({"n1", "n2"}))
    repeated = replace(DIED, at=LONG + 12.5, ended_at=LONG)
    d = decide(died(repeated), obs, Policy(evidence_wait_s=12.0))
    assert [s.generation for s in of(d, SwapStep)] == [1]


def test_a_thousand_node_step_is_named_in_a_line_people_can_read():
    """A swap in a 2,048-node job named every node: a 16 KB logbook line per swap."""
    from supervisor.domain.observation import fmt_nodes

    nodes = tuple(f"n{i:04d}" for i in range(1, 2050) if i != 122)
    assert fmt_nodes(nodes) == "n[0001-0121,0123-2049] (2048 nodes)"
    assert fmt_nodes(("n2", "n1")) == "n2,n1" and fmt_nodes(()) == "(no nodes)"


HANG = {"reason": "no new step for 900 s after step 4100", "since_s": 900.0, "threshold_s": 300.0}
HEARING = AllocationStep(report=replace(DIED, alive=True, exit_code=None, at=LONG - 0.5))  # the launcher reports


def test_a_hang_with_no_node_singled_out_is_relaunched_in_place():
    d = decide(run(HEARING), Observation(snap(LONG), hangs={"llm": HANG}), Policy())
    (relaunch,) = of(d, SwapStep)
    assert relaunch.nodes == ("n1", "n2") and relaunch.out == () and relaunch.restart
    assert not of(d, Cancel)  # the job is kept
    (fault,) = [e for e in of(d, Event) if e.kind is EventKind.FAULT]
    assert "hang: no new step for 900 s" in fault.message and "relaunching it in place" in fault.message


def test_a_hang_soon_after_the_launch_falls_back_to_the_paced_resubmission():
    d = decide(run(), Observation(snap(A0.started_at + 100), hangs={"llm": HANG}), Policy())
    assert not of(d, SwapStep) and of(d, Cancel)
    assert "fast failure" in [e for e in of(d, Event) if "falling back" in e.message][0].message


def test_a_hang_that_names_a_node_swaps_it_out_for_a_hot_spare_without_draining_it():
    hang = {**HANG, "suspect_nodes": ["n2"], "suspects": "rank 1 stopped at step 4100"}
    d = decide(run(HEARING), Observation(snap(LONG), hangs={"llm": hang}), Policy())
    (swap,) = of(d, SwapStep)
    assert (swap.nodes, swap.out, swap.into, swap.restart) == (("n1", "n3"), ("n2",), ("n3",), True)
    assert [e.node for e in of(d, Defer)] == ["n2"] and not of(d, ChangeNode)  # kept out, not drained
    after = run(
        AllocationStep(StepGoal(7, 1, swap.nodes, swap.reason, LONG), HEARING.report), deferred={"n2": (LONG, "hang")}
    )
    later = decide(after, Observation(snap(LONG + 5)), Policy())
    assert not of(later, ChangeNode) and not of(later, SwapStep) and not of(later, Cancel)  # and stays undrained
    assert not of(d, Cancel)
    (fault,) = [e for e in of(d, Event) if e.kind is EventKind.FAULT]
    assert "rank 1 stopped at step 4100: n2 out, hot spare n3 in" in fault.message


def test_a_hang_that_names_more_nodes_than_there_are_spares_keeps_todays_path():
    hang = {**HANG, "suspect_nodes": ["n1", "n2"], "suspects": "ranks 0-1 stopped"}
    d = decide(run(HEARING), Observation(snap(LONG), hangs={"llm": hang}), Policy())
    assert not of(d, SwapStep) and of(d, Cancel)  # resubmitted without the suspects, as before
    assert not [e for e in of(d, Event) if "falling back" in e.message]
