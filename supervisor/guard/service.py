"""The guard's work on one request line: decode it, check its shape, gather the facts (the jobs on
the node at that moment, the grants it remembers), decide (``policy.decide``), act (``scontrol``
through ``NodeSlurm``, the memory), audit, answer. One request at a time: a lock makes the cap
count every grant before the next decision, whichever instance asks.

A DOWN asked by a non-admin is made in two steps, so that no other user's job can be on the node
when it goes down (review 2026-12-02, finding 1: the window between the guard's read and its
``scontrol``): the node is drained first (from then on Slurm starts no job there), the jobs on it
are read again, and only if the policy still grants it is it downed.

What any local user can make it do is bounded (review 2026-12-02, finding 4): a request's shape is
checked before Slurm is read, a UID's DOWN/DRAIN requests that reach Slurm are rate-limited
(``ratelimit``), and its repeated refusals are folded in the audit log. QUARANTINE reads take no
decision lock: they are answered from a copy at most ``QUARANTINE_FRESH_S`` old, rebuilt after
every change of the memory.

The remedies (RESERVE, REBOOT, UNRESERVE, a non-admin's RESUME) are decided by ``remedy`` and
carried out by ``remedies``."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import Any

import structlog

from supervisor.adapters.guard_client import MAX_LINE
from supervisor.domain.cluster import NodeChange
from supervisor.domain.health.quarantine import Fault, QuarantineSettings, quarantined
from supervisor.guard.audit import AuditLog, entry
from supervisor.guard.memory import Memory, MemoryUnreachable
from supervisor.guard.policy import (
    FOLLOW_UP_S,
    Caller,
    Facts,
    Grant,
    Limits,
    Op,
    Request,
    Verdict,
    clean_cause,
    decide,
    problem,
)
from supervisor.guard.ratelimit import RateLimit
from supervisor.guard.remedies import carry_out_remedy
from supervisor.guard.remedy import decide_request, is_remedy
from supervisor.guard.slurm_node_jobs import NodeSlurm
from supervisor.ports import PortError, TransientError

log = structlog.get_logger("supervisor.guard")

QUARANTINE_FRESH_S = 1.0  # how old a QUARANTINE answer may be (holds end by the clock, not only by writes)


class Guard:
    def __init__(
        self,
        *,
        slurm: NodeSlurm,
        memory: Memory,
        audit: AuditLog,
        limits: Limits,
        quarantine: QuarantineSettings,
        clock: Callable[[], float] = time.time,
        rate: RateLimit | None = None,
    ) -> None:
        self.slurm, self.memory, self.audit = slurm, memory, audit
        self.limits, self.quarantine, self.clock = limits, quarantine, clock
        self.rate = rate or RateLimit()
        self._lock = threading.Lock()  # one decision at a time
        self._read_lock = threading.Lock()  # one QUARANTINE rebuild at a time
        self._read: tuple[int, float, bytes] | None = None  # (memory version, built at, answer line)

    def handle_line(self, caller: Caller, line: bytes) -> bytes:
        """One request line in, one answer line out."""
        req = parse_request(line)
        if req.op == Op.QUARANTINE:  # read only: not audited (every daemon asks every tick), no decision lock
            return self._quarantine_line()
        with self._lock:
            return _line(self.handle(caller, req))

    def handle(self, caller: Caller, req: Request) -> dict[str, Any]:
        now = self.clock()
        if req.op == Op.QUARANTINE:
            return {"ok": True, "granted": True, "rule": "read", "quarantined": self.quarantine_json(now)}
        transient = False
        try:
            verdict = self._limited(caller, req, now)  # before Slurm is read
            if verdict is None:
                with self.memory.deciding():  # one decision at a time across every guard sharing it
                    verdict = decide_request(caller, req, self._facts(req, now), self.limits)
                    verdict = self._carry_out(caller, req, verdict, now)
        except (
            MemoryUnreachable
        ) as exc:  # a shared memory away: refused as transient (a change Slurm made stands; docs/guard.md)
            verdict, transient = Verdict(False, "memory-unreachable", str(exc)[:500]), True
        except PortError as exc:  # Slurm did not answer, or refused the guard itself
            verdict, transient = Verdict(False, "slurm-error", str(exc)[:500]), isinstance(exc, TransientError)
        self.audit.record(entry(caller, req, verdict, now))
        return answer(verdict, transient=transient or verdict.rule == "rate-limited")

    def _limited(self, caller: Caller, req: Request, now: float) -> Verdict | None:
        """A refusal when this well-formed DOWN/DRAIN of a non-admin would read Slurm too often."""
        if caller.admin(self.limits.admin_groups) or problem(req):
            return None
        if req.op not in (Op.DOWN, Op.DRAIN) and not is_remedy(caller, req, self.limits):
            return None
        if self.rate.allow(caller.uid, now):
            return None
        why = f"{caller.name} asks too often: at most {self.rate.rate_per_s:g} per second after {self.rate.burst:g}"
        return Verdict(False, "rate-limited", why, frees_at=self.rate.next_at(caller.uid))

    def _quarantine_line(self) -> bytes:
        with self._read_lock:
            try:
                return self._fresh_quarantine_line()
            except MemoryUnreachable as exc:  # a shared memory away: the last answer, or why none
                if self._read is not None:
                    return self._read[2]
                return _line(answer(Verdict(False, "memory-unreachable", str(exc)[:500]), transient=True))

    def _fresh_quarantine_line(self) -> bytes:
        version, now = self.memory.version, self.clock()
        if self._read is None or self._read[0] != version or now - self._read[1] > QUARANTINE_FRESH_S:
            quarantined = self.quarantine_json(now)
            self._read = (
                version,
                now,
                _line({"ok": True, "granted": True, "rule": "read", "quarantined": quarantined}),
            )
        return self._read[2]

    def _facts(self, req: Request, now: float) -> Facts:
        """Slurm is read only for a well-formed DOWN, DRAIN or RESERVE, and only about its node."""
        if req.op == Op.QUARANTINE or problem(req):
            return Facts(now)
        jobs = self.slurm.jobs_on(req.node) if req.op in (Op.DOWN, Op.DRAIN, Op.RESERVE) else ()
        grants = self._recent_grants(now)
        return Facts(now, jobs, grants, self.memory.own_drain(req.node), self.memory.reservation(req.node))

    def _recent_grants(self, now: float) -> tuple[Grant, ...]:
        return self.memory.grants(now - max(self.limits.window_s, FOLLOW_UP_S))

    def _carry_out(self, caller: Caller, req: Request, verdict: Verdict, now: float) -> Verdict:
        if not verdict.granted:
            return verdict
        if is_remedy(caller, req, self.limits):
            carry_out_remedy(self.slurm, self.memory, caller, req, verdict, now, self.limits.reservation_minutes)
        elif req.op in (Op.DOWN, Op.DRAIN):
            verdict = self._change_node(caller, req, verdict, now)
            if verdict.fault and verdict.granted:  # the node went out of service: a fault of it
                self._record_fault(caller, req, now)
        elif req.op == Op.RESUME:  # an admin returns a repaired node: its faults are forgiven too
            self.slurm.set_node_state(req.node, NodeChange.RESUME, "")
            self.memory.clear(req.node, now, caller.name)
        elif req.op == Op.CLEAR:
            self.memory.clear(req.node, now, caller.name)
        return verdict

    def _change_node(self, caller: Caller, req: Request, verdict: Verdict, now: float) -> Verdict:
        if req.op == Op.DOWN and verdict.rule != "admin":
            self._set(caller, req.node, Op.DRAIN, verdict, now)  # no job starts on it from here on
            again = decide(caller, req, self._facts(req, now), self.limits)
            if not again.granted:
                return replace(again, why=f"{again.why}; the node was drained (no job starts there), not downed")
        self._set(caller, req.node, req.op, verdict, now)
        return verdict

    def _set(self, caller: Caller, node: str, op: str, verdict: Verdict, now: float) -> None:
        self.slurm.set_node_state(node, NodeChange(op), verdict.reason)
        self.memory.record_grant(Grant(node, caller.uid, op, now, verdict.job, verdict.job_nodes))

    def _record_fault(self, caller: Caller, req: Request, now: float) -> None:
        """One fault per account and node, whatever run name it gives (the latest replaces the
        earlier): the shared memory counts how many accounts saw a node fail; each instance's own
        quarantine counts its own repeats."""
        fault = Fault(req.node, now, f"{caller.name}/{req.run}", clean_cause(req.cause), f"{caller.uid}:{req.node}")
        reach = now - self.quarantine.window_s - self.quarantine.max_s  # what quarantine_json still reads
        if not self.memory.record_fault(fault, caller.uid, reach):
            log.warning("guard.faults_full", uid=caller.uid, node=req.node, limit=self.memory.max_faults_per_uid)

    def quarantine_json(self, now: float) -> list[dict[str, Any]]:
        q = self.quarantine
        held = quarantined(self.memory.faults(now - q.window_s - q.max_s), self.memory.clears(), now, q)
        return [
            {
                "node": node,
                "since": item.since,
                "until": item.until,
                "faults": [{"at": f.at, "run": f.run, "reason": f.reason, "key": f.key} for f in item.faults],
            }
            for node, item in sorted(held.items())
        ]


def _line(answer: Mapping[str, Any]) -> bytes:
    return (json.dumps(answer, ensure_ascii=True) + "\n").encode("ascii")


def parse_request(line: bytes) -> Request:
    """A request from one line; anything malformed becomes a request ``decide`` refuses."""
    if len(line) > MAX_LINE:
        return Request(op="?", cause="request line too long")
    try:
        data = json.loads(line.decode("utf-8"))
    except (UnicodeDecodeError, ValueError):
        return Request(op="?")
    if not isinstance(data, Mapping):
        return Request(op="?")
    fields = {k: data.get(k) or "" for k in ("op", "node", "run", "cause")}
    if not all(isinstance(v, str) for v in fields.values()):
        return Request(op="?")
    return Request(op=fields["op"].upper(), node=fields["node"], run=fields["run"], cause=fields["cause"])


def answer(verdict: Verdict, *, transient: bool = False) -> dict[str, Any]:
    return {
        "ok": verdict.granted,
        "granted": verdict.granted,
        "rule": verdict.rule,
        "why": verdict.why,
        "job": verdict.job,
        "reason": verdict.reason,
        "frees_at": verdict.frees_at,
        "transient": transient,
    }
