"""The pure decisions, on plain data: what the supervisor asks for in each situation."""

from dataclasses import replace

from supervisor.domain.actions import (
    AttemptEnded,
    AttemptRequeued,
    Cancel,
    ChangeNode,
    Exclude,
    Release,
    SetExcluded,
    SetState,
    Submit,
)
from supervisor.domain.cluster import ClusterSnapshot, JobHold, JobInfo, JobState, NodeChange, NodeInfo, NodeState
from supervisor.domain.decide.policy import Observation, Policy, decide
from supervisor.domain.health.quarantine import Fault
from supervisor.domain.records import AttemptRecord, Event, EventKind, NodeVerdict, RunRecord, Verdict
from supervisor.domain.run import RestartMode, RunState, SparePolicy
from supervisor.testing.kit.specs import spec

SPEC = spec(script="/s.sh", spare_policy=SparePolicy.NAMED, spare_nodes=("n4",), max_restarts=3)


def nodes(**states):
    out = {}
    for i in range(1, 5):
        name = f"n{i}"
        kind = states.get(name, "IDLE")
        flags = frozenset({"NOT_RESPONDING"}) if kind == "NR" else frozenset()
        base = NodeState.ALLOCATED if kind in ("ALLOC", "NR") else NodeState.parse(kind)
        out[name] = NodeInfo(name, base, flags, "Not responding" if kind == "DOWN" else "", ("main",))
    return out


def snap(jobs=(), **states):
    return ClusterSnapshot(100.0, {j.job_id: j for j in jobs}, nodes(**states))


def run(state=RunState.RUNNING, attempt=None, **kw):
    return RunRecord(spec=kw.pop("spec", SPEC), state=state, attempt=attempt, **kw)


A0 = AttemptRecord("llm", 0, 7, 0, 10.0, nodes=("n1", "n2"), started_at=20.0)
RUNNING_JOB = JobInfo(7, "llm", JobState.RUNNING, nodes=("n1", "n2"), partition="main")


def kinds(decision, cls):
    return [x for x in decision.records + decision.actions if isinstance(x, cls)]


def test_first_submission_keeps_named_spares_out_while_others_are_idle():
    d = decide(run(RunState.REGISTERED), Observation(snap()), Policy())
    assert d.actions == (Submit("llm", ("n4",), restart=False, reason="first submission"),)


def test_spare_is_allowed_when_the_partition_runs_short():
    r = run(RunState.RECOVERING, A0, excluded={"n1": "dead"})
    finished = replace(RUNNING_JOB, state=JobState.CANCELLED)
    d = decide(r, Observation(snap([finished], n1="DOWN", n3="ALLOC")), Policy())
    (submit,) = kinds(d, Submit)
    assert submit.exclude == ("n1",) and submit.restart


def test_spares_work_for_a_spec_over_several_partitions():
    """``partition = "a,b"`` (sbatch -p a,b): the named spare is kept out while the partitions have
    idle nodes, and let in when they run short — before, no node matched "a,b" and spares never
    worked (issue 21, item 9)."""
    two = {n: replace(info, partitions=("a",) if n in ("n1", "n2") else ("b",)) for n, info in nodes().items()}
    spec = replace(SPEC, partition="a,b")
    first = decide(run(RunState.REGISTERED, spec=spec), Observation(ClusterSnapshot(100.0, {}, two)), Policy())
    assert kinds(first, Submit)[0].exclude == ("n4",)
    short = dict(two, n3=replace(two["n3"], state=NodeState.ALLOCATED))
    r = run(RunState.RECOVERING, A0, excluded={"n1": "dead"}, spec=spec)
    finished = replace(RUNNING_JOB, state=JobState.CANCELLED)
    d = decide(r, Observation(ClusterSnapshot(100.0, {7: finished}, short)), Policy())
    assert kinds(d, Submit)[0].exclude == ("n1",)


