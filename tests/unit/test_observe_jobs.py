"""Which jobs a tick asks Slurm for (issue 14): the supervised jobs by id, and the account's whole
list only when a job may exist that the daemon knows by its tag alone (first read after a start,
a submission still open), when there are too many ids, or as a rate-limited safety net."""

from __future__ import annotations

from collections.abc import Collection
from typing import Any

from supervisor.domain.cluster import ClusterSnapshot, JobInfo, JobState
from supervisor.domain.health.findings import HeartbeatSettings
from supervisor.domain.health.quarantine import QuarantineSettings
from supervisor.domain.records import AttemptRecord, RunRecord
from supervisor.domain.run import RunSpec, RunState
from supervisor.engine.facts.job_reads import JobReadPlan, plan_job_read
from supervisor.engine.facts.nodes import NodeWatch
from supervisor.engine.facts.observe import JobScopedScheduler, Observer
from supervisor.engine.facts.probes import ProbeTracker
from supervisor.engine.watch.nulls import NoCheckpoints, NoHealthFeed, NoProgress
from supervisor.ports import Intent
from supervisor.testing.kit.clock import ManualClock


def run(name: str, job_id: int | None, state: RunState = RunState.RUNNING) -> RunRecord:
    spec = RunSpec(name=name, script="/s.sh", partition="main", nodes=1)
    attempt = AttemptRecord(name, 0, job_id, 0, 900.0, started_at=950.0) if job_id is not None else None
    return RunRecord(spec, state if attempt else RunState.REGISTERED, attempt=attempt)


def intent(kind: str, **params: Any) -> Intent:
    return Intent(1, "a", kind, params, 900.0)


def plan(runs, intents=(), age: float | None = 10.0, **kw) -> JobReadPlan:
    return plan_job_read(runs, list(intents), account_age_s=age, **{"every_s": 60.0, "max_ids": 4, **kw})


# ---------------------------------------------------------------------------- the planner


def test_known_jobs_are_read_by_id():
    p = plan([run("a", 11), run("b", 12), run("c", None)])
    assert p.ids == frozenset({11, 12}) and p.reason == "by id"


def test_the_first_read_after_a_start_is_the_accounts_list():
    """A previous daemon may have submitted a job it never journaled the id of."""
    p = plan([run("a", 11)], age=None)
    assert p.ids is None and p.reason == "first read"


def test_an_open_submission_is_looked_for_in_the_accounts_list():
    """Its job (if sbatch made one) is known by its tag alone: a read by id would miss it, and the
    intent would be performed again — a second job."""
    p = plan([run("a", 11)], [intent("submit", run="a", nonce="x")])
    assert p.ids is None and p.reason == "submission open"


def test_the_job_of_another_open_intent_is_read_by_id():
    p = plan([run("a", 11)], [intent("cancel", run="a", job_id=9), intent("node_state", run="a", node="n1")])
    assert p.ids == frozenset({9, 11})


def test_too_many_ids_are_one_account_read():
    p = plan([run(f"r{i}", 10 + i) for i in range(5)])
    assert p.ids is None and p.reason == "many jobs"


def test_the_accounts_list_is_read_again_when_it_is_old_unless_the_tick_is_busy():
    assert plan([run("a", 11)], age=60.0).ids is None
    assert plan([run("a", 11)], age=60.0).reason == "refresh"
    assert plan([run("a", 11)], age=60.0, busy=True).ids == frozenset({11})  # next tick, not with a whole read
    assert plan([run("a", 11)], age=59.0).ids == frozenset({11})


def test_no_runs_no_job_read():
    assert plan([]).ids == frozenset()


# ---------------------------------------------------------------------------- the observer


class Store:
    def __init__(self, runs: list[RunRecord]) -> None:
        self._runs, self.intents = runs, []

    def runs(self, active_only: bool = False) -> list[RunRecord]:
        return self._runs

    def verdicts(self) -> list:
        return []

    def open_actions(self) -> list:
        return self.intents


