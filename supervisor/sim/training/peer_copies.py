"""In-memory peer copies in the synthetic trainer: ``supervisor.telemetry.torch_peers`` on virtual
time, for a sharded layout (FSDP/ZeRO-3, tensor or pipeline shards: no rank's state is held by a
survivor, so nothing saves on failure).

Every ``peer_copies_steps`` steps (at a log line) the training thread snapshots its shards into
host memory (``peer_copy_s``, the one cost on the step's path); the exchange with the buddy node
runs beside training and the generation is complete ``peer_exchange_s`` later, when the trainer
writes ``{"ssv": 1, "event": "memory_checkpoint", "generation": S, ...}`` — the line the real daemon
reads. A step relaunched *in the same job* (in-allocation: a swap or a relaunch in place) restores
the newest generation complete before the crash, when it is newer than the checkpoint it was
offered, in ``peer_restore_s`` instead of the checkpoint's ``restore_s``, and writes
``"memory_restored"``; unless the plan says not to (``SSV_RESUME_MEMORY_STEP`` empty: a rollback).

What survives is the model's assumption, stated in bench/README.md: every failure the simulator
draws takes at most one node, whose copies its buddy holds (two adjacent nodes dying within one
exchange are not modelled), and a relaunched step's nodes keep their memory. A new job (a
resubmission) has none: the copies are in the old job's folder on the old job's nodes.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field

from supervisor.sim.faults.failures import FailureModel, Manifestation

ENV_MEMORY_STEP = "SSV_RESUME_MEMORY_STEP"
# Failures that take a node out of the job (a swap spends a hot spare on each): once the job's
# hot spares are spent the run is resubmitted, the one recovery the copies do not cover.
NODE_LOSING = frozenset((Manifestation.XID, Manifestation.ECC, Manifestation.NIC, Manifestation.HOST_DOWN))


@dataclass
class PeerMemory:
    """The copies of every job of the run: per job id, (complete at, step) of each generation."""

    copy_s: float
    exchange_s: float
    generations: dict[int, list[tuple[float, int]]] = field(default_factory=dict)
    made: int = 0
    restored: int = 0

    def boundary(self, job_id: int, at: float, step: int) -> tuple[float, str]:
        """A generation begun at ``at`` after ``step``'s line: (when it is complete, its line)."""
        done = at + self.copy_s + self.exchange_s
        self.generations.setdefault(job_id, []).append((done, step))
        self.made += 1
        return done, _line("memory_checkpoint", job_id, step)

    def truncate(self, job_id: int, at: float) -> None:
        """The job's step stopped at ``at``: a generation not complete by then never was."""
        kept = self.generations.get(job_id)
        while kept and kept[-1][0] > at:
            kept.pop()
            self.made -= 1

    def resume_point(self, job_id: int, env: Mapping[str, str], offered: int, now: float) -> int | None:
        """The newest generation of the job complete by ``now`` and newer than the checkpoint step
        ``offered``, unless the plan says "not from memory"; None: resume from the checkpoint."""
        told = env.get(ENV_MEMORY_STEP)
        if told is not None and not told.strip("0"):
            return None
        newer = [step for done, step in self.generations.get(job_id, ()) if done <= now and step > offered]
        return max(newer) if newer else None

    def restored_line(self, job_id: int, step: int, offered: int, seconds: float) -> str:
        self.restored += 1
        return _line("memory_restored", job_id, step, offered_step=offered, seconds=seconds)


def _line(event: str, job_id: int, step: int, **extra: object) -> str:
    manifest = hashlib.sha256(f"{job_id}:{step}".encode()).hexdigest()
    return json.dumps({"ssv": 1, "event": event, "generation": step, "manifest": manifest, **extra})


def storage_mtbf_s(model: FailureModel, gpus: int, hot_spares: int) -> float:
    """The MTBF Young/Daly trades the storage saves against, with peer copies in-allocation: the
    interruptions that still lose the work since the last storage save are the resubmissions, one
    each time the job's hot spares are spent (each node-losing failure takes one)."""
    total = sum(c.count for c in model.categories)
    losing = sum(c.count for c in model.categories if c.shows in NODE_LOSING)
    rate = model.rate_per_s(gpus) * losing / total
    return math.inf if rate <= 0 else hot_spares / rate
