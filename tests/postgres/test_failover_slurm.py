"""Two login nodes (issue 33): two real daemons of one instance, one real PostgreSQL, the real Slurm
the harness starts. The server runs in a network namespace of its own and each daemon reaches it
over a veth link of its own (``testing.servers.netns``), so one daemon can be cut off from the database
(its packets dropped) while the other is not.

Each time the leader is lost — killed abruptly right after the node fault is recorded or right
after the replacement's submit intent is journaled, or cut off from the database — the standby
finishes the recovery with exactly one replacement job (counted from Slurm by the instance's job
tag) and the run trains again. Killed in the middle of an in-allocation swap (its step goal
written, the intent open), the standby settles the swap and the job's launcher, given both
daemons' URLs (``[ingest] peer_urls``), finds the new leader: one new step in the same job
(counted from Slurm's steps). A short lease (3 s) keeps each case to seconds.
"""

from __future__ import annotations

import os
import socket
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from supervisor.adapters.checkpoints.commit import build_manifest, commit_checkpoint
from supervisor.adapters.checkpoints.posix import PosixBackend
from supervisor.adapters.slurm.cli import SlurmCli
from supervisor.testing.servers import netns
from supervisor.testing.servers.postgres import LocalPostgres, LocalPostgresError
from supervisor.testing.servers.postgres import unavailable_reason as postgres_unavailable
from supervisor.testing.slurm.daemon import SupervisorProcess, spared_run, write_run

pytestmark = [pytest.mark.slurm, pytest.mark.postgres]

LEASE_S = 3.0
HEARTBEAT = """\
srun bash -c 'while true; do echo "beat $SLURM_JOB_ID $SLURMD_NODENAME $(date +%s.%N)" >> "$MARKS"; sleep 0.2; done'
"""
STEP = 'while true; do echo "step $SLURM_JOB_ID $SSV_STEP_GENERATION $SLURMD_NODENAME" >> "$MARKS"; sleep 0.2; done'


@pytest.fixture(scope="module")
def partitioned_postgres() -> Iterator[LocalPostgres]:
    reason = netns.unavailable_reason() or postgres_unavailable()
    if reason:
        _cannot_run(reason)
    net = netns.ServerNet(links=2).start()
    try:
        server = LocalPostgres(net=net).start()
    except LocalPostgresError as exc:
        net.stop()
        _cannot_run(str(exc))
    try:
        yield server
    finally:
        server.stop()
        net.stop()


def _cannot_run(reason: str) -> None:
    if os.environ.get("CI", "").strip().lower() == "true":
        pytest.fail(f"a partitioned PostgreSQL is required under CI=true but cannot run: {reason}", pytrace=False)
    pytest.skip(reason)


