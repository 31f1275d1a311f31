"""Save on failure: a run whose trainer's surviving ranks save a checkpoint when a rank fails
(``[checkpoints] save_on_failure_s``, docs/checkpoints.md) is not stopped the moment a node of it
faults. Its step (in-allocation) or job (resubmitting) is given that long from the fault's onset to
save and exit by itself; the restart then resumes from the survivors' checkpoint and loses about a
step instead of the work since the last periodic save. Stopping it at once (a relaunch, a cancel)
would kill the survivors in the middle of their save. Pure.

Held only for faults that kill a node's ranks and leave the others running with an error: a fatal
finding of a node agent or hook (an XID, an uncorrectable ECC error), whose time — the daemon's
clock when it judged the report — is the onset. A node that is dead, DOWN or not responding is not
waited for: its peers hang in the collective until NCCL's watchdog fires, so nobody saves in time.
"""

from __future__ import annotations

from collections.abc import Mapping

from supervisor.domain.actions import Decision
from supervisor.domain.health.findings import Severity
from supervisor.domain.observation import Observation, event_for, fmt_nodes
from supervisor.domain.records import AttemptRecord, EventKind, RunRecord


def survivors_save_until(run: RunRecord, bad: Mapping[str, str], obs: Observation) -> float | None:
    """Until when the still-running step or job of ``run`` is left to its survivors' save, with
    ``bad`` its faulty nodes (None: stop it now)."""
    grace = run.spec.save_on_failure_s
    if grace <= 0 or not bad:
        return None
    onsets = [_onset(node, obs) for node in bad]
    if any(onset is None for onset in onsets):
        return None
    until = min(onset for onset in onsets if onset is not None) + grace
    return until if obs.now < until else None


def _onset(node: str, obs: Observation) -> float | None:
    """When ``node``'s ranks died with their peers still running (None: not such a fault)."""
    info = obs.snapshot.nodes.get(node)
    if node in obs.dead or info is None or info.down or not info.responding:
        return None
    found = obs.findings.get(node)
    return found.at if found is not None and found.severity is Severity.FATAL else None


def hold_for_survivors(
    run: RunRecord, a: AttemptRecord, bad: Mapping[str, str], until: float, what: str, obs: Observation
) -> Decision:
    """No action until ``until`` (or the step/job ends first): one logbook line, decided again then."""
    nodes = tuple(sorted(bad))
    grace = run.spec.save_on_failure_s
    message = (
        f"{a.label}: {fmt_nodes(nodes)} faulted; the {what} is left up to {grace:.0f} s from the fault for its "
        f"surviving ranks to save a checkpoint and exit (save_on_failure_s), then stopped if it still runs"
    )
    evidence = {"save_on_failure_s": grace, "until": until, "bad_nodes": dict(bad)}
    note = event_for(run, a, EventKind.NOTE, message, obs, evidence, f"survivors-save:{','.join(nodes)}")
    return Decision((note,), recheck_at=until)
