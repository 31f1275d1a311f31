"""The guard carries out a granted remedy (remedy.py decides it): the Slurm calls, then what the
guard's memory must know for the next decision. Each is idempotent, so a caller that lost the
answer may ask again: a reservation the caller holds already is kept, a removed one is no error,
a RESUME of a node already in service only removes the reservation."""

from __future__ import annotations

from supervisor.domain.cluster import NodeChange
from supervisor.guard.memory import Memory
from supervisor.guard.policy import Caller, Grant, Op, Request, Reservation, Verdict
from supervisor.guard.remedy import reservation_name
from supervisor.guard.slurm_node_jobs import NodeSlurm
from supervisor.ports import PermanentError


def carry_out_remedy(
    slurm: NodeSlurm, memory: Memory, caller: Caller, req: Request, verdict: Verdict, now: float, minutes: int
) -> None:
    if req.op == Op.RESERVE:
        _reserve(slurm, memory, caller, req.node, now, minutes)
    elif req.op == Op.REBOOT:
        slurm.reboot(req.node, verdict.reason)
    elif req.op == Op.UNRESERVE:
        _unreserve(slurm, memory, req.node)
    elif req.op == Op.RESUME:
        _resume(slurm, memory, caller, req.node, now)


def _reserve(slurm: NodeSlurm, memory: Memory, caller: Caller, node: str, now: float, minutes: int) -> None:
    held = memory.reservation(node)
    if held is not None and held.uid == caller.uid and now < held.until:
        return  # asked again: the caller holds it already
    if held is not None:  # ended, or an admin's: Slurm may still know it under the same name
        slurm.unreserve(held.name)
    name = reservation_name(node)
    slurm.reserve(name, node, caller.name, minutes)
    memory.record_reservation(Reservation(node, caller.uid, name, now, now + minutes * 60.0))


def _unreserve(slurm: NodeSlurm, memory: Memory, node: str) -> None:
    held = memory.reservation(node)
    slurm.unreserve(held.name if held is not None else reservation_name(node))
    memory.drop_reservation(node)


def _resume(slurm: NodeSlurm, memory: Memory, caller: Caller, node: str, now: float) -> None:
    """The node passed its owner's validation: back in service for every user (resumed while the
    reservation still keeps other jobs off, then the reservation removed), the caller's own fault
    forgiven, and its own drain ended (a RESUME grant)."""
    try:
        slurm.set_node_state(node, NodeChange.RESUME, "")
    except PermanentError as exc:
        if "invalid node state" not in str(exc).lower():  # 22.05's answer for a node in service already
            raise
    _unreserve(slurm, memory, node)
    memory.forgive(caller.uid, node)
    memory.record_grant(Grant(node, caller.uid, "RESUME", now))
