"""What the guard asks Slurm: the jobs on one node, a node's state change, and the remedies: a
maintenance reservation of one node made and removed, a reboot through Slurm.

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
from supervisor.domain.text_safety import printable
from supervisor.guard.remedy import REBOOT_NEXT_STATE
from supervisor.ports import PermanentError


class NodeSlurm(Protocol):
    """The two calls the guard makes (a stateful fake stands in for it in the unit tests)."""

    def jobs_on(self, node: str) -> tuple[JobInfo, ...]: ...

    def set_node_state(self, node: str, change: NodeChange, reason: str) -> None: ...

    def reserve(self, name: str, node: str, user: str, minutes: int) -> None: ...

    def unreserve(self, name: str) -> None:
        """Idempotent: a reservation that is gone already is no error."""
        ...

    def reboot(self, node: str, reason: str) -> None: ...


def node_jobs_argv(node: str, seps: fmt.Separators) -> list[str]:
    """Every job Slurm still holds whose node list names ``node``, in any state (the policy decides
    which states hold the node: ``policy.holds``). ``node`` is already checked by the policy's
    NODE_NAME (no brackets or commas: one node, never a hostlist)."""
    fields = f"--Format={seps.format(fmt.JOB_FIELDS)}"
    return ["squeue", "--noheader", "--all", "--states=all", f"--nodelist={node}", fields]


def reserve_argv(name: str, node: str, user: str, minutes: int) -> list[str]:
    """A maintenance reservation of one node for one user, from now, ending by itself after
    ``minutes`` (a guard that forgets it leaves no node held for ever). MAINT: its time is booked as
    maintenance, not idle; IGNORE_JOBS: made even on a node whose job is still completing; FLEX: a
    job of the reservation may use nodes outside it too (the validation job's good peers)."""
    return [
        "scontrol",
        "create",
        "reservation",
        f"ReservationName={name}",
        f"Nodes={node}",
        "StartTime=now",
        f"Duration={minutes}",
        f"Users={user}",
        "Flags=MAINT,IGNORE_JOBS,FLEX",
    ]


def unreserve_argv(name: str) -> list[str]:
    return ["scontrol", "delete", f"ReservationName={name}"]


def reboot_argv(node: str, next_state: str, reason: str) -> list[str]:
    """ASAP: Slurm drains the node and reboots it once no job runs there (it kills none)."""
    return [
        "scontrol",
        "reboot",
        "ASAP",
        f"nextstate={next_state}",
        f"reason={' '.join(printable(reason).split())}",
        node,
    ]


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

    def reserve(self, name: str, node: str, user: str, minutes: int) -> None:
        self._cli._run(reserve_argv(name, node, user, minutes))

    def unreserve(self, name: str) -> None:
        try:
            self._cli._run(unreserve_argv(name))
        except PermanentError as exc:
            if "reservation is invalid" not in str(exc).lower():  # 22.05's words for "no such reservation"
                raise

    def reboot(self, node: str, reason: str) -> None:
        self._cli._run(reboot_argv(node, REBOOT_NEXT_STATE, reason))
