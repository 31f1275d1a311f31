"""Actions as journal entries: their parameters, how to perform them, and how to see they took effect.

An intent is written before the action runs and completed after. After a crash, an intent still
open is checked against a fresh snapshot: if Slurm shows the effect (the tagged job exists, the
node is down with our reason, the job is gone), it is completed without running again.

A submission's tag (``--comment``) carries a random nonce, journaled with the intent: a job is
taken for the one the intent submitted only when it carries that tag *and* belongs to the daemon's
own user. Other users can read every job's comment and guess the next intent id, and a job of
another run (running as the daemon's user) could submit one; neither can know the nonce.
"""

from __future__ import annotations

import secrets
from collections.abc import Mapping
from dataclasses import fields
from typing import Any

import structlog

from supervisor.domain.actions import (
    Action,
    ActionKind,
    Cancel,
    ChangeNode,
    Fence,
    Release,
    SetExcluded,
    StartSuccessor,
    Submit,
    SwapStep,
)
from supervisor.domain.checkpoints.resume import ResumePlan, resume_env
from supervisor.domain.checkpoints.signing import KEY_ENV
from supervisor.domain.cluster import ClusterSnapshot, JobState, NodeChange, SubmitRequest
from supervisor.domain.decide.exit_codes import continue_code
from supervisor.domain.observation import REASON_PREFIX
from supervisor.domain.records import Event, EventKind
from supervisor.domain.run import RestartMode, RunSpec

log = structlog.get_logger("supervisor.engine")

_TYPES: Mapping[str, type] = {
    ActionKind.SUBMIT: Submit,
    ActionKind.CANCEL: Cancel,
    ActionKind.NODE_STATE: ChangeNode,
    ActionKind.SET_EXCLUDED: SetExcluded,
    ActionKind.RELEASE: Release,
    ActionKind.FENCE: Fence,
    ActionKind.SWAP_STEP: SwapStep,
    ActionKind.START_SUCCESSOR: StartSuccessor,
}


def params_of(action: Action) -> dict[str, Any]:
    """The action as the intent's JSON parameters; ``action_from`` reads them back."""
    return {f.name: _param(getattr(action, f.name)) for f in fields(action) if f.name != "kind"}


def _param(value: Any) -> Any:
    if isinstance(value, tuple):
        return list(value)
    if isinstance(value, ResumePlan):
        return value.to_json()
    return value


def action_from(kind: str, params: Mapping[str, Any]) -> Action:
    cls = _TYPES[ActionKind(kind)]
    args = {k: tuple(v) if isinstance(v, list) else v for k, v in params.items()}
    if cls is ChangeNode:
        args["change"] = NodeChange(str(args["change"]))
    if (
        cls in (Submit, SwapStep, StartSuccessor) and args.get("resume") is not None
    ):  # also the plan dicts older daemons journaled
        args["resume"] = ResumePlan.from_json(args["resume"])
    return cls(**args)  # type: ignore[no-any-return]


def new_nonce() -> str:
    """The random part of a submission's tag (96 bits)."""
    return secrets.token_hex(12)


def submit_tag(run: str, store_id: str, intent_id: int, nonce: str = "") -> str:
    """The comment every submitted job carries: finds the job again after a crash. (Intents
    journaled by older daemons have no nonce.)"""
    return f"{REASON_PREFIX}:{run}:{store_id}:{intent_id}" + (f":{nonce}" if nonce else "")


def intent_tag(run: str, store_id: str, intent_id: int, params: Mapping[str, Any]) -> str:
    """The tag of a journaled intent (its nonce is in its parameters)."""
    return submit_tag(run, store_id, intent_id, str(params.get("nonce") or ""))


def submit_request(
    spec: RunSpec,
    action: Submit,
    tag: str,
    seq_hint: int,
    *,
    token: str | None = None,
    ingest_url: str | None = None,
    manifest_key: bytes | None = None,
) -> SubmitRequest:
    env = dict(spec.env)
    env["SLURM_SUPERVISOR_RUN"] = spec.name
    env["SLURM_SUPERVISOR_ATTEMPT"] = str(seq_hint)
    if token and ingest_url:  # for the node agents: `slurm-supervisor agent` reads both
        env["SLURM_SUPERVISOR_URL"] = ingest_url
        env["SLURM_SUPERVISOR_TOKEN"] = token
    if manifest_key is not None:  # the trainer's commit signs its manifests (domain.checkpoints.signing)
        env[KEY_ENV] = manifest_key.hex()
    if action.resume is not None:
        env.update(resume_env(action.resume) if action.after_job is None else _resume_at_start(action.resume))
    if spec.save_on_failure_s > 0:  # the launcher's srun, or the batch script's, leaves the survivors this long
        env["SSV_SAVE_ON_FAILURE_S"] = f"{spec.save_on_failure_s:g}"
    in_allocation = spec.restart_mode is RestartMode.IN_ALLOCATION
    if in_allocation:  # the launcher runs the step on SSV_RUN_NODES of the job's nodes, the rest warm
        env["SSV_RUN_NODES"] = str(spec.nodes)
    env.update(continuation_env(spec))
    return SubmitRequest(
        run=spec.name,
        script=spec.script,
        job_name=spec.name,
        partition=spec.partition,
        nodes=spec.nodes + (_hot_spares(spec, action) if in_allocation else 0),
        comment=tag,
        exclude=action.exclude,
        extra_args=(("--no-kill",) if in_allocation else ())
        + prequeue_args(action)
        + signal_args(spec)
        + spec.sbatch_args,
        env=env,
        output=spec.output,
        workdir=spec.workdir,
        requeue=spec.restart_mode is RestartMode.REQUEUE,
    )


