"""``decide()`` branch by branch on plain data (policy, lifecycle, faults): the blast-radius cap at a
checkpoint boundary, a node found bad after the job ended, a prolog failure at launch, a job gone
while recovering, awaited evidence, idempotent exclusions, recorded start times, refusals,
storms, fences and returned nodes."""

from dataclasses import replace

from supervisor.domain.actions import (
    AttemptEnded,
    AttemptStarted,
    Cancel,
    ChangeNode,
    Defer,
    Exclude,
    Fence,
    Release,
    SetExcluded,
    SetState,
    Submit,
    Unexclude,
)
from supervisor.domain.cluster import ClusterSnapshot, JobHold, JobInfo, JobState, NodeChange, NodeInfo, NodeState
from supervisor.domain.decide.policy import Observation, Policy, decide
from supervisor.domain.health.findings import NodeFinding, Severity
from supervisor.domain.health.quarantine import Fault
from supervisor.domain.observation import Forgotten
from supervisor.domain.records import AttemptRecord, Event, EventKind, NodeVerdict, RunRecord, Verdict
from supervisor.domain.run import RestartMode, RunState
from supervisor.testing.kit.specs import spec

SPEC = spec(script="/s.sh", max_restarts=3)
A0 = AttemptRecord("llm", 0, 7, 0, 10.0, nodes=("n1", "n2"), started_at=20.0)
JOB = JobInfo(7, "llm", JobState.RUNNING, nodes=("n1", "n2"), partition="main")
OURS = "slurm-supervisor: run llm: dead"


def node(name, state=NodeState.IDLE, flags=(), reason="", **kw):
    return NodeInfo(name, state, frozenset(flags), reason, ("main",), **kw)


def snap(jobs=(), now=100.0, **changed):
    nodes = {f"n{i}": node(f"n{i}") for i in range(1, 5)}
    nodes.update(changed)
    return ClusterSnapshot(now, {j.job_id: j for j in jobs}, nodes)


def run(state=RunState.RUNNING, attempt=A0, **kw):
    return RunRecord(spec=kw.pop("spec", SPEC), state=state, attempt=attempt, **kw)


def of(decision, cls):
    return [x for x in decision.records + decision.actions if isinstance(x, cls)]


def states(decision):
    return [s.state for s in of(decision, SetState)]


def events(decision, kind):
    return [e for e in of(decision, Event) if e.kind is kind]


# ---------------------------------------------------------------- checkpoint boundary (faults)


def degraded_run(**kw):
    return run(deferred={"n1": (30.0, "throttling"), "n2": (40.0, "row remap pending")}, **kw)


def boundary_obs(ckpt=50.0, **nodes):
    return Observation(snap([JOB], **nodes), checkpoint_at={"llm": ckpt})


def test_boundary_drains_only_as_many_degraded_nodes_as_the_blast_radius_allows():
    d = decide(degraded_run(), boundary_obs(), Policy(drains_left=1))
    assert of(d, ChangeNode) == [ChangeNode("llm", "n1", NodeChange.DRAIN, "slurm-supervisor: run llm: throttling")]
    assert of(d, Cancel) == [Cancel("llm", 7, "checkpoint boundary: dropping degraded n1,n2")]
    assert states(d) == [RunState.RECOVERING]
    faults = of(d, Fault)
    assert [(f.node, f.source, f.reason, f.at) for f in faults] == [
        ("n1", "degraded", "throttling", 100.0),
        ("n2", "degraded", "row remap pending", 100.0),
    ]
    (fault,) = events(d, EventKind.FAULT)
    assert fault.evidence == {
        "nodes": {"n1": "throttling", "n2": "row remap pending"},
        "checkpoint_at": 50.0,
        "planned": True,
    }
    assert [f.key for f in faults] == [f"{fault.key}:n1", f"{fault.key}:n2"]
    both = decide(degraded_run(), boundary_obs(), Policy(drains_left=2))
    assert [c.node for c in of(both, ChangeNode)] == ["n1", "n2"]
    assert [c.node for c in of(decide(degraded_run(), boundary_obs(), Policy(drains_left=3)), ChangeNode)] == [
        "n1",
        "n2",
    ]
    assert of(decide(degraded_run(), boundary_obs(), Policy(drains_left=0)), ChangeNode) == []


