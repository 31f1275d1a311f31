"""Decisions on a job Slurm is still completing. Pure.

A job Slurm killed because one of its nodes failed lingers COMPLETING on its other nodes for as
long as their step teardown waits on the failed one (~35 s on Slurm 22.05 for a frozen batch
host). That is a fault now, whatever state the job lingers in: it is recorded the tick Slurm shows
it. The restart then waits only as long as fencing truly requires:

* a node that is DOWN and kept out of the run takes no new job, and whatever of the old
  incarnation is stuck there is killed by slurmd when it comes back (or by the fence command);
* on a node that still responds, Slurm sent the old processes SIGTERM when it killed the job and
  SIGKILL ``KillWait`` seconds later: past that bound (and a margin for the kill to land) nothing
  of the old incarnation runs there, whether or not Slurm has finished completing the job.

In requeue mode Slurm itself requeues the job once it has completed, so the run waits for that.
"""

from __future__ import annotations

from supervisor.domain.actions import AttemptEnded, Decision, Record, SetState
from supervisor.domain.cluster import JobInfo
from supervisor.domain.decide.faults import contain, faulty_nodes
from supervisor.domain.decide.in_allocation import current_step
from supervisor.domain.decide.lifecycle import decide_finished
from supervisor.domain.observation import Observation, Policy, fmt_nodes
from supervisor.domain.records import AttemptRecord, RunRecord
from supervisor.domain.run import RestartMode, RunState

KILL_MARGIN_S = 3.0  # the kill RPC reaching slurmd and SIGKILL landing, beyond KillWait


def decide_completing(run: RunRecord, a: AttemptRecord, job: JobInfo, obs: Observation, policy: Policy) -> Decision:
    if run.state is not RunState.RECOVERING:
        return _killed_on_failed_node(run, a, job, obs, policy)
    if run.spec.restart_mode is RestartMode.REQUEUE:
        return Decision()
    killed_at = a.ended_at if a.ended_at is not None else obs.now
    lingering = _may_still_run(run, job, obs)
    if lingering and obs.now < killed_at + policy.kill_wait_s + KILL_MARGIN_S:
        return Decision(
            tuple(_stopped_now(run, a, job, obs)), recheck_at=killed_at + policy.kill_wait_s + KILL_MARGIN_S
        )
    return decide_finished(run, a, job, obs, policy, how=_what_was_waited_for(job, lingering, policy))


def _killed_on_failed_node(
    run: RunRecord, a: AttemptRecord, job: JobInfo, obs: Observation, policy: Policy
) -> Decision:
    """A node of the attempt is dead in Slurm's view while Slurm completes the job: the fault, now.
    A job completing on healthy nodes only (it exited by itself) is waited for."""
    bad = faulty_nodes(run, _ran_on(run, a, job), obs)
    if not bad:
        return Decision()
    records, actions = contain(run, a, bad, obs, policy)
    why = "; ".join(f"{n}: {w}" for n, w in sorted(bad.items()))
    records += [*_stopped_now(run, a, job, obs), SetState(run.name, RunState.RECOVERING, reason=why)]
    return Decision(tuple(records), tuple(actions))  # no cancel: Slurm is killing it already


def _ran_on(run: RunRecord, a: AttemptRecord, job: JobInfo) -> tuple[str, ...]:
    """The nodes the job's work ran on: in-allocation, its step's — a node swapped out left the
    step (and the --no-kill allocation) with the swap, and a hot spare never ran it; else the
    attempt's."""
    if run.spec.restart_mode is RestartMode.IN_ALLOCATION:
        return current_step(run, a, job.nodes)[1]
    return a.nodes or job.nodes


def _stopped_now(run: RunRecord, a: AttemptRecord, job: JobInfo, obs: Observation) -> list[Record]:
    """The attempt stopped computing when Slurm killed it (the restart's KillWait counts from here)."""
    if a.ended_at is not None:
        return []
    state = "NODE_FAIL" if job.state_reason == "NodeDown" else job.state.value
    return [AttemptEnded(run.name, a.seq, obs.now, state, job.state_reason or state, job.exit_code)]


def _may_still_run(run: RunRecord, job: JobInfo, obs: Observation) -> tuple[str, ...]:
    """Nodes Slurm still completes the job on that are not fenced off (DOWN and kept out)."""
    out = []
    for name in job.nodes:
        info = obs.snapshot.nodes.get(name)
        if info is None or not info.down or name not in run.excluded:
            out.append(name)
    return tuple(out)


def _what_was_waited_for(job: JobInfo, lingering: tuple[str, ...], policy: Policy) -> str:
    fenced = tuple(n for n in job.nodes if n not in lingering)
    parts = [f"fenced-off {fmt_nodes(fenced)}"] if fenced else []
    if lingering:
        parts.append(
            f"{fmt_nodes(lingering)}, where its processes were killed within KillWait "
            f"({policy.kill_wait_s:g} s) + {KILL_MARGIN_S:g} s"
        )
    return f"the old job is left only on {' and '.join(parts)} (Slurm still completing it there)"
