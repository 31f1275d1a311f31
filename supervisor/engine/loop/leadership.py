"""One leader per instance (issue 33): this daemon's standing, claimed through the store every loop.

The daemons of one account on several login nodes share a store; the lease in it (``domain.lease``)
says which of them leads. Only the leader observes and acts; the others are standbys that claim
the lease again when it can have expired and take it over then, with the next epoch.

Three fences keep a leader that lost the lease without knowing it (a partition from the database,
a long pause) from changing anything:

1. *Self-fencing*: the lease lasts ``lease_s`` on the database's clock from the moment of the
   claim, which is after the claim was sent; this daemon acts only until ``lease_s - margin_s``
   after it sent the claim on its own monotonic clock (``may_act``, checked before every command
   that changes Slurm: ``GatedScheduler``). A claim that fails (the database unreachable) ends
   the standing at once: no tick runs until a claim succeeds again.
2. *The epoch on every write*: each store connection of the daemon holds the epoch it leads in
   (``LeaderLease.hold_epoch``); the store refuses, inside the write's own transaction, every write
   whose epoch is older than the lease's (``NotLeading``). A standby holds epoch 0: its API
   cannot change the store either.
3. *No settling under an action in flight*: a new leader finds the old one's open intents in the
   shared journal and settles them as a restarted daemon does, against a fresh snapshot. An action
   the old leader began before its deadline can still be reaching Slurm (one command lasts at most
   ``inflight_s``, the Slurm command timeout), so the first tick waits until every open intent of
   an older epoch is that old (``Standing.wait_s``).
"""

from __future__ import annotations

import os
import secrets
import socket
import time
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, replace
from enum import StrEnum

import structlog

from supervisor.domain.cluster import ClusterSnapshot, NodeChange, SubmitRequest
from supervisor.domain.health.quarantine import Quarantine
from supervisor.domain.lease import Lease
from supervisor.ports import Fencer, IntentJournal, LeaderLease, NodeGuard, NotLeading, Scheduler, TransientError

__all__ = [
    "GatedFencer",
    "GatedGuard",
    "GatedScheduler",
    "LeaseSettings",
    "Leadership",
    "LostLead",
    "Outage",
    "Role",
    "Standing",
    "new_holder",
]

log = structlog.get_logger("supervisor.leadership")

STANDBY_EPOCH = 0  # what a standby's connections hold: older than any lease, so every write is refused


@dataclass(frozen=True)
class LeaseSettings:
    lease_s: float = 15.0  # how long a claim holds on the database's clock
    margin_s: float = 3.0  # acting stops this long before the lease can end (clock rates, one command)
    inflight_s: float = 20.0  # the longest one Slurm command of the old leader may still be running
    retry_s: float = 1.0  # between claims while the database does not answer

    @property
    def renew_every_s(self) -> float:
        """The longest wait between two claims of the leader: three tries within one lease."""
        return self.lease_s / 3


class LostLead(Exception):
    """Another daemon took the lease while this one led: its memory of the runs may be stale, so it
    ends (systemd's ``Restart=`` starts it again, a fresh standby) rather than lead again later."""


class Role(StrEnum):
    LEADER = "leader"
    STANDBY = "standby"
    UNREACHABLE = "unreachable"  # the store did not answer: nobody here acts


@dataclass(frozen=True)
class Outage:
    """The store did not answer from ``since`` to ``until`` (wall clock); ``error``: the first failure."""

    since: float
    until: float
    error: str


@dataclass(frozen=True)
class Standing:
    """The outcome of one claim: what this daemon may do until the next."""

    role: Role
    lease: Lease | None  # as the claim saw it (None: the store did not answer)
    gained: bool = False  # this claim began this daemon's lead (a new epoch): re-adopt the runs
    wait_s: float = 0.0  # LEADER: wait this long before the first tick; else: until the next claim
    error: str = ""
    outage: Outage | None = None  # the store's silence this claim ended (for the leader's logbook)

    @property
    def leading(self) -> bool:
        return self.role is Role.LEADER

    def line(self) -> str:
        """For ``systemctl status``."""
        if self.role is Role.UNREACHABLE:
            return f"the store does not answer: nobody here acts ({self.error[:120]})"
        lease = self.lease
        assert lease is not None
        if self.leading:
            return f"leader, epoch {lease.epoch}"
        return f"standby; {lease.holder} leads at {lease.address} (epoch {lease.epoch})"