def test_dead_node_is_downed_with_reason_and_job_stopped():
    d = decide(run(attempt=A0), Observation(snap([RUNNING_JOB], n1="NR", n2="ALLOC")), Policy())
    down, drain = kinds(d, ChangeNode)
    assert (down.node, down.change, drain.change) == ("n1", NodeChange.DOWN, NodeChange.DRAIN)
    assert (
        down.reason == drain.reason
        and down.reason.startswith("slurm-supervisor: run llm:")
        and "NOT_RESPONDING" in down.reason
    )
    assert kinds(d, Cancel) == [Cancel("llm", 7, "node fault on n1")]
    assert d.actions.index(drain) < d.actions.index(kinds(d, Cancel)[0])
    assert [e.kind for e in kinds(d, Event)] == [EventKind.FAULT]
    assert kinds(d, Exclude)[0].node == "n1"
    assert SetState("llm", RunState.RECOVERING, reason="n1: Slurm reports the node NOT_RESPONDING") in d.records


def test_probe_evidence_counts_before_slurm_notices():
    obs = Observation(snap([RUNNING_JOB], n1="ALLOC", n2="ALLOC"), dead={"n2": "connection refused"})
    d = decide(run(attempt=A0), obs, Policy())
    assert {c.node for c in kinds(d, ChangeNode)} == {"n2"}


def test_without_node_rights_the_node_is_only_excluded():
    d = decide(run(attempt=A0), Observation(snap([RUNNING_JOB], n1="NR", n2="ALLOC")), Policy(may_change_nodes=False))
    assert kinds(d, ChangeNode) == []
    assert any(e.kind is EventKind.NODE_EXCLUDED and "no node rights" in e.message for e in kinds(d, Event))
    assert kinds(d, Cancel)


def test_blast_radius_stops_draining():
    job = replace(RUNNING_JOB, nodes=("n1", "n2"))
    d = decide(run(attempt=A0), Observation(snap([job], n1="NR", n2="NR")), Policy(drains_left=1))
    assert {c.node for c in kinds(d, ChangeNode)} == {"n1"}
    assert any("blast-radius" in e.message for e in kinds(d, Event))


def test_over_the_cap_a_node_is_excluded_not_drained_and_the_incident_is_one_mass_fault():
    job = replace(RUNNING_JOB, nodes=("n1", "n2"))
    d = decide(run(attempt=A0), Observation(snap([job], n1="NR", n2="NR")), Policy(drains_left=1))
    assert {x.node for x in kinds(d, Exclude)} == {"n1", "n2"}  # both kept out of the next job
    assert {x.node for x in kinds(d, Fault)} == {"n1", "n2"}  # both count for quarantine
    over = [v for v in kinds(d, NodeVerdict) if v.node == "n2"]
    assert [(v.verdict, v.action) for v in over] == [(Verdict.BAD, "blast-radius")]
    assert "not drained" in over[0].reason
    (mass,) = [e for e in kinds(d, Event) if e.kind is EventKind.MASS_FAULT]
    assert mass.key == "llm:mass_fault:0" and mass.evidence["excluded"] == ["n2"] and mass.evidence["drained"] == ["n1"]
    assert kinds(d, Cancel)


def test_a_mass_fault_on_a_young_attempt_while_the_last_ones_nodes_are_kept_out_continues_the_incident():
    a1 = replace(A0, seq=1, job_id=8, nodes=("n1", "n2"), started_at=90.0)  # 10 s before the snapshot
    job = replace(RUNNING_JOB, job_id=8, nodes=("n1", "n2"))
    earlier = {"n3": "XID 79 (over the cap in attempt 0)"}  # in service in Slurm, kept out of the run
    d = decide(run(attempt=a1, excluded=earlier), Observation(snap([job], n1="NR", n2="NR")), Policy(drains_left=0))
    assert {x.node for x in kinds(d, Exclude)} == {"n1", "n2"} and not kinds(d, ChangeNode)
    assert not [e for e in kinds(d, Event) if e.kind is EventKind.MASS_FAULT]
    old = replace(a1, started_at=100.0 - 601)  # it ran for a while: a new incident
    d = decide(run(attempt=old, excluded=earlier), Observation(snap([job], n1="NR", n2="NR")), Policy(drains_left=0))
    assert [e.key for e in kinds(d, Event) if e.kind is EventKind.MASS_FAULT] == ["llm:mass_fault:1"]


