"""Null collaborators: what the engine uses when a run has no log to follow, no checkpoints to
watch or no node agents reporting. They answer "nothing new", so the tick has no ``is None``
branches."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from supervisor.domain.actions import Record
from supervisor.domain.checkpoints.memory import MemoryGeneration, MemoryRestore
from supervisor.domain.checkpoints.resume import ResumePlan
from supervisor.domain.cluster import ClusterSnapshot
from supervisor.domain.health.findings import NodeFinding
from supervisor.domain.pace.peer_groups import Imbalance
from supervisor.domain.progress.hang import HangPace
from supervisor.domain.records import RunRecord
from supervisor.engine.watch.progress import SpikeNotice
from supervisor.engine.watch.save_check import SaveChecks
from supervisor.ports import Store


class NoProgress:
    """No training logs are read: no hangs, spikes, slowdowns or straggler findings."""

    enabled = False

    def update(self, runs: Iterable[RunRecord], snap: ClusterSnapshot, now: float) -> dict[str, dict[str, Any]]:
        return {}

    def take_notices(self) -> list[SpikeNotice]:
        return []

    def take_imbalances(self) -> list[tuple[str, tuple[int, int], Imbalance]]:
        return []

    def take_slowdowns(self) -> list[tuple[str, tuple[int, int], dict[str, Any]]]:
        return []

    def take_findings(self) -> list[NodeFinding]:
        return []

    def last_step(self, job_id: int, restart_count: int) -> int | None:
        return None

    def memory(self, job_id: int, restart_count: int) -> MemoryGeneration | None:
        return None

    def take_restores(self) -> list[tuple[str, tuple[int, int], MemoryRestore]]:
        return []

    def step_time(self, job_id: int, restart_count: int) -> float | None:
        return None

    def next_deadline(self, now: float) -> float | None:
        return None

    def load_failure(self, job_id: int, restart_count: int) -> str | None:
        return None

    def failed_before_load(self, job_id: int, restart_count: int) -> str | None:
        return None

    def hang_pace(self, job_id: int, restart_count: int) -> HangPace | None:
        return None

    def save_s(self, job_id: int, restart_count: int) -> float | None:
        return None


class NoCheckpoints:
    """No checkpoint storage is watched: no verdicts, and no resume plan for new attempts."""

    def update(self, runs: Iterable[RunRecord], store: Store) -> None:
        return None

    def verified_at(self, runs: Iterable[RunRecord], store: Store) -> dict[str, float]:
        return {}

    def refresh(self, run: RunRecord, store: Store) -> str | None:
        return None

    def saved_now(self, runs: Iterable[RunRecord], store: Store) -> SaveChecks:
        return SaveChecks()

    def resume_for(self, run: RunRecord, store: Store) -> ResumePlan | None:
        return None

    def write_through(self, writer: Callable[[Sequence[Record]], None]) -> None:
        return None


class NoHealthFeed:
    """No node agents or hooks report."""

    enabled = False

    def drain_findings(self) -> list[NodeFinding]:
        return []

    def heartbeat_ages(self, now: float) -> Mapping[str, float]:
        return {}
