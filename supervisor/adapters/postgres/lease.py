"""The leader lease in PostgreSQL (``ports.LeaderLease``, the rule in ``domain.lease``).

The daemons of one account on several login nodes share the database; its clock
(``clock_timestamp()``) is the only one a lease is read against, so login nodes whose clocks
disagree still agree on who leads. A claim is one transaction under the store's writer lock: it
never interleaves with a fenced write block of another connection (``base.PostgresBase._begin``).
"""

from __future__ import annotations

from typing import Any

from supervisor.adapters.postgres.base import PostgresBase
from supervisor.domain.lease import Lease, LeaseRow, claimed

_NOW = "SELECT EXTRACT(EPOCH FROM clock_timestamp())::double precision AS now"
_READ = "SELECT holder, address, epoch, since, expires FROM leader WHERE id = 1"


class PostgresLease(PostgresBase):
    def claim_lease(self, holder: str, address: str, lease_s: float) -> Lease:
        with self._block(fenced=False) as db:
            current = _lease_row(db.execute(_READ + " FOR UPDATE").fetchone())
            now = _now(db)
            row = claimed(current, holder, address, now, lease_s)
            if row is not None:
                db.execute(
                    "INSERT INTO leader(id, holder, address, epoch, since, expires) VALUES (1, %s, %s, %s, %s, %s)"
                    " ON CONFLICT (id) DO UPDATE SET holder = EXCLUDED.holder, address = EXCLUDED.address,"
                    " epoch = EXCLUDED.epoch, since = EXCLUDED.since, expires = EXCLUDED.expires",
                    (row.holder, row.address, row.epoch, row.since, row.expires),
                )
        found = row or current
        assert found is not None, "a claim of an empty lease takes it"
        return found.seen_at(now)

    def release_lease(self, holder: str) -> None:
        with self._block(fenced=False) as db:
            db.execute("UPDATE leader SET expires = EXTRACT(EPOCH FROM clock_timestamp()) WHERE holder = %s", (holder,))

    def lease(self) -> Lease | None:
        row = _lease_row(self._one(_READ, ()))
        return row.seen_at(_now(self._db)) if row is not None else None


def _now(db: Any) -> float:
    return float(db.execute(_NOW).fetchone()["now"])


def _lease_row(r: Any) -> LeaseRow | None:
    if r is None:
        return None
    return LeaseRow(str(r["holder"]), str(r["address"]), int(r["epoch"]), float(r["since"]), float(r["expires"]))