def test_a_node_already_drained_by_a_hook_takes_no_drain_and_is_not_over_the_cap():
    job = replace(RUNNING_JOB, nodes=("n1", "n2"))
    s = snap([job], n2="ALLOC")
    hooked = NodeInfo("n1", NodeState.IDLE, frozenset({"DRAIN"}), "slurm-supervisor healthcheck: XID 79", ("main",))
    s = replace(s, nodes={**s.nodes, "n1": hooked})
    d = decide(run(attempt=A0), Observation(s, dead={"n1": "connection refused"}), Policy(drains_left=0))
    assert {x.node for x in kinds(d, Exclude)} == {"n1"} and not kinds(d, ChangeNode)
    assert not [e for e in kinds(d, Event) if e.kind is EventKind.MASS_FAULT]


def test_healthy_running_job_asks_for_nothing():
    d = decide(run(attempt=A0), Observation(snap([RUNNING_JOB], n1="ALLOC", n2="ALLOC")), Policy())
    assert d.actions == () and d.records == ()


def test_start_is_recorded_once():
    a = replace(A0, started_at=None)
    d = decide(run(RunState.QUEUED, a), Observation(snap([RUNNING_JOB], n1="ALLOC", n2="ALLOC")), Policy())
    assert SetState("llm", RunState.RUNNING) in d.records
    assert [e.kind for e in kinds(d, Event)] == [EventKind.STARTED]


def test_budget_spent_gives_up():
    r = run(RunState.RECOVERING, A0, restarts_spent=3, excluded={"n1": "dead"})
    d = decide(r, Observation(snap([replace(RUNNING_JOB, state=JobState.CANCELLED)], n1="DOWN")), Policy())
    assert kinds(d, Submit) == []
    assert SetState("llm", RunState.FAILED, reason="restart budget spent (3 of 3); giving up") in d.records


def test_do_not_restart_exit_code():
    job = replace(RUNNING_JOB, state=JobState.FAILED, exit_code=93)
    d = decide(run(attempt=A0), Observation(snap([job])), Policy())
    assert kinds(d, Submit) == []
    assert any(isinstance(s, SetState) and s.state is RunState.FAILED for s in d.records)
    assert "do-not-restart code 93" in kinds(d, Event)[0].message


def test_plain_failure_goes_to_recovery_then_restart():
    job = replace(RUNNING_JOB, state=JobState.FAILED, exit_code=1)
    d = decide(run(attempt=A0), Observation(snap([job])), Policy())
    assert any(isinstance(s, SetState) and s.state is RunState.RECOVERING for s in d.records)
    ended = replace(A0, ended_at=20.0 + 3600.0)  # after a healthy stretch: restarted at once
    d2 = decide(run(RunState.RECOVERING, ended), Observation(snap([job])), Policy())
    assert kinds(d2, Submit)[0].restart
    soon = replace(A0, ended_at=100.0)  # 80 s after it started: a fast failure, the restart waits
    d3 = decide(run(RunState.RECOVERING, soon), Observation(snap([job])), Policy())
    assert kinds(d3, Submit) == [] and d3.recheck_at is not None and d3.recheck_at > 100.0


def test_completed_and_externally_cancelled_are_final():
    done = replace(RUNNING_JOB, state=JobState.COMPLETED, exit_code=0)
    d = decide(run(attempt=A0), Observation(snap([done])), Policy())
    assert any(isinstance(s, SetState) and s.state is RunState.COMPLETED for s in d.records)
    cancelled = replace(RUNNING_JOB, state=JobState.CANCELLED)
    d = decide(run(attempt=A0), Observation(snap([cancelled])), Policy())
    assert any(isinstance(s, SetState) and s.state is RunState.CANCELLED for s in d.records)
    assert kinds(d, Submit) == []