def test_boundary_needs_a_checkpoint_newer_than_the_start_and_every_finding():
    assert decide(degraded_run(), boundary_obs(ckpt=40.0), Policy()).actions == ()  # not newer than n2's finding
    assert decide(degraded_run(), boundary_obs(ckpt=40.5), Policy()).actions != ()
    late_start = degraded_run(attempt=replace(A0, started_at=60.0))
    assert decide(late_start, boundary_obs(ckpt=60.0), Policy()).actions == ()
    assert decide(degraded_run(), Observation(snap([JOB])), Policy()).actions == ()  # no checkpoint at all
    assert decide(run(), boundary_obs(), Policy()).actions == ()  # nothing degraded


def test_boundary_without_node_rights_or_on_a_node_already_ours_only_restarts():
    d = decide(degraded_run(), boundary_obs(), Policy(may_change_nodes=False))
    assert of(d, ChangeNode) == [] and of(d, Cancel)
    ours = node("n1", NodeState.ALLOCATED, ("DRAIN",), "slurm-supervisor: run llm: throttling")
    d = decide(degraded_run(), boundary_obs(n1=ours), Policy(drains_left=1))
    assert [c.node for c in of(d, ChangeNode)] == ["n2"]


def test_a_degraded_finding_is_deferred_once_with_its_evidence():
    found = NodeFinding("n2", Severity.DEGRADED, "GPU throttling", "clock-slow@1", 90.0, evidence={"clock": 900})
    d = decide(run(), Observation(snap([JOB]), findings={"n2": found}), Policy())
    assert of(d, Defer) == [Defer("llm", "n2", "GPU throttling")]
    (verdict,) = of(d, NodeVerdict)
    assert (verdict.verdict, verdict.action) == (Verdict.SUSPECT, "deferred")
    assert verdict.evidence == {"node": "n2", "rule": "clock-slow@1", "source": "agent", "clock": 900}
    assert d.actions == ()
    again = decide(
        run(deferred={"n2": (90.0, "GPU throttling")}), Observation(snap([JOB]), findings={"n2": found}), Policy()
    )
    assert of(again, Defer) == []
    watch = replace(found, severity=Severity.WATCH)
    assert decide(run(), Observation(snap([JOB]), findings={"n2": watch}), Policy()).records == ()


# ---------------------------------------------------------------- a running job


def test_start_records_slurms_start_time_else_the_ticks():
    fresh = replace(A0, started_at=None)
    started = replace(JOB, start_time=55.0)
    d = decide(run(RunState.QUEUED, fresh), Observation(snap([started])), Policy())
    assert of(d, AttemptStarted) == [AttemptStarted("llm", 0, ("n1", "n2"), 55.0)]
    assert states(d) == [RunState.RUNNING]
    d = decide(run(RunState.QUEUED, fresh), Observation(snap([JOB])), Policy())
    assert of(d, AttemptStarted)[0].at == 100.0
    d = decide(run(RunState.RECOVERING, fresh), Observation(snap([started])), Policy())
    assert RunState.RUNNING not in states(d)


def test_a_fatal_finding_is_a_fault_and_an_answering_node_is_drained_not_downed():
    found = NodeFinding("n2", Severity.FATAL, "XID 79", "xid-79@1", 97.0, source="agent")
    d = decide(run(), Observation(snap([JOB]), findings={"n2": found}), Policy())
    assert [(c.node, c.change) for c in of(d, ChangeNode)] == [("n2", NodeChange.DRAIN)]
    assert of(d, Exclude) == [Exclude("llm", "n2", "XID 79 [agent, rule xid-79@1]")]
    assert events(d, EventKind.FAULT)[0].evidence["detection_s"] == 3.0
    requeue = replace(SPEC, restart_mode=RestartMode.REQUEUE)
    d = decide(run(spec=requeue), Observation(snap([JOB]), findings={"n2": found}), Policy())
    assert [(c.node, c.change) for c in of(d, ChangeNode)] == [("n2", NodeChange.DOWN), ("n2", NodeChange.DRAIN)]
    assert of(d, Cancel) == []  # downing a node of the job makes Slurm requeue it


def test_a_node_the_probes_found_dead_is_detected_from_its_first_failed_probe():
    """Before: a dead host's fault had no onset on record, and the goodput left its detection out."""
    dead = {"n2": "slurmd probe failed 3 times over 1.0 s: ECONNREFUSED"}
    d = decide(run(), Observation(snap([JOB]), dead=dead, dead_since={"n2": 98.5}), Policy())
    assert events(d, EventKind.FAULT)[0].evidence["detection_s"] == 1.5
    unknown = decide(run(), Observation(snap([JOB]), dead=dead), Policy())
    assert "detection_s" not in events(unknown, EventKind.FAULT)[0].evidence