class Pair:
    """Two daemons of one instance on one database, daemon i over link i."""

    def __init__(self, cluster, server: LocalPostgres, tmp_path: Path, *, in_allocation: bool = False) -> None:
        self.server = server
        database = server.database().rsplit("/", 1)[1]
        self.url = server.url(database, link=1)  # the test reads over the standby's link (never cut)
        ports = [_free_port(), _free_port()]  # known before either starts: each names the other (peer_urls)
        self.daemons = [
            SupervisorProcess(
                cluster,
                tmp_path / f"login{i}",
                extra=self._store(database, i),
                ingest_port=ports[i],
                ingest_extra=f'peer_urls = ["http://127.0.0.1:{ports[1 - i]}"]\n',
            )
            for i in range(2)
        ]
        self.marks = tmp_path / "marks.txt"
        self.marks.touch()
        self.spec = (
            _in_allocation_run(cluster, tmp_path, self.marks)
            if in_allocation
            else _resubmitted_run(cluster, tmp_path, self.marks)
        )
        self.cluster = cluster

    def _store(self, database: str, link: int) -> str:
        url = self.server.url(database, link=link)
        return f'[store]\nurl = "{url}"\npassword_file = "{self.server.password_file}"\nlease_s = {LEASE_S}\nconnect_timeout_s = 2\n'

    def running_under_leader(self, *leader_args: str) -> tuple[SupervisorProcess, SupervisorProcess, str]:
        """The run submitted and running; daemon 0 (started again with ``leader_args``) leads and
        daemon 1 stands by. Returns them and the first node of the run."""
        leader, standby = self.daemons
        leader.start()
        self.wait_leader(leader)
        leader.cli("submit", str(self.spec))
        first = leader.wait_running("llm", attempt=0)
        if leader_args:  # a crash point of a recovery: the first submission went without it
            assert leader.stop() == 0  # a clean stop hands the lease back at once
            leader.start(*leader_args)
            self.wait_leader(leader)
        standby.start()
        return leader, standby, first["running_on"][0]

    def wait_leader(self, daemon: SupervisorProcess, timeout: float = 30.0) -> float:
        """Until ``daemon``'s current process logged that it leads; when (monotonic)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if '"leadership_gained"' in daemon.log_path.read_text(errors="replace"):
                return time.monotonic()
            time.sleep(0.05)
        raise AssertionError(
            f"{daemon.workdir.name} did not lead within {timeout} s:\n{daemon.log_path.read_text()[-2000:]}"
        )

    def query(self, sql: str, params: tuple = ()) -> list[tuple]:
        with psycopg.connect(self.url, password=self.server.password, connect_timeout=5) as db:
            return db.execute(sql, params).fetchall()

    def tagged_jobs(self) -> list[int]:
        """The jobs Slurm holds with this instance's tag (every submission of the run)."""
        [(instance,)] = self.query("SELECT value FROM meta WHERE key = 'instance'")
        tag = f"slurm-supervisor:llm:{instance}:"
        jobs = SlurmCli(slurm_conf=str(self.cluster.slurm_conf)).snapshot().jobs.values()
        return sorted(j.job_id for j in jobs if j.comment.startswith(tag))

    def stop(self) -> None:
        for daemon in self.daemons:
            daemon.stop()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _resubmitted_run(cluster, tmp_path: Path, marks: Path) -> Path:
    return spared_run(cluster, tmp_path, script_body=HEARTBEAT, env={"MARKS": str(marks)})


def _in_allocation_run(cluster, tmp_path: Path, marks: Path) -> Path:
    """Two nodes and one hot spare in one job; the launcher runs the step (docs/in-allocation.md);
    a verified checkpoint at step 100 to resume from."""
    root = tmp_path / "ckpt"
    (root / "step_000100").mkdir(parents=True)
    (root / "step_000100" / "model.pt").write_bytes(b"w" * 4096)
    backend = PosixBackend(str(root))
    commit_checkpoint(backend, "step_000100", build_manifest(backend, "step_000100", 100, writer="rank0"))
    body = f"exec {sys.executable} -m supervisor launch --poll 0.2 --decision-wait 30 -- bash -c '{STEP}'\n"
    spec = write_run(tmp_path, "llm", nodes=2, partition=cluster.partition, script_body=body, env={"MARKS": str(marks)})
    extra = f'mode = "in-allocation"\nhot_spares = 1\nlauncher_timeout_s = 30\n[checkpoints]\nroot = "{root}"\n'
    spec.write_text(spec.read_text() + extra)
    return spec


@pytest.fixture
def pair(slurm_cluster, partitioned_postgres, tmp_path) -> Iterator[Pair]:
    made = Pair(slurm_cluster, partitioned_postgres, tmp_path)
    try:
        yield made
    finally:
        made.stop()