def test_slurm_requeue_opens_a_new_attempt_and_spends_budget():
    requeued = replace(RUNNING_JOB, state=JobState.PENDING, restart_count=1, nodes=())
    d = decide(run(attempt=A0), Observation(snap([requeued], n1="DOWN")), Policy())
    assert kinds(d, AttemptEnded)[0].end_state == "REQUEUED"
    assert kinds(d, AttemptRequeued)[0].excluded == ("n1",)
    assert SetState("llm", RunState.QUEUED, spend_restart=True) in d.records


def test_pending_job_gets_run_exclusions_and_is_released_after_prolog_failure():
    pending = JobInfo(7, "llm", JobState.PENDING, excluded_nodes=("n4",), hold=JobHold.LAUNCH_FAILED)
    r = run(RunState.QUEUED, replace(A0, started_at=None), excluded={"n1": "dead"})
    d = decide(r, Observation(snap([pending])), Policy())
    assert SetExcluded("llm", 7, ("n1", "n4")) in d.actions
    assert any(isinstance(a, Release) for a in d.actions)


def test_vanished_job_is_not_restarted_blindly():
    d = decide(run(attempt=A0), Observation(snap([])), Policy())
    assert kinds(d, Submit) == []
    assert any(isinstance(s, SetState) and s.state is RunState.FAILED for s in d.records)


def test_requeue_mode_lets_slurm_requeue():
    spec = replace(SPEC, restart_mode=RestartMode.REQUEUE)
    d = decide(run(attempt=A0, spec=spec), Observation(snap([RUNNING_JOB], n1="NR", n2="ALLOC")), Policy())
    assert kinds(d, Cancel) == [] and kinds(d, ChangeNode)


def test_cancel_request():
    r = run(attempt=A0, cancel_requested=True)
    d = decide(r, Observation(snap([RUNNING_JOB], n1="ALLOC", n2="ALLOC")), Policy())
    assert d.actions == (Cancel("llm", 7, "cancel requested"),)
    d = decide(r, Observation(snap([replace(RUNNING_JOB, state=JobState.CANCELLED)])), Policy())
    assert any(isinstance(s, SetState) and s.state is RunState.CANCELLED for s in d.records)


def test_deciding_is_idempotent_once_node_is_ours():
    n = nodes(n2="ALLOC")
    n["n1"] = NodeInfo("n1", NodeState.DOWN, frozenset({"DRAIN"}), "slurm-supervisor: run llm: dead", ("main",))
    obs = Observation(ClusterSnapshot(100.0, {7: RUNNING_JOB}, n))
    d = decide(run(RunState.RECOVERING, A0, excluded={"n1": "dead"}), obs, Policy())
    assert kinds(d, ChangeNode) == []


def test_a_node_downed_but_not_drained_is_drained_once():
    n = nodes(n2="ALLOC")
    n["n1"] = NodeInfo("n1", NodeState.DOWN, frozenset(), "slurm-supervisor: run llm: dead", ("main",))
    finished = replace(RUNNING_JOB, state=JobState.NODE_FAIL)
    obs = Observation(ClusterSnapshot(100.0, {7: finished}, n))
    d = decide(run(RunState.RECOVERING, replace(A0, ended_at=90.0), excluded={"n1": "dead"}), obs, Policy())
    assert kinds(d, ChangeNode) == [ChangeNode("llm", "n1", NodeChange.DRAIN, "slurm-supervisor: run llm: dead")]