def test_a_node_kept_out_of_the_run_or_unknown_to_slurm_is_a_fault():
    d = decide(run(excluded={"n2": "slow"}), Observation(snap([JOB])), Policy())
    assert of(d, Exclude)[0].reason == "node is kept out of this run: slow"
    gone = replace(JOB, nodes=("n1", "n9"))
    d = decide(run(), Observation(snap([gone])), Policy())
    assert of(d, Exclude) == [Exclude("llm", "n9", "node unknown to Slurm")]
    down = node("n2", NodeState.DOWN, reason="")
    assert of(decide(run(), Observation(snap([JOB], n2=down)), Policy()), Exclude)[0].reason == (
        "Slurm reports the node DOWN (no reason)"
    )


def test_a_node_drained_by_someone_else_is_excluded_without_a_node_change():
    admin = node("n2", NodeState.ALLOCATED, ("DRAIN",), "admin: bad dimm")
    d = decide(run(excluded={"n2": "x"}), Observation(snap([JOB], n2=admin)), Policy(drains_left=0))
    assert of(d, ChangeNode) == []
    assert [e.message for e in events(d, EventKind.NODE_EXCLUDED)] == [
        "n2 excluded from run llm; already drained in Slurm (admin: bad dimm)"
    ]


def test_rollback_and_hang_stop_the_job_once():
    class Rollback:
        onset_step = 1234

    d = decide(run(), Observation(snap([JOB]), rollbacks={"llm": Rollback()}), Policy())
    assert of(d, Cancel) == [Cancel("llm", 7, "rollback after the loss spike at step 1234")]
    assert of(d, SetState)[0].reason == "rollback after the loss spike at step 1234"
    d = decide(run(RunState.RECOVERING), Observation(snap([JOB]), rollbacks={"llm": Rollback()}), Policy())
    assert of(d, Cancel) == [Cancel("llm", 7, "finishing recovery started earlier")]
    d = decide(run(), Observation(snap([JOB]), hangs={"llm": {"reason": "no step for 20 min"}}), Policy())
    assert of(d, Cancel) == [Cancel("llm", 7, "hang: no training progress")]
    assert of(d, SetState)[0].reason == "hang: no step for 20 min"
    d = decide(run(RunState.RECOVERING), Observation(snap([JOB]), hangs={"llm": {}}), Policy())
    assert of(d, Cancel) == [Cancel("llm", 7, "finishing recovery started earlier")] and states(d) == []


def test_requeue_mode_does_not_cancel_when_a_node_of_the_job_is_down_already():
    requeue = replace(SPEC, restart_mode=RestartMode.REQUEUE)
    down = node("n2", NodeState.DOWN, reason=OURS)
    d = decide(
        run(RunState.RECOVERING, spec=requeue, excluded={"n2": "dead"}), Observation(snap([JOB], n2=down)), Policy()
    )
    assert of(d, Cancel) == []
    suspended = replace(JOB, state=JobState.SUSPENDED)
    d = decide(
        run(RunState.RECOVERING, spec=requeue, excluded={"n2": "dead"}),
        Observation(snap([suspended], n2=down)),
        Policy(),
    )
    assert of(d, Cancel)


# ---------------------------------------------------------------- a finished job (lifecycle)


def test_a_bad_node_found_after_the_job_ended_is_downed_and_drained_but_nothing_cancelled():
    failed = replace(JOB, state=JobState.FAILED, exit_code=1, end_time=95.0)
    nr = node("n1", NodeState.ALLOCATED, ("NOT_RESPONDING",))
    d = decide(run(), Observation(snap([failed], n1=nr)), Policy())
    assert [(c.node, c.change) for c in of(d, ChangeNode)] == [("n1", NodeChange.DOWN), ("n1", NodeChange.DRAIN)]
    assert of(d, Cancel) == []
    assert of(d, Exclude)[0].node == "n1" and RunState.RECOVERING in states(d)
    assert of(d, AttemptEnded) == [AttemptEnded("llm", 0, 95.0, "FAILED", "FAILED", 1)]


def prolog_drained():
    return node("n1", NodeState.IDLE, ("DRAIN",), "Prolog error", prolog_failed=True)


