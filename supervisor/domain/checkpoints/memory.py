"""Peer copies in host memory as the daemon knows them (docs/trainer-integration.md, *Peer copies in
memory*): the generations a trainer reports complete, the plan that names the newest one, and the
restore the relaunched step reports. Pure.

The trainer (``supervisor.telemetry.torch_peers``) writes two JSONL events on rank 0:

    {"ssv": 1, "event": "memory_checkpoint", "generation": 45, "manifest": "<sha256>"}
    {"ssv": 1, "event": "memory_restored", "generation": 45, "manifest": "<sha256>",
     "offered_step": 40, "seconds": 0.023, "moved_bytes": 81920}

No ``step`` field: they are not progress records. A line is read only when it is short, whole JSON
and every field has its type and range; anything else is not an event (a job's output is
untrusted). Only a relaunch *in the same job* can use the copies (they are in its nodes' memory,
in a folder of its job id), and never a rollback (it resumes before state the copies hold).
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, TypeGuard

MAX_LINE = 1024  # the events are ~200 bytes; a longer line is not one
MAX_STEP = 1 << 53  # a step JSON (and a float) holds exactly
MAX_SECONDS = 1e7
_DIGEST = re.compile(r"[0-9a-f]{64}")
_DECODER = json.JSONDecoder()


@dataclass(frozen=True)
class MemoryGeneration:
    """A generation of peer copies every rank kept and received: its step and its manifest's SHA-256.
    Step 0 in a plan: the relaunch is not to restore from memory (none known newer, or a rollback)."""

    step: int
    manifest: str = ""

    def to_json(self) -> dict[str, Any]:
        return {"step": self.step, "manifest": self.manifest}

    @classmethod
    def from_json(cls, doc: object) -> MemoryGeneration:
        if not isinstance(doc, Mapping):
            raise ValueError(f"memory: expected an object, got {type(doc).__name__}")
        step, manifest = doc.get("step"), doc.get("manifest")
        if not _step(step) or not isinstance(manifest, str) or (manifest and not _DIGEST.fullmatch(manifest)):
            raise ValueError(f"memory: step {step!r} / manifest {str(manifest)[:80]!r} is not a generation")
        return cls(step, manifest)


NO_MEMORY = MemoryGeneration(0)


@dataclass(frozen=True)
class MemoryRestore:
    """A relaunched step's report that it restored a generation from memory, not the checkpoint
    at ``offered_step`` it was handed."""

    generation: MemoryGeneration
    offered_step: int | None
    seconds: float | None
    moved_bytes: int | None


def memory_event(line: str) -> MemoryGeneration | MemoryRestore | None:
    """What one output line says of peer copies; None for every other line. Never raises."""
    if '"memory_' not in line or len(line) > MAX_LINE:
        return None
    brace = line.find("{")
    try:
        doc, _ = _DECODER.raw_decode(line[brace:]) if brace >= 0 else (None, 0)
    except (ValueError, RecursionError):
        return None
    if not isinstance(doc, dict) or doc.get("ssv") != 1 or type(doc.get("ssv")) is not int:
        return None
    generation = _generation(doc)
    if generation is None:
        return None
    if doc.get("event") == "memory_checkpoint":
        return generation
    if doc.get("event") == "memory_restored":
        offered, moved = doc.get("offered_step"), doc.get("moved_bytes")
        return MemoryRestore(generation, offered if _step(offered) else None, _seconds(doc.get("seconds")),
                             moved if _step(moved) else None)  # fmt: skip
    return None


def _generation(doc: Mapping[str, Any]) -> MemoryGeneration | None:
    step, manifest = doc.get("generation"), doc.get("manifest")
    if not _step(step) or step == 0 or not isinstance(manifest, str) or not _DIGEST.fullmatch(manifest):
        return None
    return MemoryGeneration(step, manifest)


def _step(value: object) -> TypeGuard[int]:
    return type(value) is int and 0 <= value < MAX_STEP


def _seconds(value: object) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value) if math.isfinite(value) and 0 <= value < MAX_SECONDS else None


def memory_for_relaunch(newest: MemoryGeneration | None, step: int | None, rollback: bool) -> MemoryGeneration:
    """What a relaunch in the job is told of memory: the newest reported generation when it is
    newer than the checkpoint it is handed (``step``; None: from scratch) and the relaunch is no
    rollback; else ``NO_MEMORY`` (restore from the checkpoint)."""
    if newest is None or rollback or newest.step <= (step or 0):
        return NO_MEMORY
    return newest


def describe_memory(memory: MemoryGeneration | None) -> str:
    """The plan's clause for the logbook ("" when it names no generation)."""
    if memory is None or not memory.step:
        return ""
    return f"peer copies in memory hold step {memory.step} (manifest {memory.manifest[:12]}): restored from them once verified"


def describe_restore(restore: MemoryRestore) -> str:
    """The logbook's words for a restore from memory."""
    gen = restore.generation
    offered = restore.offered_step
    instead = (
        f" instead of the checkpoint at step {offered} it was offered" if offered else " (no checkpoint was offered)"
    )
    kept = f"; {gen.step - offered} steps of work kept" if offered is not None and gen.step > offered else ""
    took = f" in {restore.seconds:.3f} s" if restore.seconds is not None else ""
    return (
        f"restored step {gen.step} from peer copies in memory (generation {gen.step}, manifest "
        f"{gen.manifest[:12]}, verified){took}{instead}{kept}; training resumes at step {gen.step + 1}"
    )