def new_holder() -> str:
    """This process's name in the lease: unique per start, even on one host (a restart is a new holder)."""
    return f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(4)}"


class Leadership:
    """Claims the lease for ``holder`` and fences this daemon's store connections with its epoch."""

    def __init__(
        self,
        lease: LeaderLease,
        journal: IntentJournal,
        fenced: Sequence[LeaderLease],
        *,
        holder: str,
        address: str,
        settings: LeaseSettings | None = None,
        monotonic: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
    ) -> None:
        self._lease, self._journal, self._fenced = lease, journal, tuple(fenced)
        self.holder, self.address = holder, address
        self.settings = settings or LeaseSettings()
        self._monotonic, self._wall = monotonic, wall
        self.epoch: int | None = None  # the epoch this daemon leads in (None: it does not lead)
        self._act_until = float("-inf")
        self._first_tick_at = float("-inf")  # a new leader's first tick waits for the old one's actions
        self._unreachable_since: float | None = None
        self._unreachable_error = ""
        self._hold(STANDBY_EPOCH)

    # ------------------------------------------------------------------ the claim

    def claim(self) -> Standing:
        sent = self._monotonic()
        try:
            seen = self._lease.claim_lease(self.holder, self.address, self.settings.lease_s)
        except TransientError as exc:
            return self._lost_contact(str(exc))
        outage = self._contact_back()
        if seen.holder != self.holder:
            return replace(self._standby(seen), outage=outage)
        gained = seen.epoch != self.epoch
        self._act_until = sent + seen.expires_in_s - self.settings.margin_s
        if gained:
            self.epoch = seen.epoch
            self._hold(seen.epoch)
            self._first_tick_at = sent + self._inflight_wait()
            log.warning("leadership_gained", epoch=seen.epoch, holder=self.holder, address=self.address)
        wait = max(0.0, self._first_tick_at - self._monotonic())
        return Standing(Role.LEADER, seen, gained=gained, wait_s=wait, outage=outage)

    def may_act(self) -> None:
        """Raise ``NotLeading`` unless this daemon leads and its lease surely still holds."""
        if self.epoch is None:
            raise NotLeading("this daemon is a standby: another login node's daemon leads the instance")
        if self._monotonic() >= self._act_until:
            raise NotLeading(
                f"the lease of epoch {self.epoch} was not renewed in time: acting stopped before it can expire"
            )

    def next_claim_in(self, standing: Standing, tick_delay_s: float) -> float:
        """How long the loop waits before it claims again (the leader renews within a third of a lease)."""
        if standing.role is Role.UNREACHABLE:
            return self.settings.retry_s
        if standing.leading:
            return min(max(tick_delay_s, standing.wait_s), self.settings.renew_every_s)
        assert standing.lease is not None  # a standby claims again as soon as the lease can have expired
        return min(self.settings.lease_s, max(standing.lease.expires_in_s, 0.0) + 0.05)

    def release(self) -> None:
        """A clean stop: the lease ends now, so a standby takes over at its next claim."""
        if self.epoch is None:
            return
        try:
            self._lease.release_lease(self.holder)
        except TransientError as exc:
            log.warning("lease_not_released", error=str(exc), note="a standby takes over when it expires")
        self._step_down()

    # ------------------------------------------------------------------ within

    def _standby(self, seen: Lease) -> Standing:
        if self.epoch is not None:
            log.error("leadership_lost", epoch=self.epoch, now_leads=seen.holder, new_epoch=seen.epoch)
            self._step_down()
            raise LostLead(f"{seen.holder} took the lease (epoch {seen.epoch})")
        return Standing(Role.STANDBY, seen)

    def _step_down(self) -> None:
        self.epoch, self._act_until = None, float("-inf")
        self._hold(STANDBY_EPOCH)

    def _lost_contact(self, error: str) -> Standing:
        self._act_until = float("-inf")  # nobody here acts until a claim succeeds again
        if self._unreachable_since is None:
            self._unreachable_since, self._unreachable_error = self._wall(), error
            log.error("store_unreachable", error=error, epoch=self.epoch, note="nothing is observed or done meanwhile")
        return Standing(Role.UNREACHABLE, None, error=error)

    def _contact_back(self) -> Outage | None:
        if self._unreachable_since is None:
            return None
        outage = Outage(self._unreachable_since, self._wall(), self._unreachable_error)
        log.warning("store_reachable", unreachable_s=round(outage.until - outage.since, 1))
        self._unreachable_since = None
        return outage

    @property
    def unreachable_since(self) -> float | None:
        """When the store stopped answering (wall clock), while it does not."""
        return self._unreachable_since

    def _hold(self, epoch: int) -> None:
        for store in self._fenced:
            store.hold_epoch(epoch)

    def _inflight_wait(self) -> float:
        """Seconds until no action of an older epoch's open intent can still be reaching Slurm."""
        try:
            opened = [i.opened_at for i in self._journal.open_actions()]
        except TransientError:
            return 0.0  # the tick's own reads will fail and retry
        if not opened:
            return 0.0
        return max(0.0, max(opened) + self.settings.inflight_s + 1.0 - self._wall())  # 1 s: login nodes' NTP


