"""The leader lease of an instance (issue 33): one rule for every store, on the database's clock.

The daemons of one account on several login nodes share one store and elect one leader through it.
The lease is one row: who holds it, since when, until when, and the **epoch**, a number that grows
by one each time the lease changes holder and never goes back. Every write of the leader carries
its epoch and the store refuses a write whose epoch is older than the row's (the fencing token:
a leader that lost the lease without knowing it cannot change anything any more).

The rule, applied inside the store's claim transaction (``claimed``):

* nobody ever held it: ``holder`` takes it, epoch 1;
* ``holder`` holds it: renewed (same epoch, a new expiry), even just after it expired, as long as
  nobody took it meanwhile — nobody acted in between, so nothing can be duplicated;
* another holds it and it has not expired: left alone (``holder`` is a standby);
* it expired: ``holder`` takes it with the next epoch.

Pure: the store passes the row it read and the database's time.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["Lease", "LeaseRow", "claimed"]


@dataclass(frozen=True)
class Lease:
    """Who leads the instance, as the store read it. Times are the database's clock (seconds since
    the Unix epoch); ``expires_in_s``: how long the lease still held at the read (negative: expired)."""

    holder: str  # "HOST:PID:NONCE", unique per daemon process
    address: str  # where the holder's ingest answers (agents, hooks, launchers), or its host name
    epoch: int
    since: float  # when this holder took the lease (this epoch began)
    expires_in_s: float


@dataclass(frozen=True)
class LeaseRow:
    """The lease as stored."""

    holder: str
    address: str
    epoch: int
    since: float
    expires: float

    def seen_at(self, now: float) -> Lease:
        return Lease(self.holder, self.address, self.epoch, self.since, self.expires - now)


def claimed(current: LeaseRow | None, holder: str, address: str, now: float, lease_s: float) -> LeaseRow | None:
    """The row ``holder``'s claim writes at ``now``; None when the claim leaves the row as it is."""
    if lease_s <= 0:
        raise ValueError(f"a lease must last a positive time, not {lease_s}")
    if current is None:
        return LeaseRow(holder, address, 1, now, now + lease_s)
    if current.holder == holder:
        return LeaseRow(holder, address, current.epoch, current.since, now + lease_s)
    if current.expires > now:
        return None
    return LeaseRow(holder, address, current.epoch + 1, now, now + lease_s)