def test_a_no_requeue_job_cancelled_at_launch_by_a_prolog_failure_is_recovered():
    launched = replace(JOB, state=JobState.CANCELLED, start_time=50.0, end_time=60.0)  # 10 s: just launched
    d = decide(run(), Observation(snap([launched], n1=prolog_drained())), Policy())
    assert of(d, Exclude)[0].node == "n1" and RunState.RECOVERING in states(d)
    assert RunState.CANCELLED not in states(d) and of(d, Cancel) == []
    assert "prolog failed" in of(d, Exclude)[0].reason
    later = replace(launched, end_time=60.5)  # ran 10.5 s: a person's cancel
    assert RunState.CANCELLED in states(decide(run(), Observation(snap([later], n1=prolog_drained())), Policy()))


def test_a_job_cancelled_as_it_started_waits_briefly_for_a_prolog_drain():
    launched = replace(JOB, state=JobState.CANCELLED, start_time=88.0, end_time=91.0)
    d = decide(run(), Observation(snap([launched])), Policy())  # 9 s since it ended: wait
    assert states(d) == [] and d.actions == () and [type(r) for r in d.records] == [AttemptEnded]
    d = decide(run(), Observation(snap([launched], now=101.0)), Policy())  # 10 s: a person's cancel
    assert RunState.CANCELLED in states(d)
    never = replace(launched, start_time=None)
    assert RunState.CANCELLED in states(decide(run(), Observation(snap([never])), Policy()))


def test_an_unexplained_death_waits_for_the_node_agents_evidence():
    failed = replace(JOB, state=JobState.FAILED, exit_code=1, end_time=95.0)
    wait = Policy(evidence_wait_s=30.0)
    d = decide(run(), Observation(snap([failed]), agents=frozenset({"n2"})), wait)
    assert d.recheck_at == 125.0 and RunState.RECOVERING not in states(d)
    d = decide(run(), Observation(snap([failed], now=125.0), agents=frozenset({"n2"})), wait)
    assert RunState.RECOVERING in states(d)
    assert events(d, EventKind.FAULT)[0].evidence["detection_s"] == 30.0
    assert events(d, EventKind.FAULT)[0].message == "job 7 ended FAILED with exit code 1"
    d = decide(run(), Observation(snap([failed]), agents=frozenset({"n9"})), wait)  # no agent on its nodes
    assert RunState.RECOVERING in states(d)
    d = decide(run(), Observation(snap([failed]), agents=frozenset({"n2"})), Policy())
    assert RunState.RECOVERING in states(d)
    just = replace(failed, end_time=99.75)  # a wait under a second is a wait too
    d = decide(run(), Observation(snap([just]), agents=frozenset({"n2"})), Policy(evidence_wait_s=0.5))
    assert d.recheck_at == 100.25 and states(d) == []


def test_an_attempt_that_started_and_ended_between_polls_books_slurms_start():
    fresh = replace(A0, started_at=None)
    done = replace(JOB, state=JobState.COMPLETED, exit_code=0, start_time=42.0, end_time=90.0)
    d = decide(run(RunState.QUEUED, fresh), Observation(snap([done])), Policy())
    assert of(d, AttemptStarted) == [AttemptStarted("llm", 0, ("n1", "n2"), 42.0)]
    assert events(d, EventKind.STARTED)[0].at == 42.0
    assert RunState.COMPLETED in states(d)
    failed_exit = replace(done, exit_code=3, state=JobState.COMPLETED)
    assert RunState.COMPLETED not in states(decide(run(), Observation(snap([failed_exit])), Policy()))


def test_a_job_ending_while_recovering_is_replaced_and_recorded_once():
    ended = replace(JOB, state=JobState.CANCELLED, end_time=95.0)
    r = run(RunState.RECOVERING, replace(A0, ended_at=None), excluded={"n1": "dead"})
    d = decide(r, Observation(snap([ended], n1=node("n1", NodeState.DOWN, reason=OURS))), Policy())
    assert of(d, AttemptEnded) == [AttemptEnded("llm", 0, 95.0, "CANCELLED", "CANCELLED", None)]
    assert events(d, EventKind.STOPPED)[0].message.endswith("ended CANCELLED after the fault")
    (submit,) = of(d, Submit)
    assert submit.restart and submit.reason == "replacing the incarnation stopped after a fault"


# ---------------------------------------------------------------- gone, restarts, refusals