def prequeue_args(action: Submit) -> tuple[str, ...]:
    """A pre-queued successor: held (released once its predecessor's end is judged), and behind
    the predecessor besides (Slurm starts it only after that job has left)."""
    if action.after_job is None:
        return ()
    return ("--hold", f"--dependency=afterany:{action.after_job}")


def _resume_at_start(plan: ResumePlan) -> dict[str, str]:
    """A pre-queued successor's environment is fixed before its predecessor's last save: the
    checkpoint is in the resume file, rewritten just before its hold is released."""
    assert plan.file, "pre-queueing needs [checkpoints] resume_file (config.continuation_section)"
    return {"SSV_RESUME_FILE": plan.file, "SSV_RESUME_FROM_FILE": "1"}


def signal_args(spec: RunSpec) -> tuple[str, ...]:
    """``[continuation]``: Slurm signals the job ``lead_s`` before its time limit, so the trainer
    saves and ends on purpose (a --signal of the spec's own sbatch_args wins: it comes later)."""
    policy = spec.continuation
    if policy is None or policy.signal is None:
        return ()
    return (f"--signal={'B:' if policy.batch_shell else ''}{policy.signal}@{policy.lead_s}",)


def continuation_env(spec: RunSpec) -> dict[str, str]:
    """What the trainer needs to end on purpose: the continue code, and the signal it is sent."""
    env = {"SSV_CONTINUE_EXIT_CODE": str(continue_code(spec))}
    policy = spec.continuation
    if policy is not None and policy.signal is not None:
        env["SSV_CONTINUE_SIGNAL"] = policy.signal
        env["SSV_CONTINUE_LEAD_S"] = str(policy.lead_s)
    return env


def _hot_spares(spec: RunSpec, action: Submit) -> int:
    return spec.hot_spares if action.hot_spares is None else action.hot_spares


def effect_present(
    kind: str, tag: str, params: Mapping[str, Any], snap: ClusterSnapshot, uid: int | None = None
) -> dict[str, Any] | None:
    """The action's result if Slurm already shows its effect, else None. ``tag``: see submit_tag;
    ``uid``: the daemon's own user, the only one whose tagged job counts as submitted by it."""
    if kind == ActionKind.SUBMIT:
        return _submitted(tag, snap, uid)
    if kind in (ActionKind.CANCEL, ActionKind.SET_EXCLUDED, ActionKind.RELEASE, ActionKind.START_SUCCESSOR):
        job = snap.jobs.get(int(params["job_id"]))
        return _job_effect(kind, params, job)
    if kind == ActionKind.NODE_STATE:
        node = snap.nodes.get(params["node"])
        return _node_effect(params, node)
    return None  # FENCE: nothing in Slurm shows it; SWAP_STEP: the store does (Executor.settle_open_intents)


def _submitted(tag: str, snap: ClusterSnapshot, uid: int | None) -> dict[str, Any] | None:
    """The job the submission made: the daemon's own job with the tag. Another user's job with it
    is someone copying the tag, and two of ours a double submission: both are logged as errors."""
    tagged = snap.jobs_with_comment(tag)
    ours = sorted(j.job_id for j in tagged if j.user_id is not None and j.user_id == uid)
    foreign = sorted(j.job_id for j in tagged if j.job_id not in ours)
    if foreign:
        log.error("intent_tag_on_foreign_jobs", tag=tag, jobs=foreign, own_uid=uid)
    if not ours:
        return None
    if len(ours) > 1:
        log.error("intent_duplicate_jobs", tag=tag, jobs=ours)
        return {"job_id": ours[0], "found": True, "duplicates": ours[1:]}
    return {"job_id": ours[0], "found": True}


def duplicate_warnings(run: str, intent: int, outcome: Mapping[str, Any], now: float) -> list[Event]:
    """The logbook warning for a submission found twice in Slurm (the run follows the first)."""
    extra = list(outcome.get("duplicates") or ())
    if not extra:
        return []
    jobs = ", ".join(str(j) for j in extra)
    message = (
        f"one submission shows up as several jobs in Slurm: following job {outcome['job_id']}, not {jobs};"
        f" check them (squeue -j {outcome['job_id']},{','.join(str(j) for j in extra)}) and cancel the extra"
    )
    evidence = {"job_id": outcome["job_id"], "duplicates": extra}
    return [Event(run, EventKind.WARNING, message, f"{run}:duplicate-jobs:{intent}", now, evidence=evidence)]


def _job_effect(kind: str, params: Mapping[str, Any], job: Any) -> dict[str, Any] | None:
    if job is None:
        return {"job_gone": True}
    if kind == ActionKind.CANCEL:
        return {"state": job.state.value} if job.state.finished or job.completing else None
    if job.state is not JobState.PENDING:
        return {"state": job.state.value}
    if kind == ActionKind.SET_EXCLUDED:
        # The very list asked for: a list that drops a node is not done while Slurm holds a longer one.
        return {"excluded": list(job.excluded_nodes)} if set(params["nodes"]) == set(job.excluded_nodes) else None
    return None if job.held else {"held": False}


def _node_effect(params: Mapping[str, Any], node: Any) -> dict[str, Any] | None:
    if node is None:
        return None
    ours = node.reason.startswith(REASON_PREFIX)
    change = NodeChange(params["change"])
    if change is NodeChange.DOWN and node.down and ours:
        return {"state": node.state.value, "reason": node.reason}
    if change is NodeChange.DRAIN and node.drained and ours:
        return {"state": node.state.value, "reason": node.reason}
    if change is NodeChange.RESUME and not node.down and not node.drained:
        return {"state": node.state.value}
    return None
