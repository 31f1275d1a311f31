"""Two login nodes (issue 33): two real daemons of one instance, one real PostgreSQL, the real Slurm
the harness starts. The server runs in a network namespace of its own and each daemon reaches it
over a veth link of its own (``testing.servers.netns``), so one daemon can be cut off from the database
(its packets dropped) while the other is not.

Each time the leader is lost — killed abruptly right after the node fault is recorded or right
after the replacement's submit intent is journaled, or cut off from the database — the standby
finishes the recovery with exactly one replacement job (counted from Slurm by the instance's job
tag) and the run trains again. A short lease (3 s) keeps each case to seconds.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from supervisor.adapters.slurm.cli import SlurmCli
from supervisor.testing.servers import netns
from supervisor.testing.servers.postgres import LocalPostgres, LocalPostgresError
from supervisor.testing.servers.postgres import unavailable_reason as postgres_unavailable
from supervisor.testing.slurm.daemon import SupervisorProcess, spared_run

pytestmark = [pytest.mark.slurm, pytest.mark.postgres]

LEASE_S = 3.0
HEARTBEAT = """\
srun bash -c 'while true; do echo "beat $SLURM_JOB_ID $SLURMD_NODENAME $(date +%s.%N)" >> "$MARKS"; sleep 0.2; done'
"""


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

    def __init__(self, cluster, server: LocalPostgres, tmp_path: Path) -> None:
        self.server = server
        database = server.database().rsplit("/", 1)[1]
        self.url = server.url(database, link=1)  # the test reads over the standby's link (never cut)
        self.daemons = [
            SupervisorProcess(cluster, tmp_path / f"login{i}", extra=self._store(database, i)) for i in range(2)
        ]
        self.marks = tmp_path / "marks.txt"
        self.marks.touch()
        self.spec = spared_run(
            cluster,
            tmp_path,
            script_body=HEARTBEAT,
            env={"MARKS": str(self.marks)},
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

    def query(self, sql: str) -> list[tuple]:
        with psycopg.connect(self.url, password=self.server.password, connect_timeout=5) as db:
            return db.execute(sql).fetchall()

    def tagged_jobs(self) -> list[int]:
        """The jobs Slurm holds with this instance's tag (every submission of the run)."""
        [(instance,)] = self.query("SELECT value FROM meta WHERE key = 'instance'")
        tag = f"slurm-supervisor:llm:{instance}:"
        jobs = SlurmCli(slurm_conf=str(self.cluster.slurm_conf)).snapshot().jobs.values()
        return sorted(j.job_id for j in jobs if j.comment.startswith(tag))

    def stop(self) -> None:
        for daemon in self.daemons:
            daemon.stop()


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