def test_a_persons_hold_is_never_released():
    held = JobInfo(7, "llm", JobState.PENDING, excluded_nodes=("n4",), hold=JobHold.USER, state_reason="JobHeldUser")
    d = decide(run(RunState.QUEUED, replace(A0, started_at=None)), Observation(snap([held])), Policy())
    assert not any(isinstance(a, Release) for a in d.actions)
    after_prolog = replace(held, hold=JobHold.LAUNCH_FAILED)
    d = decide(run(RunState.QUEUED, replace(A0, started_at=None)), Observation(snap([after_prolog])), Policy())
    assert any(isinstance(a, Release) for a in d.actions)


def test_the_policy_decides_on_the_hold_not_on_slurms_wording():
    # The adapter reads Slurm's texts into JobHold; texts left on the record are for people only.
    worded = JobInfo(
        7,
        "llm",
        JobState.PENDING,
        hold=JobHold.USER,
        state_reason="launch_failed_requeued_held",
        state_description="launch failed requeued held",
    )
    d = decide(run(RunState.QUEUED, replace(A0, started_at=None)), Observation(snap([worded])), Policy())
    assert not any(isinstance(a, Release) for a in d.actions)


def test_an_admin_hold_left_by_our_prolog_racing_our_drain_is_released():
    held = JobInfo(7, "llm", JobState.PENDING, hold=JobHold.ADMIN, state_reason="JobHeldAdmin", restart_count=1)
    requeued = replace(A0, restart_count=1, started_at=None)
    prolog = {"n1": "GPU lost: NVML cannot reach it (gpu 3) [prolog, rule gpu-lost@1]"}
    d = decide(run(RunState.QUEUED, requeued, excluded=prolog), Observation(snap([held])), Policy())
    assert any(isinstance(a, Release) for a in d.actions)
    other = {"n1": "slurmd probe failed"}  # not a prolog finding: an admin's hold stays
    d = decide(run(RunState.QUEUED, requeued, excluded=other), Observation(snap([held])), Policy())
    assert not any(isinstance(a, Release) for a in d.actions)
    users = replace(held, hold=JobHold.USER)  # only an admin's hold can be the race's leftover
    d = decide(run(RunState.QUEUED, requeued, excluded=prolog), Observation(snap([users])), Policy())
    assert not any(isinstance(a, Release) for a in d.actions)


def test_a_job_cancelled_at_launch_by_a_failed_prolog_is_recovered_not_given_up():
    launched = replace(RUNNING_JOB, state=JobState.CANCELLED, start_time=50.0, end_time=51.0)
    n = nodes(n2="IDLE")
    n["n1"] = NodeInfo("n1", NodeState.IDLE, frozenset({"DRAIN"}), "Prolog error", ("main",), prolog_failed=True)
    d = decide(run(attempt=A0), Observation(ClusterSnapshot(100.0, {7: launched}, n)), Policy())
    assert not any(isinstance(s, SetState) and s.state is RunState.CANCELLED for s in d.records)
    assert any(isinstance(s, SetState) and s.state is RunState.RECOVERING for s in d.records)
    # Drained for another reason that merely reads alike: a person's cancel, and the run ends.
    n["n1"] = replace(n["n1"], prolog_failed=False)
    d = decide(run(attempt=A0), Observation(ClusterSnapshot(100.0, {7: launched}, n)), Policy())
    assert any(isinstance(s, SetState) and s.state is RunState.CANCELLED for s in d.records)


def test_completing_only_on_fenced_nodes_counts_as_gone():
    n = nodes(n2="IDLE")
    n["n1"] = NodeInfo(
        "n1", NodeState.DOWN, frozenset({"DRAIN", "NOT_RESPONDING"}), "slurm-supervisor: run llm: hung", ("main",)
    )
    completing = replace(RUNNING_JOB, state=JobState.COMPLETING, nodes=("n1",))
    r = run(RunState.RECOVERING, A0, excluded={"n1": "hung"})
    d = decide(r, Observation(ClusterSnapshot(100.0, {7: completing}, n)), Policy())
    assert kinds(d, Submit) and "fenced-off n1" in kinds(d, Event)[0].message
    still_on_n2 = replace(completing, nodes=("n1", "n2"))
    d = decide(r, Observation(ClusterSnapshot(100.0, {7: still_on_n2}, n)), Policy())
    assert kinds(d, Submit) == []