def test_a_job_gone_while_recovering_is_replaced():
    r = run(RunState.RECOVERING, replace(A0, ended_at=None), excluded={"n1": "dead"})
    d = decide(r, Observation(snap([])), Policy())
    assert of(d, AttemptEnded) == [AttemptEnded("llm", 0, 100.0, "VANISHED", "job no longer known to Slurm")]
    (submit,) = of(d, Submit)
    assert submit == Submit("llm", ("n1",), restart=True, reason="replacing the incarnation stopped after a fault")
    already = run(RunState.RECOVERING, replace(A0, ended_at=90.0, end_state="FAILED"))
    assert of(decide(already, Observation(snap([])), Policy()), AttemptEnded) == []


def test_a_job_gone_from_slurm_waits_while_accounting_may_tell():
    maybe = Forgotten("slurmdbd unreachable", found=False, final=False)
    d = decide(run(), Observation(snap([]), forgotten={7: maybe}), Policy())
    assert RunState.FAILED not in states(d) and of(d, Submit) == []
    final = Forgotten("no accounting record", final=True)
    d = decide(run(), Observation(snap([]), forgotten={7: final}), Policy())
    assert RunState.FAILED in states(d)
    assert of(d, AttemptEnded)[0].end_state == "VANISHED"


def test_a_storm_waits_before_placing_the_run_again():
    ended = replace(A0, ended_at=90.0, end_state="NODE_FAIL")
    r = run(RunState.RECOVERING, ended, excluded={"n1": "dead"})
    d = decide(r, Observation(snap([])), Policy(storm=True))
    assert of(d, Submit) == [] and d.recheck_at == 210.0 and d.waiting
    (backoff,) = events(d, EventKind.BACKOFF)
    assert backoff.evidence == {"until": 210.0, "storm": True}
    d = decide(r, Observation(snap([], now=210.0)), Policy(storm=True))
    assert of(d, Submit)


def test_dead_nodes_of_the_old_job_are_fenced_when_a_fence_is_configured():
    ended = replace(A0, ended_at=30.0, end_state="NODE_FAIL")
    r = run(RunState.RECOVERING, ended, excluded={"n1": "dead"})
    failed = replace(JOB, state=JobState.NODE_FAIL, end_time=30.0)
    down = node("n1", NodeState.DOWN, ("DRAIN",), OURS)
    d = decide(r, Observation(snap([failed], n1=down)), Policy(fence=True))
    assert of(d, Fence) == [Fence("llm", "n1", 7)] and of(d, Submit)
    d = decide(r, Observation(snap([failed], n1=down)), Policy())
    (warning,) = events(d, EventKind.WARNING)
    assert warning.evidence == {"nodes": ["n1"]} and of(d, Fence) == []
    d = decide(r, Observation(snap([], n1=down)), Policy(fence=True))  # job gone: no fence of it
    assert of(d, Fence) == []


def test_budget_spent_gives_up_and_one_left_restarts():
    ended = replace(A0, ended_at=30.0, end_state="FAILED")
    failed = replace(JOB, state=JobState.FAILED, end_time=30.0)
    d = decide(run(RunState.RECOVERING, ended, restarts_spent=2), Observation(snap([failed])), Policy())
    assert of(d, Submit)
    d = decide(run(RunState.RECOVERING, ended, restarts_spent=3), Observation(snap([failed])), Policy())
    assert of(d, Submit) == [] and RunState.FAILED in states(d)


def test_a_refused_submission_is_tried_once_more_after_a_minute_then_the_run_is_blocked():
    fresh = run(RunState.REGISTERED, attempt=None)
    once = {"llm": ((70.0, "invalid account"),)}
    d = decide(fresh, Observation(snap([]), refused=once), Policy())
    assert of(d, Submit) == [] and d.recheck_at == 130.0 and d.waiting
    d = decide(fresh, Observation(snap([], now=130.0), refused=once), Policy())
    assert of(d, Submit)
    twice = {"llm": ((10.0, "invalid account"), (70.0, "invalid qos"))}
    d = decide(fresh, Observation(snap([]), refused=twice), Policy())
    assert RunState.FAILED in states(d) and "invalid qos" in of(d, SetState)[0].reason