class Slurm:
    """Records which jobs each snapshot asked for: None (the account's list) or the ids."""

    def __init__(self) -> None:
        self.job_reads: list[frozenset[int] | None] = []
        self.jobs = {11: JobInfo(11, "a", JobState.RUNNING, nodes=("n1",), partition="main")}

    def snapshot(self, include_nodes: bool | Collection[str] = True) -> ClusterSnapshot:
        return self.snapshot_of(None, include_nodes)

    def snapshot_of(self, jobs: Collection[int] | None, include_nodes: bool | Collection[str]) -> ClusterSnapshot:
        self.job_reads.append(None if jobs is None else frozenset(jobs))
        shown = self.jobs if jobs is None else {j: i for j, i in self.jobs.items() if j in jobs}
        return ClusterSnapshot(1000.0, shown, {})


def observer(slurm: Slurm, store: Store, clock: ManualClock) -> Observer:
    return Observer(
        scheduler=slurm, store=store, clock=clock, probes=ProbeTracker(None, 5.0), progress=NoProgress(),
        checkpoints=NoCheckpoints(), nodes=NodeWatch(NoHealthFeed(), HeartbeatSettings(), 600.0),
        quarantine=QuarantineSettings(), node_refresh_ticks=1_000, whole_cluster_s=(15.0, 60.0),
    )  # fmt: skip


def test_the_observer_reads_the_account_first_then_by_id_then_again_when_a_submission_is_open():
    slurm, store, clock = Slurm(), Store([run("a", 11)]), ManualClock()
    assert isinstance(slurm, JobScopedScheduler)
    obs = observer(slurm, store, clock)
    for _ in range(3):
        obs.snapshot(nodes_needed=False)
        clock.advance(5.0)
    assert slurm.job_reads == [None, frozenset({11}), frozenset({11})]
    store.intents = [intent("submit", run="a", nonce="x")]
    snap = obs.snapshot(nodes_needed=False)
    assert slurm.job_reads[-1] is None and 11 in snap.jobs
    store.intents = []
    clock.advance(5.0)
    obs.snapshot(nodes_needed=False)
    assert slurm.job_reads[-1] == frozenset({11})


def test_the_observer_reads_the_account_again_after_a_minute():
    slurm, clock = Slurm(), ManualClock()
    obs = observer(slurm, Store([run("a", 11)]), clock)
    for _ in range(14):
        obs.snapshot(nodes_needed=False)
        clock.advance(5.0)
    assert [i for i, r in enumerate(slurm.job_reads) if r is None] == [0, 12]


class PlainSlurm:
    """A scheduler without reads by id (the simulator, older fakes): the account's list each tick."""

    def __init__(self) -> None:
        self.reads = 0

    def snapshot(self, include_nodes: bool | Collection[str] = True) -> ClusterSnapshot:
        self.reads += 1
        return ClusterSnapshot(1000.0, {}, {})


def test_a_scheduler_without_reads_by_id_is_read_as_before():
    slurm = PlainSlurm()
    obs = observer(slurm, Store([run("a", 11)]), ManualClock())  # type: ignore[arg-type]
    obs.snapshot(nodes_needed=False)
    obs.snapshot(nodes_needed=False)
    assert slurm.reads == 2


def test_the_daemons_stamped_scheduler_passes_reads_by_id_on():
    from supervisor.engine.loop.daemon import Heartbeat, StampedScheduler

    slurm = Slurm()
    stamped = StampedScheduler(slurm, Heartbeat())  # type: ignore[arg-type]
    assert isinstance(stamped, JobScopedScheduler)
    assert set(stamped.snapshot_of({11}, include_nodes=False).jobs) == {11}
    assert slurm.job_reads == [frozenset({11})]
    plain = StampedScheduler(PlainSlurm(), Heartbeat())  # type: ignore[arg-type]
    assert plain.snapshot_of({11}, include_nodes=False).jobs == {}  # its snapshot, as before
