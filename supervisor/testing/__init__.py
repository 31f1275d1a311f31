"""Test support: a private multi-node Slurm cluster on this host (``LocalSlurm``)."""

from supervisor.testing.localslurm import LocalSlurm, LocalSlurmError, unavailable_reason

__all__ = ["LocalSlurm", "LocalSlurmError", "unavailable_reason"]
