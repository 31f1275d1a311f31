"""Test support: a private multi-node Slurm cluster on this host (``LocalSlurm``); the engine put
together once for tests (``EngineHarness``); job output in memory that keeps to the contract of the
real ``LogTail`` (``MemoryLog``, ``MemoryLogs``)."""

from supervisor.testing.engine import EngineHarness
from supervisor.testing.localslurm import LocalSlurm, LocalSlurmError, unavailable_reason
from supervisor.testing.logs import MemoryLog, MemoryLogs

__all__ = [
    "EngineHarness",
    "LocalSlurm",
    "LocalSlurmError",
    "MemoryLog",
    "MemoryLogs",
    "unavailable_reason",
]