class GatedScheduler:
    """The Scheduler, with every command that changes Slurm gated by ``may_act`` (self-fencing);
    reads pass. A refused command raises ``NotLeading`` before anything reaches Slurm: the intent
    stays open, the tick ends, and the next leader settles it."""

    def __init__(self, inner: Scheduler, may_act: Callable[[], None]) -> None:
        self._inner, self._may_act = inner, may_act

    def __getattr__(self, name: str) -> object:  # reads and extras (snapshot_of, show_config)
        return getattr(self._inner, name)

    def snapshot(self, include_nodes: bool | Collection[str] = True) -> ClusterSnapshot:
        return self._inner.snapshot(include_nodes)

    def submit(self, request: SubmitRequest) -> int:
        self._may_act()
        return self._inner.submit(request)

    def requeue(self, job_id: int, *, hold: bool = False) -> None:
        self._may_act()
        self._inner.requeue(job_id, hold=hold)

    def hold(self, job_id: int) -> None:
        self._may_act()
        self._inner.hold(job_id)

    def release(self, job_id: int) -> None:
        self._may_act()
        self._inner.release(job_id)

    def cancel(self, job_id: int) -> None:
        self._may_act()
        self._inner.cancel(job_id)

    def set_excluded(self, job_id: int, nodes: Sequence[str]) -> None:
        self._may_act()
        self._inner.set_excluded(job_id, nodes)

    def set_node_state(self, node: str, change: NodeChange, reason: str) -> None:
        self._may_act()
        self._inner.set_node_state(node, change, reason)


class GatedGuard:
    """The node guard, its node changes gated by ``may_act``; its memory read freely."""

    def __init__(self, inner: NodeGuard, may_act: Callable[[], None]) -> None:
        self._inner, self._may_act = inner, may_act

    def set_node_state(self, node: str, change: NodeChange, run: str, reason: str) -> None:
        self._may_act()
        self._inner.set_node_state(node, change, run, reason)

    def quarantined(self) -> Mapping[str, Quarantine]:
        return self._inner.quarantined()


class GatedFencer:
    """The site's fence command, gated by ``may_act``."""

    def __init__(self, inner: Fencer, may_act: Callable[[], None]) -> None:
        self._inner, self._may_act = inner, may_act

    def fence(self, node: str) -> None:
        self._may_act()
        self._inner.fence(node)