def test_cancel_before_any_job_and_cancel_of_a_completing_job():
    d = decide(run(RunState.REGISTERED, attempt=None, cancel_requested=True), Observation(snap([])), Policy())
    assert states(d) == [RunState.CANCELLED] and d.actions == ()
    completing = replace(JOB, state=JobState.CANCELLED, flags=frozenset({"COMPLETING"}))
    d = decide(run(cancel_requested=True), Observation(snap([completing])), Policy())
    assert d.records == () and d.actions == ()
    d = decide(run(cancel_requested=True), Observation(snap([])), Policy())
    assert states(d) == [RunState.CANCELLED]


def test_a_terminal_run_asks_for_nothing():
    for state in (RunState.COMPLETED, RunState.FAILED, RunState.CANCELLED):
        d = decide(run(state, excluded={"n1": "dead"}), Observation(snap([JOB]), returned=frozenset({"n1"})), Policy())
        assert d.records == () and d.actions == ()


# ---------------------------------------------------------------- queued and requeued jobs


def test_a_pending_job_whose_exclude_list_is_already_right_asks_for_nothing():
    pending = JobInfo(7, "llm", JobState.PENDING, excluded_nodes=("n1",))
    r = run(RunState.QUEUED, replace(A0, started_at=None), excluded={"n1": "dead"})
    d = decide(r, Observation(snap([pending])), Policy())
    assert d.actions == () and d.records == ()
    stale = replace(pending, excluded_nodes=())
    assert decide(r, Observation(snap([stale])), Policy()).actions == (SetExcluded("llm", 7, ("n1",)),)
    wider = replace(pending, excluded_nodes=("n1", "n3"))  # n3 is fine again: dropped from the list
    assert decide(r, Observation(snap([wider])), Policy()).actions == (SetExcluded("llm", 7, ("n1",)),)


def test_a_pending_job_puts_a_running_or_recovering_run_back_to_queued():
    pending = JobInfo(7, "llm", JobState.PENDING)
    for state in (RunState.REGISTERED, RunState.RUNNING, RunState.RECOVERING):
        assert states(decide(run(state), Observation(snap([pending])), Policy())) == [RunState.QUEUED]
    assert states(decide(run(RunState.QUEUED), Observation(snap([pending])), Policy())) == []


def test_a_requeued_job_spends_the_budget_once_and_keeps_its_bad_nodes_out():
    requeued = replace(JOB, state=JobState.PENDING, restart_count=1, nodes=(), state_reason="NodeFail")
    down = node("n2", NodeState.DOWN, reason="Not responding")
    d = decide(run(excluded={"n3": "old"}), Observation(snap([requeued], n2=down)), Policy())
    assert of(d, AttemptEnded) == [AttemptEnded("llm", 0, 100.0, "REQUEUED", "requeued by Slurm (NodeFail)")]
    assert of(d, Exclude)[0].node == "n2" and of(d, ChangeNode)
    (requeue,) = events(d, EventKind.REQUEUED)
    assert requeue.message == "Slurm requeued job 7 (restart 1)"
    ended = run(attempt=replace(A0, ended_at=99.0))
    assert of(decide(ended, Observation(snap([requeued], n2=down)), Policy()), AttemptEnded) == []


def test_a_hold_after_our_prolog_is_released_only_for_a_requeued_incarnation():
    held = JobInfo(7, "llm", JobState.PENDING, hold=JobHold.ADMIN, restart_count=1)
    prolog = {"n1": "XID 79 [prolog, rule xid-79@1]"}
    requeued = replace(A0, restart_count=1, started_at=None)
    d = decide(run(RunState.QUEUED, requeued, excluded=prolog), Observation(snap([held])), Policy())
    assert [type(a) for a in d.actions] == [SetExcluded, Release]
    first = replace(held, restart_count=0)
    d = decide(
        run(RunState.QUEUED, replace(A0, started_at=None), excluded=prolog), Observation(snap([first])), Policy()
    )
    assert not of(d, Release)


# ---------------------------------------------------------------- returned nodes and unfinished drains


def test_a_returned_node_is_usable_again_at_once():
    r = run(RunState.QUEUED, replace(A0, started_at=None), excluded={"n1": "dead"}, deferred={"n2": (5.0, "slow")})
    pending = JobInfo(7, "llm", JobState.PENDING, excluded_nodes=("n1", "n2"))
    d = decide(r, Observation(snap([pending]), returned=frozenset({"n1", "n2", "n3"})), Policy())
    assert of(d, Unexclude) == [Unexclude("llm", "n1"), Unexclude("llm", "n2")]
    returned = events(d, EventKind.NODE_RETURNED)
    assert [e.evidence for e in returned] == [{"node": "n1", "was": "dead"}, {"node": "n2", "was": "slow"}]
    assert returned[0].key == "llm:0:node_returned:n1:100"
    assert d.actions == (SetExcluded("llm", 7, ()),)