def _wait_logged(daemon: SupervisorProcess, event: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while f'"{event}"' not in daemon.log_path.read_text(errors="replace"):
        assert time.monotonic() < deadline, f"{daemon.workdir.name} never logged {event}"
        time.sleep(0.1)


def _trains_again_after_one_replacement(pair: Pair, standby: SupervisorProcess, victim: str) -> None:
    second = standby.wait_running("llm", attempt=1, avoid=[victim], timeout=60)
    marks_before = pair.marks.read_text().count(f"beat {second['job_id']} ")
    time.sleep(1.5)  # a few more ticks of the new leader: nothing more may be submitted
    assert pair.marks.read_text().count(f"beat {second['job_id']} ") > marks_before  # it trains
    assert len(pair.tagged_jobs()) == 2, pair.tagged_jobs()  # the first job and exactly one replacement
    assert second["restarts"]["spent"] == 1
    [(faults,)] = pair.query("SELECT count(*) FROM events WHERE run = 'llm' AND kind = 'fault'")
    [(drains,)] = pair.query("SELECT count(*) FROM events WHERE run = 'llm' AND kind = 'node_drained'")
    assert (faults, drains) == (1, 1)
    [(old, new)] = pair.query("SELECT min(epoch), max(epoch) FROM actions")
    [(leads,)] = pair.query("SELECT epoch FROM leader")
    # every intent carries the epoch it was journaled under: the old leader's, and the new one's if it
    # journaled any (a retried intent of the old leader's is performed under its own row)
    assert old < leads and new <= leads


@pytest.mark.parametrize("killed_at", ["before_intent:node_state", "after_intent:submit"])
def test_the_standby_finishes_the_recovery_of_a_leader_killed_mid_way(pair: Pair, killed_at: str) -> None:
    leader, standby, victim = pair.running_under_leader(f"--crash-at={killed_at}")
    time.sleep(0.5)
    pair.cluster.crash_node(victim)
    assert leader.wait_exit(timeout=30) == 137  # died at the boundary, its lease not released
    pair.wait_leader(standby)
    _trains_again_after_one_replacement(pair, standby, victim)
    if killed_at == "after_intent:submit":  # the old leader's journaled submission, settled once
        assert '"intent_retried"' in standby.log_path.read_text() or '"intent_settled"' in standby.log_path.read_text()


def test_a_leader_cut_off_from_the_database_stops_acting_and_the_standby_takes_over(pair: Pair) -> None:
    leader, standby, victim = pair.running_under_leader()
    net = pair.server.net
    assert net is not None
    net.cut(0)  # the leader's packets to and from the database are dropped from now on
    cut = time.monotonic()
    pair.cluster.crash_node(victim)
    taken = pair.wait_leader(standby, timeout=60)
    assert taken - cut >= LEASE_S * 0.8 - 0.5  # not before the lease could have ended
    _trains_again_after_one_replacement(pair, standby, victim)
    _wait_logged(leader, "store_unreachable")  # its claim failed, within the connect timeout
    old_log = [line.get("event") for line in leader.log_lines()]
    assert old_log.count("intent") == 1  # the first submission: nothing since the cut
    net.heal(0)
    assert leader.wait_exit(timeout=30) != 0  # it finds another leading: it ends, to start again as a standby
    assert "leadership_lost" in [line.get("event") for line in leader.log_lines()]
    assert len(pair.tagged_jobs()) == 2


def _step_nodes(pair: Pair, job: int, generation: int) -> set[str]:
    """The nodes the step of ``generation`` beat on (the launcher's marks)."""
    lines = (line.split() for line in pair.marks.read_text().splitlines())
    return {p[3] for p in lines if len(p) == 4 and p[0] == "step" and p[1:3] == [str(job), str(generation)]}


def _running_steps(pair: Pair, job: int) -> dict[str, str]:
    """Slurm's running steps of ``job`` but the batch and extern steps: step id -> its nodes."""
    argv = ["squeue", "-h", "--steps", "-j", str(job), "-o", "%i %N"]
    lines = pair.cluster.run(argv, check=True).stdout.split("\n")
    steps = dict(line.split(None, 1) for line in lines if line.strip())
    return {step: nodes for step, nodes in steps.items() if step.split(".")[1] not in ("batch", "extern")}


def _wait(predicate, timeout: float, what: str):  # noqa: ANN001, ANN202
    deadline = time.monotonic() + timeout
    while not (value := predicate()):
        assert time.monotonic() < deadline, f"{what} not within {timeout} s"
        time.sleep(0.1)
    return value


def test_the_standby_finishes_an_in_allocation_swap_the_leader_was_killed_in(
    slurm_cluster, partitioned_postgres, tmp_path
) -> None:
    """Killed right after it wrote the swap's step goal, its intent still open: the standby
    settles it (the goal is in the store) and the launcher, whose daemon is gone, finds the new
    leader among the job's URLs: one swap in the same job, and the step trains again."""
    pair = Pair(slurm_cluster, partitioned_postgres, tmp_path, in_allocation=True)
    try:
        leader, standby, _ = pair.running_under_leader("--crash-at=after_execute:swap_step")
        job = leader.status("llm")["job_id"]
        gen0 = _wait(lambda: n if len(n := _step_nodes(pair, job, 0)) == 2 else None, 30, "generation 0")
        before = _running_steps(pair, job)
        victim = sorted(gen0)[1]  # the batch host (the first) runs the launcher
        pair.cluster.crash_node(victim)
        assert leader.wait_exit(timeout=30) == 137
        pair.wait_leader(standby)
        gen1 = _wait(lambda: n if len(n := _step_nodes(pair, job, 1)) == 2 else None, 60, "generation 1")
        time.sleep(1.5)  # a few more ticks of the new leader: no second swap
        steps = _running_steps(pair, job)
        book = [e["message"] for e in standby.logbook("llm")]
    finally:
        pair.stop()
    assert victim not in gen1 and len(gen0 & gen1) == 1  # the survivor and the spare
    assert not _step_nodes(pair, job, 2)
    # from Slurm: one step started since the crash (the dead node's step lingers until Slurm ends it)
    [(step, nodes)] = [(step, nodes) for step, nodes in steps.items() if step not in before]
    assert int(step.split(".")[1]) > max(int(s.split(".")[1]) for s in before) and victim not in nodes
    assert len([m for m in book if m.startswith("swap in job")]) == 1, book
    assert pair.tagged_jobs() == [job]  # no resubmission
    assert '"intent_settled"' in standby.log_path.read_text()  # the old leader's swap, settled from the journal


OUTAGE_S = 60.0  # the figure (issue 33, Must show); the boundary is a unit test (test_store_outage.py)


def test_the_database_stopped_for_a_minute_nobody_acts_and_nothing_is_lost(pair: Pair) -> None:
    """PostgreSQL stopped for 60 s, a node of the run crashed in that minute: neither daemon
    journals or does anything (Slurm sees no change of ours); back, one of them leads, writes the
    outage in the logbook, and recovers the run once; nothing recorded before is lost."""
    leader, standby, victim = pair.running_under_leader()
    [first] = pair.tagged_jobs()
    tag = pair.query("SELECT value FROM meta WHERE key = 'instance'")[0][0]
    kept = pair.query("SELECT id, kind, message FROM events ORDER BY id")
    pair.server.halt()
    halted = time.time()
    _wait_logged(leader, "store_unreachable")
    pair.cluster.crash_node(victim)
    slurm = SlurmCli(slurm_conf=str(pair.cluster.slurm_conf))
    while time.time() - halted < OUTAGE_S:  # nobody acts: no drain of ours, no submission
        snap = slurm.snapshot()
        assert not snap.nodes[victim].reason.startswith("slurm-supervisor"), snap.nodes[victim]
        assert [j.job_id for j in snap.jobs.values() if tag in j.comment] == [first]
        time.sleep(1.0)
    pair.server.serve_again()
    back = time.time()
    second = standby.wait_running("llm", attempt=1, avoid=[victim], timeout=90)  # a standby reads the store too
    assert pair.tagged_jobs() == [first, second["job_id"]]  # the recovery, once
    assert pair.query("SELECT id, kind, message FROM events WHERE id <= %s ORDER BY id", (kept[-1][0],)) == kept
    created = [t for (t,) in pair.query("SELECT created_at FROM actions")]
    assert not [t for t in created if halted <= t < back]  # nothing journaled while it was away
    [(outages, since, until)] = pair.query(
        "SELECT count(*), min((evidence::json->>'since')::float), max((evidence::json->>'until')::float)"
        " FROM events WHERE run = 'llm' AND kind = 'store_outage'"
    )
    assert outages == 1 and until - since >= OUTAGE_S - 5, (since, until)
    [(faults, drains)] = pair.query(
        "SELECT count(*) FILTER (WHERE kind = 'fault'), count(*) FILTER (WHERE kind = 'node_drained') FROM events"
    )
    assert (faults, drains) == (1, 1)
