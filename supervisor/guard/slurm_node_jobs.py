"""What the guard asks Slurm: the jobs on one node, and a node's state change.

The guard used to read every job in the cluster (``squeue --all --json``) for each DOWN or DRAIN,
as the SlurmUser, whom slurmctld does not rate-limit: any local user could make it dump the job
table at will (review 2026-12-02, finding 4). It now asks for the one node it decides about:
``squeue --nodelist=NODE`` in the formatted form, whose filters 22.05 honours (its ``--json``
ignores them), with a random field separator per call (``squeue_format``), so no job's name or
comment can shift a field. Slurm's own answer for the node is all the policy needs: who holds it.
"""

from __future__ import annotations

from typing import Protocol

from supervisor.adapters.slurm import squeue_format as fmt
from supervisor.adapters.slurm.cli import SlurmCli, node_state_argv
from supervisor.adapters.slurm.json_parsers import ParseError
from supervisor.domain.cluster import JobInfo, NodeChange
from supervisor.ports import PermanentError


class NodeSlurm(Protocol):
    """The two calls the guard makes (a stateful fake stands in for it in the unit tests)."""

    def jobs_on(self, node: str) -> tuple[JobInfo, ...]: ...

    def set_node_state(self, node: str, change: NodeChange, reason: str) -> None: ...


def node_jobs_argv(node: str, seps: fmt.Separators) -> list[str]:
    """Every job Slurm still holds whose node list names ``node``, in any state (the policy decides
    which states hold the node: ``policy.holds``). ``node`` is already checked by the policy's
    NODE_NAME (no brackets or commas: one node, never a hostlist)."""
    fields = f"--Format={seps.format(fmt.JOB_FIELDS)}"
    return ["squeue", "--noheader", "--all", "--states=all", f"--nodelist={node}", fields]


class GuardSlurm:
    """NodeSlurm over Slurm's CLI, through the daemon's own runner (``SlurmCli``: resolved clients,
    a clean environment, timeouts and errors mapped onto the port's)."""

    def __init__(self, cli: SlurmCli) -> None:
        self._cli = cli

    def jobs_on(self, node: str) -> tuple[JobInfo, ...]:
        seps = fmt.Separators.fresh()
        out = self._cli._run(node_jobs_argv(node, seps), extra_env=fmt.TIME_FORMAT_ENV)
        try:
            jobs = fmt.parse_jobs(out, seps).values()
        except (ParseError, TypeError, ValueError, KeyError) as exc:
            raise PermanentError(f"unexpected squeue answer for {node}: {exc}") from exc
        # squeue's --nodelist matches a job whose list names the node; keep only those, whatever it printed.
        return tuple(j for j in jobs if node in j.nodes)

    def set_node_state(self, node: str, change: NodeChange, reason: str) -> None:
        self._cli._run(node_state_argv(node, change, reason))
