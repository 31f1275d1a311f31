"""The CLI on a login node whose daemon stands by (issue 33, item 4): reads are answered from the
shared store; a change is refused with where to go — the leader's host, its address and epoch —
instead of the store's bare "epoch 0 is older than the lease's" (the standby cannot write it)."""

from __future__ import annotations

import json

from supervisor.adapters.sqlite import SqliteStore
from supervisor.api import wire
from supervisor.api.access import Caller, Group, Instance
from supervisor.api.ops import Operations
from supervisor.domain.run import RunSpec
from supervisor.testing.kit.clock import ManualClock

TEAM = Instance(uid=2000, name="team-a", group=Group(3000, "team-a"), admins=Group(3100, "ops"))
ACCOUNT = Caller(2000, "team-a", frozenset({3000}))


def test_a_standby_answers_reads_and_refuses_changes_naming_the_leader(tmp_path):
    leader, standby = SqliteStore(tmp_path), SqliteStore(tmp_path)
    try:
        lease = leader.claim_lease("login2:4242:ab", "http://login2:8471", 15.0)
        leader.hold_epoch(lease.epoch)
        leader.add_run(RunSpec(name="llm", script="/x.sh", partition="main", nodes=2), 1.0, owner_uid=ACCOUNT.uid)
        standby.hold_epoch(0)  # what a standby's connections hold (engine.loop.leadership)
        ops = Operations(standby, ManualClock(), TEAM, None)
        runs = json.loads(ops.answer(ACCOUNT, wire.encode_request("runs", {})))
        assert [r["spec"]["name"] for r in runs["data"]] == ["llm"]
        refused = json.loads(ops.answer(ACCOUNT, wire.encode_request("cancel", {"run": "llm"})))
        assert (refused["ok"], refused["kind"]) == (False, "refused")
        assert "stands by" in refused["error"] and "login2:4242:ab at http://login2:8471, epoch 1" in refused["error"]
        assert not standby.get_run("llm").cancel_requested
    finally:
        leader.close(), standby.close()
