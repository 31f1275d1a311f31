"""What every store keeps as text and reads back the same way: run specs, attempts, logbook events,
checkpoint verifications, node lists and resume plans.

SQLite's and PostgreSQL's stores (``adapters.sqlite``, ``adapters.postgres``) hold the same
columns under the same names; a row is read by name (``sqlite3.Row`` and psycopg's ``dict_row``
both answer ``row["column"]``), so one decoder serves both and the two stores cannot drift apart
in what they hand the engine. Decodings of texts read every tick are cached: what comes back is
immutable (tuples, frozen dataclasses), so one decoding can be handed out again.
"""

from __future__ import annotations

import json
from dataclasses import asdict
from functools import lru_cache
from typing import Any, Protocol

from supervisor.domain.checkpoints.manifest import Guarantee, Level, Outcome, ShardProblem, VerifyResult
from supervisor.domain.checkpoints.resume import ResumePlan
from supervisor.domain.progress.hang import HangPace
from supervisor.domain.records import AttemptRecord, Event, EventKind
from supervisor.domain.run import (
    CheckpointPolicy,
    ContinuationPolicy,
    ExitMeaning,
    RestartMode,
    RestartPacing,
    RunSpec,
    SparePolicy,
    SpikePolicy,
)


class Row(Protocol):
    """A stored row, read by column name."""

    def __getitem__(self, key: str, /) -> Any: ...


@lru_cache(maxsize=512)
def names(text: str | None) -> tuple[str, ...]:
    """A stored list of node names (None or empty: none)."""
    return tuple(json.loads(text or "[]"))


@lru_cache(maxsize=256)
def resume_plan(text: str) -> ResumePlan:
    """A stored resume plan (``ResumePlan.to_json``'s text)."""
    return ResumePlan.from_json(json.loads(text))


def spec_to_json(spec: RunSpec) -> dict[str, Any]:
    d = asdict(spec)
    d["env"] = dict(spec.env)
    d["do_not_restart_exit_codes"] = sorted(spec.do_not_restart_exit_codes)
    d["exit_codes"] = {str(code): meaning.value for code, meaning in spec.exit_codes.items()}
    return d


@lru_cache(maxsize=256)
def spec_of(text: str) -> RunSpec:
    """A stored spec, decoded once: every tick reads the runs, and a spec changes only when its
    owner edits it (a new text). A frozen value, handed out again."""
    return spec_from_json(json.loads(text))


def spec_from_json(d: dict[str, Any]) -> RunSpec:
    return RunSpec(
        **{
            **d,
            "sbatch_args": tuple(d["sbatch_args"]),
            "spare_nodes": tuple(d["spare_nodes"]),
            "spare_policy": SparePolicy(d["spare_policy"]),
            "restart_mode": RestartMode(d["restart_mode"]),
            "do_not_restart_exit_codes": frozenset(d["do_not_restart_exit_codes"]),
            "checkpoints": CheckpointPolicy(**d["checkpoints"]) if d.get("checkpoints") else None,
            "spikes": SpikePolicy(**d["spikes"]) if d.get("spikes") else SpikePolicy(),
            "pacing": RestartPacing(**d["pacing"]) if d.get("pacing") else RestartPacing(),
            "exit_codes": {int(code): ExitMeaning(m) for code, m in (d.get("exit_codes") or {}).items()},
            "continuation": ContinuationPolicy(**d["continuation"]) if d.get("continuation") else None,
        }
    )


def attempt_from_row(r: Row) -> AttemptRecord:
    return AttemptRecord(
        run=r["run"],
        seq=r["seq"],
        job_id=r["job_id"],
        restart_count=r["restart_count"],
        submitted_at=r["submitted_at"],
        nodes=names(r["nodes"]),
        excluded=names(r["excluded"]),
        started_at=r["started_at"],
        ended_at=r["ended_at"],
        end_state=r["end_state"],
        end_reason=r["end_reason"],
        exit_code=r["exit_code"],
        last_step=r["last_step"],
        step_time_s=r["step_time_s"],
        hang_pace=HangPace.from_json(json.loads(r["hang_pace"])) if r["hang_pace"] else None,
        load_failed=r["load_failed"],
        failed_before_load=r["failed_before_load"],
        save_s=r["save_s"],
        continued_with=r["continued_with"],
        preempted_at=r["preempted_at"],
    )


def event_from_row(r: Row) -> Event:
    return Event(
        r["run"],
        EventKind(r["kind"]),
        r["message"],
        r["key"],
        r["at"],
        r["attempt"],
        r["job_id"],
        r["actor"],
        json.loads(r["evidence"]),
    )


def event_evidence(e: Event) -> str:
    return json.dumps(e.evidence, default=str)


def result_to_json(r: VerifyResult) -> dict[str, Any]:
    d = asdict(r)
    d["problems"] = [asdict(p) for p in r.problems]
    return d


def result_from_json(text: str | None) -> VerifyResult | None:
    if not text:
        return None
    d = json.loads(text)
    return VerifyResult(
        **{
            **d,
            "level": Level(d["level"]),
            "outcome": Outcome(d["outcome"]),
            "guarantee": Guarantee(d["guarantee"]),
            "problems": tuple(ShardProblem(**p) for p in d["problems"]),
        }
    )


def action_from_row(r: Row) -> dict[str, Any]:
    """One intent of the journal with its status and result (tests read the whole journal)."""
    return {
        "id": r["id"],
        "run": r["run"],
        "kind": r["kind"],
        "params": json.loads(r["params"]),
        "status": r["status"],
        "created_at": r["created_at"],
        "completed_at": r["completed_at"],
        "result": json.loads(r["result"]) if r["result"] else None,
        "epoch": r["epoch"],  # the leader epoch it was journaled under (None: no lease held)
    }
