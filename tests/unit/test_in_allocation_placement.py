"""An in-allocation job asks Slurm for ``nodes + hot_spares``; placement counted ``nodes`` only. A
partition left with enough nodes for the run but not for its hot spares had every submission
refused by Slurm (more nodes asked than the exclude list leaves), and the run was blocked for
good. Now the job asks for as many hot spares as the usable nodes leave room for, and says so."""

from dataclasses import replace

from test_in_allocation import A0, JOB, SPEC, of, snap

from supervisor.domain.actions import Submit
from supervisor.domain.cluster import JobState
from supervisor.domain.decide.policy import Observation, Policy, decide
from supervisor.domain.records import RunRecord
from supervisor.domain.run import RunState
from supervisor.engine.act.intents import params_of, submit_request

ENDED = replace(JOB, state=JobState.FAILED, end_time=90.0)


def restart_with(spec=SPEC, **down):
    excluded = dict.fromkeys(down, "dead")
    run = RunRecord(spec=spec, state=RunState.RECOVERING, attempt=replace(A0, ended_at=90.0), excluded=excluded)
    (submit,) = of(decide(run, Observation(snap(100.0, ENDED, **down)), Policy()), Submit)
    return submit


def test_with_room_for_every_hot_spare_the_job_asks_for_them_all():
    submit = restart_with(n2="DOWN")  # n1, n3, n4 usable: 2 nodes + 1 hot spare
    assert submit.hot_spares == 1 and submit_request(SPEC, submit, "tag", 1).nodes == 3


def test_a_partition_left_with_room_for_the_run_only_gets_a_job_without_hot_spares():
    submit = restart_with(n2="DOWN", n3="DOWN")  # n1, n4 usable: the run's 2 nodes, no room for a spare
    assert submit.hot_spares == 0 and submit.exclude == ("n2", "n3")
    request = submit_request(SPEC, submit, "tag", 1)
    assert request.nodes == 2 and "--no-kill" in request.extra_args and request.env["SSV_RUN_NODES"] == "2"
    assert "0 of 1 hot spare" in submit.reason


def test_a_submission_journaled_before_hot_spares_were_counted_asks_for_all_of_them():
    old = {k: v for k, v in params_of(restart_with(n2="DOWN")).items() if k != "hot_spares"}
    assert submit_request(SPEC, Submit(**old), "tag", 1).nodes == 3
