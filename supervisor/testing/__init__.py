"""Test support: a private multi-node Slurm cluster on this host (``LocalSlurm``); the engine put
together once for tests (``EngineHarness``); job output in memory that keeps to the contract of the
real ``LogTail`` (``MemoryLog``, ``MemoryLogs``)."""

from supervisor.testing.kit.engine import EngineHarness
from supervisor.testing.kit.logs import MemoryLog, MemoryLogs
from supervisor.testing.slurm.localslurm import LocalSlurm, LocalSlurmError, unavailable_reason

__all__ = [
    "EngineHarness",
    "LocalSlurm",
    "LocalSlurmError",
    "MemoryLog",
    "MemoryLogs",
    "unavailable_reason",
]