def test_a_node_started_on_after_its_return_is_not_a_fault():
    r = run(excluded={"n2": "dead"})
    d = decide(r, Observation(snap([JOB]), returned=frozenset({"n2"})), Policy())
    assert of(d, Unexclude) == [Unexclude("llm", "n2")] and of(d, Cancel) == [] and of(d, Exclude) == []


def test_a_node_downed_but_not_drained_is_drained_first():
    downed = node("n1", NodeState.DOWN, (), OURS)
    r = run(RunState.RECOVERING, excluded={"n1": "dead"})
    d = decide(r, Observation(snap([JOB], n1=downed)), Policy())
    assert d.actions[0] == ChangeNode("llm", "n1", NodeChange.DRAIN, OURS)
    assert d.actions.count(d.actions[0]) == 1
    someone = node("n1", NodeState.DOWN, (), "admin: down")
    assert (
        ChangeNode("llm", "n1", NodeChange.DRAIN, "admin: down")
        not in decide(r, Observation(snap([JOB], n1=someone)), Policy()).actions
    )


def test_requeue_mode_cancels_at_a_checkpoint_boundary_where_only_drains_are_asked():
    requeue = replace(SPEC, restart_mode=RestartMode.REQUEUE)
    d = decide(degraded_run(spec=requeue), boundary_obs(), Policy())
    assert {c.change for c in of(d, ChangeNode)} == {NodeChange.DRAIN}
    assert of(d, Cancel) == [Cancel("llm", 7, "checkpoint boundary: dropping degraded n1,n2")]


def test_a_returned_degraded_node_no_longer_forces_a_checkpoint_boundary():
    r = run(deferred={"n2": (30.0, "throttling")})
    d = decide(r, Observation(snap([JOB]), checkpoint_at={"llm": 50.0}, returned=frozenset({"n2"})), Policy())
    assert of(d, Unexclude) == [Unexclude("llm", "n2")] and d.actions == ()


def test_a_finished_job_of_a_run_not_recovering_is_not_a_stop_after_a_fault():
    failed = replace(JOB, state=JobState.FAILED, exit_code=1, end_time=95.0)
    for state in (RunState.QUEUED, RunState.RUNNING, RunState.REGISTERED):
        assert events(decide(run(state), Observation(snap([failed])), Policy()), EventKind.STOPPED) == []


def test_only_the_old_jobs_unreachable_nodes_are_fenced():
    ended = replace(A0, ended_at=30.0, end_state="NODE_FAIL")
    r = run(RunState.RECOVERING, ended, excluded={"n1": "dead", "n3": "dead earlier"})
    failed = replace(JOB, state=JobState.NODE_FAIL, end_time=30.0)
    down = node("n1", NodeState.DOWN, ("DRAIN",), OURS)
    d = decide(
        r, Observation(snap([failed], n1=down, n3=node("n3", NodeState.DOWN, ("DRAIN",), OURS))), Policy(fence=True)
    )
    assert of(d, Fence) == [Fence("llm", "n1", 7)]


def test_a_node_of_the_ended_attempt_found_bad_since_is_contained_before_the_restart():
    ended = replace(A0, ended_at=30.0, end_state="NODE_FAIL")
    r = run(RunState.RECOVERING, ended, excluded={"n1": "dead"})
    failed = replace(JOB, state=JobState.NODE_FAIL, end_time=30.0)
    down = node("n1", NodeState.DOWN, ("DRAIN",), OURS)
    nr = node("n2", NodeState.IDLE, ("NOT_RESPONDING",))
    d = decide(r, Observation(snap([failed], n1=down, n2=nr)), Policy())
    assert of(d, Exclude) == [Exclude("llm", "n2", "Slurm reports the node NOT_RESPONDING")]
    assert [(c.node, c.change) for c in of(d, ChangeNode)] == [("n2", NodeChange.DOWN), ("n2", NodeChange.DRAIN)]
    (submit,) = of(d, Submit)
    assert submit.exclude == ("n1", "n2")


