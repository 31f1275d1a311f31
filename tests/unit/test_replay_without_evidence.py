"""No decision reads logbook evidence (issue 12): a scripted multi-fault run on the simulated
cluster, with the real engine and store, taken twice — once as it is, once with every logbook
event's evidence dropped as it is written — takes the same actions at the same times.

The scenario: a dead host, an XID, an NCCL hang, a loss divergence that does not heal (rollback to
a verified checkpoint with data skipped), a torn checkpoint passed over, and a mass fault past the
blast-radius cap. The logbook is for people; what decisions read back are typed records.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import replace
from pathlib import Path

from supervisor.adapters.sqlite import SqliteStore
from supervisor.domain.records import Event
from supervisor.sim.faults.failures import TABLE5, Category, Failure, Manifestation
from supervisor.sim.runner import Simulation
from supervisor.sim.training.settings import Mode, SimSettings
from supervisor.sim.training.trainer import TrainerSettings

HOUR = 3600.0


class EvidenceDropped(SqliteStore):
    """The real store, keeping every event's message and key but none of its evidence."""

    def record_event(self, event: Event) -> bool:
        return super().record_event(replace(event, evidence={}))


def _category(shows: Manifestation) -> Category:
    return next(c for c in TABLE5 if c.shows is shows)


def scenario() -> list[Failure]:
    xid, host, hang = (_category(m) for m in (Manifestation.XID, Manifestation.HOST_DOWN, Manifestation.HANG))
    out = [
        Failure(1.0 * HOUR, host, 0.10, 0.5, 0.5),
        Failure(2.0 * HOUR, xid, 0.40, 0.5, 0.5),
        Failure(3.0 * HOUR, hang, 0.70, 0.5, 0.5),
        Failure(4.5 * HOUR + 2.0, xid, 0.20, 0.9, 0.5),  # during a save: the save stays torn
    ]
    out += [Failure(10.0 * HOUR, xid, 0.05 + 0.07 * i, 0.3, 0.5) for i in range(12)]  # a mass fault
    return out


def simulate(state_dir: Path, open_store) -> tuple[list[tuple], Counter]:
    settings = SimSettings(
        gpus=256,
        spares=4,
        days=0.5,
        seed=7,
        trainer=TrainerSettings(diverge_at=(3300,), checkpoint_steps=150, save_s=300.0),
    )
    Simulation(settings, Mode.SUPERVISOR, state_dir, open_store=open_store).run(scenario())
    store = SqliteStore(state_dir)
    # The submit tag's nonce is random by design (issue 17: adoption cannot be forged); the rest
    # of each action must be the same.
    actions = [
        (a["kind"], {k: v for k, v in a["params"].items() if k != "nonce"}, a["status"], round(a["created_at"], 3))
        for a in store.actions()
    ]
    return actions, Counter(e.kind.value for e in store.events())


def test_decisions_are_the_same_without_any_logbook_evidence(tmp_path):
    actions, kinds = simulate(tmp_path / "as-is", SqliteStore)
    for kind in ("fault", "rollback", "mass_fault", "node_drained", "restarted", "checkpoint_corrupt", "node_returned"):
        assert kinds[kind], f"the scenario must exercise {kind}: {dict(kinds)}"
    stripped, _ = simulate(tmp_path / "no-evidence", EvidenceDropped)
    assert stripped == actions