def _killed_on_failed_node(now: float = 100.0):
    """Slurm declared n1 (the batch host) DOWN and killed the job; it lingers COMPLETING on the
    healthy n2 (its step teardown waits on the hung node), as seen on Slurm 22.05."""
    n = nodes(n1="DOWN")
    n["n1"] = replace(n["n1"], flags=frozenset({"NOT_RESPONDING"}))
    n["n2"] = replace(n["n2"], flags=frozenset({"COMPLETING"}))
    job = replace(
        RUNNING_JOB,
        state=JobState.COMPLETING,
        flags=frozenset({"COMPLETING"}),
        nodes=("n2",),
        state_reason="NodeDown",
        end_time=now + 31536000.0,  # Slurm's placeholder while completing: a year ahead
    )
    return ClusterSnapshot(now, {7: job}, n)


def test_a_job_slurm_killed_on_a_failed_node_is_a_fault_while_it_still_completes():
    """Issue 21 item 12: the fault is recorded the tick Slurm shows the job killed for a DOWN node,
    not when Slurm has finished completing it elsewhere (tens of seconds later on a real Slurm)."""
    d = decide(run(attempt=A0), Observation(_killed_on_failed_node()), Policy())
    faults = [e for e in kinds(d, Event) if e.kind is EventKind.FAULT]
    assert faults and "n1" in faults[0].message
    assert any(isinstance(s, SetState) and s.state is RunState.RECOVERING for s in d.records)
    assert any(isinstance(x, Exclude) and x.node == "n1" for x in d.records)
    (ended,) = kinds(d, AttemptEnded)
    assert ended.at == 100.0 and ended.end_state == "NODE_FAIL"  # when it stopped computing
    assert kinds(d, Cancel) == []  # Slurm is already killing it


def test_a_job_completing_by_itself_is_still_waited_for():
    n = nodes()
    n["n1"] = replace(n["n1"], flags=frozenset({"COMPLETING"}))
    job = replace(RUNNING_JOB, state=JobState.COMPLETING, flags=frozenset({"COMPLETING"}))
    d = decide(run(attempt=A0), Observation(ClusterSnapshot(100.0, {7: job}, n)), Policy())
    assert d.records == () and d.actions == ()


def test_the_restart_waits_for_slurms_kill_wait_on_a_responding_node_not_for_completion():
    """A healthy node still completing the old job: its processes were sent SIGTERM, then SIGKILL
    after KillWait, so past that bound (plus a margin) nothing of the old incarnation runs there;
    the restart goes then and the logbook says what it waited for."""
    stopped = replace(A0, ended_at=100.0, end_state="NODE_FAIL")
    r = run(RunState.RECOVERING, stopped, excluded={"n1": "Slurm reports the node DOWN"})
    early = decide(r, Observation(_killed_on_failed_node(104.0)), Policy(kill_wait_s=5.0))
    assert kinds(early, Submit) == [] and early.recheck_at is not None and early.recheck_at <= 108.0
    later = decide(r, Observation(_killed_on_failed_node(108.0)), Policy(kill_wait_s=5.0))
    (submit,) = kinds(later, Submit)
    assert submit.exclude == ("n1",)  # n2 still completes the old job: the spare n4 is let in
    assert "n2" in submit.reason and "KillWait (5 s)" in submit.reason  # the logbook's restarted line


def test_in_requeue_mode_slurm_requeues_after_completing_so_the_run_waits():
    spec = replace(SPEC, restart_mode=RestartMode.REQUEUE)
    stopped = replace(A0, ended_at=100.0, end_state="NODE_FAIL")
    r = run(RunState.RECOVERING, stopped, excluded={"n1": "down"}, spec=spec)
    d = decide(r, Observation(_killed_on_failed_node(200.0)), Policy(kill_wait_s=5.0))
    assert kinds(d, Submit) == []
