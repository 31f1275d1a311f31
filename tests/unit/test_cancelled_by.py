"""Who cancelled a supervised job by hand: sacct's "CANCELLED by UID" read by a bounded parser, the
UID named with the account database (bounded, validated), and the run's cancelled event naming the
person (message, actor, evidence) — or saying that Slurm did not name anyone.

On Slurm 22.05 only accounting knows (docs/operations.md, "Who cancelled a job"): squeue and
scontrol show a cancelled job's Reason as it was before the cancel. The engine asks accounting only
when a followed job is found cancelled outside the supervisor (one sacct call per such job).
"""

from __future__ import annotations

from dataclasses import replace
from types import SimpleNamespace

import pytest
from hypothesis import given
from hypothesis import strategies as st
from unit.sim_world import SimWorld

from supervisor.adapters.slurm.sacct import account_name, cancelled_by, parse_record, parse_sacct
from supervisor.domain.cluster import Canceller, ClusterSnapshot, JobInfo, JobState
from supervisor.domain.decide.policy import Observation, Policy, decide
from supervisor.domain.records import AttemptRecord, Event, EventKind, RunRecord
from supervisor.domain.run import RunState
from supervisor.ports import TransientError
from supervisor.testing.kit.specs import spec

# ---------------------------------------------------------------------------- the parser


@pytest.mark.parametrize(
    ("state", "uid"),
    [
        ("CANCELLED by 1001", 1001),
        ("CANCELLED by 0", 0),
        ("  CANCELLED by 42 ", 42),  # sacct pads with --format=State%30
        ("CANCELLED by 4294967294", 4294967294),  # the largest real uid
    ],
)
def test_the_uid_is_read_from_sacct_state(state, uid):
    assert cancelled_by(state) == uid


@pytest.mark.parametrize(
    "state",
    [
        "CANCELLED",  # no one named
        "CANCELLED+",  # sacct's truncated column (no --parsable2)
        "CANCELLED by",
        "CANCELLED by -1",
        "CANCELLED by 4294967295",  # (uid_t)-1: "no user"
        "CANCELLED by 99999999999999999999",
        "CANCELLED by 1e3",
        "CANCELLED by 0x10",
        "CANCELLED by 007",
        "CANCELLED by ١٠٠١",  # Arabic-Indic digits: int() would take them
        "CANCELLED by 1001\x1b[2J",
        "CANCELLED by 10\n01",
        "CANCELLED by 1001 and 1002",
        "COMPLETED by 1001",
        "cancelled BY 1001 " * 10_000,  # huge
        "",
        "\x00",
    ],
)
def test_anything_else_names_no_one(state):
    assert cancelled_by(state) is None


@given(st.one_of(st.text(), st.from_regex(r"\A *CANCELLED by [0-9]{1,12} *\Z")))
def test_any_text_gives_a_valid_uid_spelled_exactly_or_none(state):
    uid = cancelled_by(state)
    assert uid is None or (0 <= uid <= 2**32 - 2 and state.strip(" ") == f"CANCELLED by {uid}")


def record(state: str) -> str:
    return f"9|llm|{state}|0:15|None|n1|main|100|110|120|1001|tag"


def test_a_record_carries_the_canceller_and_the_state_still_parses():
    job = parse_record(record("CANCELLED by 1001"))
    assert job.state is JobState.CANCELLED and job.cancelled_by == Canceller(1001)
    assert parse_record(record("CANCELLED")).cancelled_by is None
    assert parse_record(record("FAILED")).cancelled_by is None


def test_a_hostile_state_still_parses_as_a_record_naming_no_one():
    job = parse_record(record("CANCELLED by 1\x1b]0;pwned\x07"))
    assert job.state is JobState.CANCELLED and job.cancelled_by is None


def test_the_last_incarnation_carries_its_own_canceller():
    lines = "\n".join([record("REQUEUED"), record("CANCELLED by 7").replace("|100|110|", "|130|140|")])
    assert parse_sacct(lines)[9].cancelled_by == Canceller(7)


# ---------------------------------------------------------------------------- the name


def entry(name):
    return SimpleNamespace(pw_name=name)


def test_a_uid_is_named_from_the_account_database():
    assert account_name(1001, lambda uid: entry("alice")) == "alice"
    assert account_name(0) == "root"  # the real database


@pytest.mark.parametrize(
    "name",
    ["", "al ice", "alice\x1b[2J", "alice\n", "-rf", "a" * 33, "<script>", "ali|ce", "élise", "a:b"],
)
def test_a_name_that_is_not_a_plain_account_name_is_not_used(name):
    assert account_name(1001, lambda uid: entry(name)) == ""


def test_an_unknown_uid_has_no_name():
    def unknown(uid):
        raise KeyError(uid)

    def too_big(uid):
        raise OverflowError(uid)

    assert account_name(1001, unknown) == "" and account_name(1001, too_big) == ""


def test_a_canceller_reads_as_name_and_uid():
    assert str(Canceller(1001, "alice")) == "alice (uid 1001)" and Canceller(1001, "alice").actor == "alice"
    assert str(Canceller(1001)) == "uid 1001" and Canceller(1001).actor == "uid 1001"


# ---------------------------------------------------------------------------- the decision