def test_a_mass_fault_continues_only_while_an_earlier_one_left_a_node_in_service():
    a1 = replace(A0, seq=1, job_id=8, started_at=90.0)
    job = replace(JOB, job_id=8)
    for left, continues in (
        (node("n3"), True),  # in service: the incident goes on
        (node("n3", NodeState.IDLE, ("DRAIN",), "admin"), False),
        (node("n3", NodeState.DOWN), False),
        (node("n3", NodeState.IDLE, ("NOT_RESPONDING",)), False),
    ):
        obs = Observation(snap([job], n1=node("n1", flags=("NOT_RESPONDING",)), n3=left))
        d = decide(run(attempt=a1, excluded={"n3": "over the cap"}), obs, Policy(drains_left=0))
        assert bool(events(d, EventKind.MASS_FAULT)) is not continues, left


def test_the_blast_radius_counts_each_node_taken_out_of_service():
    job = replace(JOB, nodes=("n1", "n2", "n3"))
    nr = {n: node(n, NodeState.ALLOCATED, ("NOT_RESPONDING",)) for n in ("n1", "n2", "n3")}
    d = decide(run(attempt=replace(A0, nodes=job.nodes)), Observation(snap([job], **nr)), Policy(drains_left=2))
    assert sorted({c.node for c in of(d, ChangeNode)}) == ["n1", "n2"]
    assert [e.evidence["excluded"] for e in events(d, EventKind.MASS_FAULT)] == [["n3"]]


def test_evidence_is_awaited_on_the_jobs_nodes_when_the_attempt_never_saw_them():
    failed = replace(JOB, state=JobState.FAILED, exit_code=1, end_time=95.0)
    unseen = replace(A0, nodes=(), started_at=None)
    d = decide(run(attempt=unseen), Observation(snap([failed]), agents=frozenset({"n2"})), Policy(evidence_wait_s=30.0))
    assert d.recheck_at == 125.0 and states(d) == []


def test_a_negative_evidence_wait_never_waits():
    failed = replace(JOB, state=JobState.FAILED, exit_code=1, end_time=195.0)  # Slurm's end time ahead of ours
    d = decide(run(), Observation(snap([failed]), agents=frozenset({"n2"})), Policy(evidence_wait_s=-30.0))
    assert RunState.RECOVERING in states(d)


def test_the_storm_wait_says_how_long():
    ended = replace(A0, ended_at=90.0, end_state="NODE_FAIL")
    d = decide(run(RunState.RECOVERING, ended, excluded={"n1": "dead"}), Observation(snap([])), Policy(storm=True))
    assert events(d, EventKind.BACKOFF)[0].message.startswith("next restart in 110 s: the blast radius is spent")


def test_a_job_the_supervisor_stopped_to_roll_back_is_no_fast_failure():
    """Before: the attempt stopped for a rollback 32 s after it started counted as a fast failure,
    and the restart from the checkpoint before the spike waited 30 s of backoff (tests/e2e)."""

    class Rollback:
        onset_step, checkpoint_step = 61, 60

    stopped = JobInfo(7, "llm", JobState.CANCELLED, nodes=("n1", "n2"), partition="main", end_time=52.0)
    seen = snap([stopped], now=60.0)  # 8 s after it ended: within a fast failure's backoff
    d = decide(run(RunState.RECOVERING), Observation(seen, rollbacks={"llm": Rollback()}), Policy())
    assert events(d, EventKind.BACKOFF) == []
    (submit,) = of(d, Submit)
    assert submit.reason.startswith("rollback to step 60 after the loss spike at step 61")
    # A fault's replacement still backs off after a fast failure (the rule is unchanged there).
    d = decide(run(RunState.RECOVERING), Observation(seen), Policy())
    assert of(d, Submit) == [] and events(d, EventKind.BACKOFF)


def test_a_job_stopped_at_a_checkpoint_boundary_to_drop_a_degraded_node_is_no_fast_failure():
    """Before: the restart without the degraded node waited a fast failure's backoff (tests/e2e's
    straggler): the attempt ran on a node kept out for its degradation, as one kept out for a fault."""
    stopped = JobInfo(7, "llm", JobState.CANCELLED, nodes=("n1", "n2"), partition="main", end_time=52.0)
    r = degraded_run(state=RunState.RECOVERING)
    d = decide(r, Observation(snap([stopped], now=60.0)), Policy())
    assert events(d, EventKind.BACKOFF) == []
    (submit,) = of(d, Submit)
    assert set(submit.exclude) >= {"n1", "n2"}
