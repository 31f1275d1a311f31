"""Checkpoint fallback over plain data (domain/checkpoints/demotion.py): a checkpoint is passed over only on
evidence that loading it failed, or — without evidence — at most one step back."""

from __future__ import annotations

from dataclasses import replace

from supervisor.domain.checkpoints.demotion import Demotion, Kept, Standing, failed_load_demotion
from supervisor.domain.records import AttemptRecord

CKPTS = [Standing(f"s{step}", step, verified=True) for step in (500, 400, 300, 200, 100)]


def _attempt(seq: int, *, lasted: float = 20.0, nodes=("n1", "n2"), **fields) -> AttemptRecord:
    start = 1000.0 * seq
    base = AttemptRecord(
        "r", seq, 100 + seq, 0, start, nodes=nodes, started_at=start, ended_at=start + lasted, end_state="FAILED"
    )
    return replace(base, **{"exit_code": 1, **fields})


def _passed(*locations: str) -> list[Standing]:
    return [replace(c, passed_over=c.location in locations) for c in CKPTS]


def test_no_decision_before_two_failures_in_a_row():
    assert failed_load_demotion([_attempt(1)], {1: "s500"}, CKPTS, ()) is None


def test_without_evidence_the_newest_verified_is_passed_over_once_saying_so():
    d = failed_load_demotion([_attempt(1), _attempt(2)], {1: "s500", 2: "s500"}, CKPTS, ())
    assert isinstance(d, Demotion) and d.location == "s500" and d.evidence is None
    assert "no evidence that loading it failed" in d.why


def test_without_evidence_a_second_step_back_is_refused_with_why():
    """The walk-back of issue 21: s500 already passed over without evidence, now s400 fails the same way."""
    attempts = [_attempt(s) for s in (1, 2, 3, 4)]
    handed = {1: "s500", 2: "s500", 3: "s400", 4: "s400"}
    k = failed_load_demotion(attempts, handed, _passed("s500"), ())
    assert isinstance(k, Kept) and k.location == "s400" and k.unbacked == ("s500",)
    assert "does not fall back further" in k.why


def test_an_older_checkpoint_passed_over_without_evidence_counts_too():
    """s400 passed over long ago without evidence; the run trained on to s500 from s300. s500 failing
    without evidence would put the run back to s300 past two unproven checkpoints: kept."""
    attempts = [_attempt(s) for s in (1, 2, 7, 8)]
    handed = {1: "s400", 2: "s400", 7: "s500", 8: "s500"}
    assert isinstance(failed_load_demotion(attempts, handed, _passed("s400"), ()), Kept)


def test_a_checkpoint_passed_over_with_evidence_does_not_count():
    attempts = [_attempt(s, load_failed="its log shows a failed checkpoint load: X") for s in (1, 2)]
    attempts += [_attempt(3), _attempt(4)]
    handed = {1: "s500", 2: "s500", 3: "s400", 4: "s400"}
    d = failed_load_demotion(attempts, handed, _passed("s500"), ())
    assert isinstance(d, Demotion) and d.location == "s400" and d.evidence is None


def test_a_newer_unverified_checkpoint_does_not_count():
    ckpts = [replace(CKPTS[0], verified=False, passed_over=True), *CKPTS[1:]]
    d = failed_load_demotion([_attempt(1), _attempt(2)], {1: "s400", 2: "s400"}, ckpts, ())
    assert isinstance(d, Demotion) and d.location == "s400"


def test_load_errors_in_the_log_pass_over_as_far_as_they_go_and_name_the_error():
    why = "its log shows a failed checkpoint load: RuntimeError: Error(s) in loading state_dict for GPTModel:"
    attempts = [_attempt(s, lasted=1800.0, load_failed=why) for s in (1, 2, 3, 4)]  # long loads count too
    handed = {1: "s500", 2: "s500", 3: "s400", 4: "s400"}
    d = failed_load_demotion(attempts, handed, _passed("s500"), ())
    assert isinstance(d, Demotion) and d.location == "s400"
    assert d.evidence is not None and "Error(s) in loading state_dict" in d.evidence and "loading it failed" in d.why


def test_one_attempt_with_a_load_error_is_not_enough():
    attempts = [_attempt(1, load_failed="its log shows a failed checkpoint load: X"), _attempt(2)]
    d = failed_load_demotion(attempts, {1: "s500", 2: "s500"}, _passed(), ())
    assert isinstance(d, Demotion) and d.evidence is None  # the one step back, not the evidence


def test_the_same_failure_on_disjoint_nodes_is_evidence():
    attempts = [_attempt(1, nodes=("n1", "n2")), _attempt(2, nodes=("n3", "n4"))]
    attempts += [_attempt(3, nodes=("n1", "n2")), _attempt(4, nodes=("n5", "n6"))]
    handed = {1: "s500", 2: "s500", 3: "s400", 4: "s400"}
    d = failed_load_demotion(attempts, handed, _passed("s500"), ())
    assert isinstance(d, Demotion) and d.location == "s400"
    assert d.evidence is not None and "different nodes" in d.evidence


def test_a_different_failure_or_shared_nodes_is_no_evidence():
    differ = [_attempt(3, nodes=("n1",)), _attempt(4, nodes=("n5",), exit_code=2)]
    shared = [_attempt(3, nodes=("n1", "n2")), _attempt(4, nodes=("n2", "n3"))]
    for attempts in (differ, shared):
        assert isinstance(failed_load_demotion(attempts, {3: "s400", 4: "s400"}, _passed("s500"), ()), Kept)


def test_training_past_the_checkpoint_or_a_faulty_node_breaks_the_streak():
    trained = [_attempt(1, last_step=510), _attempt(2, last_step=505)]
    assert failed_load_demotion(trained, {1: "s500", 2: "s500"}, CKPTS, ()) is None
    assert failed_load_demotion([_attempt(1), _attempt(2)], {1: "s500", 2: "s500"}, CKPTS, ("n2",)) is None


def test_a_long_attempt_without_evidence_is_not_a_failed_load():
    long = [_attempt(1, lasted=1800.0), _attempt(2, lasted=1800.0)]
    assert failed_load_demotion(long, {1: "s500", 2: "s500"}, CKPTS, ()) is None


def test_attempts_that_died_before_any_load_began_never_walk_a_checkpoint_back():
    """Issue 21 item 3 / bench/storms.py (b): every attempt dies of an import error before it loads
    anything. Its log says so, so the failure is not the checkpoint's: not even the one step back
    allowed without evidence is taken."""
    early = "its log shows it failed before loading any checkpoint: ModuleNotFoundError: No module named 'apex'"
    attempts = [_attempt(s, failed_before_load=early) for s in (1, 2, 3)]
    assert failed_load_demotion(attempts, {1: "s500", 2: "s500", 3: "s500"}, CKPTS, ()) is None
    # ... while a log that shows a load error as well still counts as a failed load
    both = [_attempt(s, failed_before_load=early, load_failed="RuntimeError: Error(s) in loading") for s in (1, 2)]
    assert isinstance(failed_load_demotion(both, {1: "s500", 2: "s500"}, CKPTS, ()), Demotion)