SPEC = spec(script="/s.sh", max_restarts=3)
A0 = AttemptRecord("llm", 0, 7, 0, 10.0, nodes=("n1", "n2"), started_at=20.0)
CANCELLED = JobInfo(7, "llm", JobState.CANCELLED, nodes=("n1", "n2"), start_time=20.0, end_time=90.0)


def cancelled_event(job: JobInfo) -> Event:
    run = RunRecord(spec=SPEC, state=RunState.RUNNING, attempt=A0)
    d = decide(run, Observation(ClusterSnapshot(100.0, {7: job}, {})), Policy())
    [event] = [e for e in d.records if isinstance(e, Event) and e.kind is EventKind.CANCELLED]
    return event


def test_the_cancelled_event_names_who_cancelled():
    event = cancelled_event(replace(CANCELLED, cancelled_by=Canceller(1001, "alice")))
    assert event.message == "job 7 was cancelled by alice (uid 1001) outside the supervisor; not restarting"
    assert event.actor == "alice" and event.evidence == {"cancelled_by_uid": 1001, "cancelled_by": "alice"}


def test_a_uid_without_a_name_is_said_as_such():
    event = cancelled_event(replace(CANCELLED, cancelled_by=Canceller(1001)))
    assert "cancelled by uid 1001 outside" in event.message and event.actor == "uid 1001"
    assert event.evidence == {"cancelled_by_uid": 1001, "cancelled_by": None}


def test_when_slurm_does_not_say_the_event_says_so_and_blames_no_one():
    event = cancelled_event(CANCELLED)
    assert event.message == (
        "job 7 was cancelled outside the supervisor, by someone Slurm did not name; not restarting"
    )
    assert event.actor == "unknown" and event.evidence == {"cancelled_by_uid": None}


# ---------------------------------------------------------------------------- the engine


class NamingAccounting:
    """Accounting over the simulated cluster's records that names the canceller of ``named`` jobs,
    as sacct's "CANCELLED by UID" does (the simulator's own records name no one)."""

    def __init__(self, cluster, named: dict[int, Canceller], *, down: bool = False) -> None:
        self.cluster, self.named, self.down, self.asked = cluster, named, down, []

    def job_records(self, job_ids):
        self.asked.append(tuple(job_ids))
        if self.down:
            raise TransientError("sacct: Problem talking to the database: Connection refused")
        records = self.cluster.job_records(job_ids)
        return {j: replace(r, cancelled_by=self.named.get(j)) for j, r in records.items()}


SIM_SPEC = spec(max_restarts=5)


def cancel_by_hand(tmp_path, accounting_for=None):
    w = SimWorld(tmp_path, SIM_SPEC)
    w.until(w.running)
    w.clock.advance(60.0)  # past the launch window (a cancel at launch may be a prolog's)
    job_id = w.job().job_id
    if accounting_for is not None:
        w.accounting = accounting_for(w.cluster, job_id)
        w.new_engine()
    w.cluster.cancel(job_id)  # scancel by a person (the port call, made here by the test)
    w.until(lambda: w.run().state.terminal, limit=5)
    assert w.run().state is RunState.CANCELLED
    return w, job_id, w.events(EventKind.CANCELLED)[0]


def test_the_engine_asks_accounting_once_and_the_logbook_names_the_person(tmp_path):
    made = []

    def naming(cluster, job_id):
        made.append(NamingAccounting(cluster, {job_id: Canceller(1001, "alice")}))
        return made[0]

    w, job_id, event = cancel_by_hand(tmp_path, naming)
    assert event.message == f"job {job_id} was cancelled by alice (uid 1001) outside the supervisor; not restarting"
    assert event.actor == "alice" and event.evidence["cancelled_by_uid"] == 1001
    assert made[0].asked == [(job_id,)]  # one sacct call, for that job only
    w.ticks(3)
    assert made[0].asked == [(job_id,)]  # and never again


def test_no_accounting_call_while_nothing_is_cancelled(tmp_path):
    made = []

    def naming(cluster, job_id):
        made.append(NamingAccounting(cluster, {}))
        return made[0]

    w = SimWorld(tmp_path, SIM_SPEC)
    w.until(w.running)
    w.accounting = naming(w.cluster, w.job().job_id)
    w.new_engine()
    w.ticks(5)
    assert made[0].asked == []


def test_without_accounting_the_logbook_says_slurm_did_not_name_anyone(tmp_path):
    _, _, event = cancel_by_hand(tmp_path)
    assert "by someone Slurm did not name" in event.message and event.actor == "unknown"


def test_accounting_down_does_not_hold_the_run_and_names_no_one(tmp_path):
    _, _, event = cancel_by_hand(tmp_path, lambda cluster, _: NamingAccounting(cluster, {}, down=True))
    assert "by someone Slurm did not name" in event.message


def test_a_cancel_through_the_supervisor_does_not_ask_accounting(tmp_path):
    made = []
    w = SimWorld(tmp_path, SIM_SPEC)
    w.until(w.running)
    made.append(NamingAccounting(w.cluster, {}))
    w.accounting = made[0]
    w.new_engine()
    w.store.request_cancel("llm", w.clock.now())
    w.until(lambda: w.run().state.terminal, limit=5)
    assert w.run().state is RunState.CANCELLED and made[0].asked == []
