"""The resume plan: which checkpoint a new incarnation starts from, and what it is told.

One typed value from the choice to the job. The engine builds it before a submission is journaled,
journals it with the intent (``to_json``), reads it back when a restarted daemon settles that
intent (``from_json``), turns it into the job's environment and resume file, and describes it in
the logbook. Its JSON keeps the shape the resume file and the journal have always had, so a job
that reads the file, and intents journaled by an older daemon, read the same.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from supervisor.domain.checkpoints.manifest import CheckpointRef, Guarantee, ResumeChoice
from supervisor.domain.checkpoints.memory import MemoryGeneration, describe_memory

RESUME_ENV = (
    "SSV_RESUME_CHECKPOINT",
    "SSV_RESUME_STEP",
    "SSV_RESUME_GUARANTEE",
    "SSV_RESUME_FILE",
    "SSV_SKIP_ITERATIONS",
    "SSV_LR_SCALE",
    "SSV_RESUME_MEMORY_STEP",
)


class ResumePlanError(ValueError):
    """A journaled plan that cannot be read back: wrong shape, or a value of the wrong kind."""


@dataclass(frozen=True)
class CheckpointPick:
    """A checkpoint as a plan names it: where it is, its step, what its verification is worth."""

    location: str
    step: int | None
    guarantee: Guarantee

    @classmethod
    def of(cls, ref: CheckpointRef) -> CheckpointPick:
        return cls(ref.location, ref.step, ref.guarantee)

    def to_json(self) -> dict[str, Any]:
        return {"location": self.location, "step": self.step, "guarantee": self.guarantee.value}

    @classmethod
    def from_json(cls, doc: object, where: str = "checkpoint") -> CheckpointPick:
        d = _object(doc, where)
        guarantee = _text(d, "guarantee", where)
        try:
            return cls(_text(d, "location", where), _optional_int(d, "step", where), Guarantee(guarantee))
        except ValueError as exc:
            raise ResumePlanError(f"{where}: guarantee {guarantee!r} is not a known layout") from exc


@dataclass(frozen=True)
class PassedOver:
    """A newer checkpoint the plan did not choose, and why (for the logbook and the job)."""

    checkpoint: CheckpointPick
    why: str

    def to_json(self) -> dict[str, Any]:
        return {**self.checkpoint.to_json(), "why": self.why}

    @classmethod
    def from_json(cls, doc: object, where: str = "skipped") -> PassedOver:
        return cls(CheckpointPick.from_json(doc, where), _text(_object(doc, where), "why", where))


@dataclass(frozen=True)
class RollbackRef:
    """The rollback this submission carries out: the spike's onset, the checkpoint before it, and
    the iterations it skips ("first-last", Megatron's ``--skip-train-iteration-range`` form)."""

    onset_step: int | None
    checkpoint_step: int
    skip: str

    def to_json(self) -> dict[str, Any]:
        return {"onset_step": self.onset_step, "checkpoint_step": self.checkpoint_step, "skip": self.skip}

    @classmethod
    def from_json(cls, doc: object) -> RollbackRef:
        d = _object(doc, "rollback")
        step = _optional_int(d, "checkpoint_step", "rollback")
        if step is None:
            raise ResumePlanError("rollback: checkpoint_step is missing")
        return cls(_optional_int(d, "onset_step", "rollback"), step, _text(d, "skip", "rollback"))


@dataclass(frozen=True)
class ResumePlan:
    """What a new incarnation is handed. ``chosen`` None: no verified checkpoint, so the job starts
    from scratch rather than load an unverified one. ``skip_iterations`` and ``lr_scale`` are None
    while the run has no rollback on record; once it has, every skip range stays in force (a later
    restart may resume before one)."""

    chosen: CheckpointPick | None
    fallbacks: tuple[CheckpointPick, ...] = ()  # older verified ones, newest first
    skipped: tuple[PassedOver, ...] = ()  # newer ones passed over
    reason: str = ""
    file: str | None = None  # the resume file written for the job; None when there is none
    skip_iterations: str | None = None  # every rollback's range: "first-last,first-last"
    lr_scale: float | None = None
    rollback: RollbackRef | None = None  # set when this submission is a rollback
    # A relaunch in the same job only: the peer copies' generation to restore (step 0: none, the
    # checkpoint); None: a new job, whose nodes' memory holds no copies (domain.checkpoints.memory)
    memory: MemoryGeneration | None = None

    @property
    def step(self) -> int | None:
        """The step the job resumes from (None: from scratch, or a checkpoint without a step)."""
        return self.chosen.step if self.chosen is not None else None

    def to_json(self) -> dict[str, Any]:
        doc: dict[str, Any] = {
            "checkpoint": self.chosen.to_json() if self.chosen is not None else None,
            "fallbacks": [f.to_json() for f in self.fallbacks],
            "skipped": [s.to_json() for s in self.skipped],
            "reason": self.reason,
            "file": self.file,
        }
        # Written only when set, as the resume file always had them: a job may test for the key.
        if self.skip_iterations is not None:
            doc["skip_iterations"] = self.skip_iterations
        if self.lr_scale is not None:
            doc["lr_scale"] = self.lr_scale
        if self.rollback is not None:
            doc["rollback"] = self.rollback.to_json()
        if self.memory is not None:
            doc["memory"] = self.memory.to_json()
        return doc

    @classmethod
    def from_json(cls, doc: object) -> ResumePlan:
        """Reads what ``to_json`` wrote, and the plan dicts journaled before this type existed
        (the same keys): a daemon upgraded mid-recovery still settles its open intents."""
        d = _object(doc, "resume plan")
        chosen = d.get("checkpoint")
        rollback, memory = d.get("rollback"), d.get("memory")
        return cls(
            chosen=CheckpointPick.from_json(chosen) if chosen is not None else None,
            fallbacks=tuple(CheckpointPick.from_json(f, "fallbacks") for f in _list(d, "fallbacks")),
            skipped=tuple(PassedOver.from_json(s) for s in _list(d, "skipped")),
            reason=_optional_text(d, "reason") or "",
            file=_optional_text(d, "file"),
            skip_iterations=_optional_text(d, "skip_iterations"),
            lr_scale=_optional_float(d, "lr_scale"),
            rollback=RollbackRef.from_json(rollback) if rollback is not None else None,
            memory=_memory(memory),
        )


def resume_plan(choice: ResumeChoice, *, file: str | None) -> ResumePlan:
    """The plan for a checkpoint choice, before any rollback terms are added."""
    return ResumePlan(
        chosen=CheckpointPick.of(choice.chosen) if choice.chosen is not None else None,
        fallbacks=tuple(CheckpointPick.of(r) for r in choice.fallbacks),
        skipped=tuple(PassedOver(CheckpointPick.of(r), why) for r, why in choice.skipped),
        reason=choice.reason,
        file=file,
    )


def resume_env(plan: ResumePlan) -> dict[str, str]:
    """Environment for the job. An empty SSV_RESUME_CHECKPOINT means: no verified checkpoint —
    start from scratch rather than load an unverified one."""
    chosen = plan.chosen
    env = {
        "SSV_RESUME_CHECKPOINT": chosen.location if chosen is not None else "",
        "SSV_RESUME_STEP": "" if plan.step is None else str(plan.step),
        "SSV_RESUME_GUARANTEE": chosen.guarantee.value if chosen is not None else "",
    }
    if plan.file:
        env["SSV_RESUME_FILE"] = plan.file
    if plan.skip_iterations:
        env["SSV_SKIP_ITERATIONS"] = plan.skip_iterations  # Megatron: --skip-train-iteration-range
    if _lr_changed(plan):
        env["SSV_LR_SCALE"] = f"{plan.lr_scale:g}"
    if plan.memory is not None:  # "": not from memory (a rollback, or no newer generation known)
        env["SSV_RESUME_MEMORY_STEP"] = str(plan.memory.step) if plan.memory.step else ""
    return env


def describe_plan(plan: ResumePlan) -> str:
    """One clause for the logbook line of the submission that hands the plan over."""
    passed = "; ".join(f"step {s.checkpoint.step} skipped: {s.why}" for s in plan.skipped[:3])
    if plan.chosen is None:
        text = "no verified checkpoint to resume from: the job starts from scratch"
    else:
        text = f"resuming from step {plan.chosen.step} ({plan.chosen.location})"
    if plan.rollback is not None:
        text += f", skipping iterations {plan.rollback.skip}"
        if _lr_changed(plan):
            text += f", LR ×{plan.lr_scale:g}"
        passed = ""  # newer checkpoints are passed over on purpose
    if memory := describe_memory(plan.memory):
        text += f"; {memory}"
    return f"{text}; {passed}" if passed else text


def _lr_changed(plan: ResumePlan) -> bool:
    return plan.lr_scale is not None and plan.lr_scale != 1.0


# --------------------------------------------------------------------------- reading JSON back


def _memory(doc: object) -> MemoryGeneration | None:
    try:
        return MemoryGeneration.from_json(doc) if doc is not None else None
    except ValueError as exc:
        raise ResumePlanError(str(exc)) from None


def _object(doc: object, where: str) -> Mapping[str, Any]:
    if not isinstance(doc, Mapping):
        raise ResumePlanError(f"{where}: expected an object, got {type(doc).__name__}")
    return doc


def _list(d: Mapping[str, Any], key: str) -> list[Any]:
    value = d.get(key)
    if value is None:
        return []
    if not isinstance(value, list | tuple):
        raise ResumePlanError(f"resume plan: {key} is not a list")
    return list(value)


def _text(d: Mapping[str, Any], key: str, where: str) -> str:
    value = d.get(key)
    if not isinstance(value, str):
        raise ResumePlanError(f"{where}: {key} {value!r} is not text")
    return value


def _optional_text(d: Mapping[str, Any], key: str) -> str | None:
    value = d.get(key)
    return None if value is None else _text(d, key, "resume plan")


def _optional_int(d: Mapping[str, Any], key: str, where: str) -> int | None:
    value = d.get(key)
    if value is None:
        return None
    if not isinstance(value, int) or isinstance(value, bool):
        raise ResumePlanError(f"{where}: {key} {value!r} is not an integer")
    return value


def _optional_float(d: Mapping[str, Any], key: str) -> float | None:
    value = d.get(key)
    if value is None:
        return None
    if not isinstance(value, int | float) or isinstance(value, bool):
        raise ResumePlanError(f"resume plan: {key} {value!r} is not a number")
    return float(value)
