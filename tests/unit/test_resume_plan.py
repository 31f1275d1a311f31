"""The resume plan as one typed value: its JSON round trip, the plan dicts older daemons journaled,
and what the job and the logbook are told. Plain data, no engine."""

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from supervisor.domain.actions import Submit
from supervisor.domain.checkpoints.manifest import CheckpointRef, Guarantee, ResumeChoice
from supervisor.domain.checkpoints.resume import (
    CheckpointPick,
    PassedOver,
    ResumePlan,
    ResumePlanError,
    RollbackRef,
    describe_plan,
    resume_env,
    resume_plan,
)
from supervisor.engine.act.intents import action_from, params_of

ROOT = "s3://ckpt/llm/"

steps = st.one_of(st.none(), st.integers(min_value=0, max_value=10**9))
picks = st.builds(CheckpointPick, st.text(min_size=1), steps, st.sampled_from(Guarantee))
rollbacks = st.builds(
    RollbackRef, steps, st.integers(min_value=0, max_value=10**9), st.from_regex(r"\d+-\d+", fullmatch=True)
)
plans = st.builds(
    ResumePlan,
    chosen=st.none() | picks,
    fallbacks=st.lists(picks, max_size=3).map(tuple),
    skipped=st.lists(st.builds(PassedOver, picks, st.text()), max_size=3).map(tuple),
    reason=st.text(),
    file=st.none() | st.text(min_size=1),
    skip_iterations=st.none() | st.from_regex(r"\d+-\d+(,\d+-\d+)*", fullmatch=True),
    lr_scale=st.none() | st.floats(min_value=0.0, max_value=4.0, allow_nan=False),
    rollback=st.none() | rollbacks,
)


def pick(step: int, guarantee: Guarantee = Guarantee.MANIFEST) -> CheckpointPick:
    return CheckpointPick(f"{ROOT}step_{step:06d}/", step, guarantee)


# What CheckpointWatch.resume_for journaled before the plan was typed: a rollback submission.
OLD_ROLLBACK_PLAN = {
    "checkpoint": {"location": ROOT + "step_002000/", "step": 2000, "guarantee": "manifest"},
    "fallbacks": [{"location": ROOT + "step_001000/", "step": 1000, "guarantee": "adopted-dcp"}],
    "skipped": [],
    "reason": "step 2000: metadata-verified",
    "file": "/shared/llm/resume.json",
    "skip_iterations": "2001-2300",
    "lr_scale": 1.0,
    "rollback": {"onset_step": 2130, "checkpoint_step": 2000, "skip": "2001-2300"},
}
# ... and a plain restart with nothing verified: no rollback keys at all.
OLD_SCRATCH_PLAN = {
    "checkpoint": None,
    "fallbacks": [],
    "skipped": [{"location": ROOT + "step_000300/", "step": 300, "guarantee": "manifest", "why": "not verified yet"}],
    "reason": "no verified checkpoint",
    "file": None,
}


@given(plans)
def test_a_plan_survives_the_journal_round_trip(plan):
    assert ResumePlan.from_json(json.loads(json.dumps(plan.to_json()))) == plan


@given(plans)
def test_a_submission_survives_the_intent_journal(plan):
    submit = Submit("llm", ("n1", "n2"), True, "node crash", resume=plan)
    params = json.loads(json.dumps(params_of(submit)))
    assert action_from("submit", params) == submit


@pytest.mark.parametrize("old", [OLD_ROLLBACK_PLAN, OLD_SCRATCH_PLAN])
def test_plans_journaled_by_an_older_daemon_read_back_and_write_the_same_json(old):
    plan = ResumePlan.from_json(json.loads(json.dumps(old)))
    assert plan.to_json() == old


def test_an_old_rollback_plan_reads_as_typed_values():
    plan = ResumePlan.from_json(OLD_ROLLBACK_PLAN)
    assert plan.chosen == pick(2000)
    assert plan.fallbacks == (pick(1000, Guarantee.DCP),)
    assert plan.rollback == RollbackRef(onset_step=2130, checkpoint_step=2000, skip="2001-2300")
    assert (plan.skip_iterations, plan.lr_scale, plan.step) == ("2001-2300", 1.0, 2000)


def test_an_old_submit_intent_settles_into_a_typed_submission():
    params = {"run": "llm", "exclude": ["n3"], "restart": True, "reason": "xid 79", "resume": OLD_SCRATCH_PLAN}
    action = action_from("submit", params)
    assert isinstance(action, Submit) and isinstance(action.resume, ResumePlan)
    assert action.resume.chosen is None and action.resume.skipped[0] == PassedOver(pick(300), "not verified yet")
    assert action_from("submit", {k: v for k, v in params.items() if k != "resume"}).resume is None


@pytest.mark.parametrize(
    "broken",
    [
        [],
        {**OLD_SCRATCH_PLAN, "fallbacks": {"step": 1}},
        {**OLD_SCRATCH_PLAN, "checkpoint": {"location": ROOT, "step": "100", "guarantee": "manifest"}},
        {**OLD_SCRATCH_PLAN, "checkpoint": {"location": ROOT, "step": 100, "guarantee": "pickle"}},
        {**OLD_SCRATCH_PLAN, "lr_scale": "half"},
        {**OLD_SCRATCH_PLAN, "rollback": {"onset_step": 1, "skip": "2-3"}},
    ],
)
def test_a_malformed_plan_is_refused_with_what_is_wrong(broken):
    with pytest.raises(ResumePlanError):
        ResumePlan.from_json(broken)


def test_a_choice_becomes_a_plan_with_its_fallbacks_and_what_was_passed_over():
    def ref(step: int, committed: bool = True) -> CheckpointRef:
        return CheckpointRef(f"{ROOT}step_{step:06d}/", f"step_{step:06d}", step, Guarantee.MANIFEST, committed)

    choice = ResumeChoice(ref(200), (ref(100),), ((ref(300, False), "no commit marker"),), "step 200")
    plan = resume_plan(choice, file="/shared/r.json")
    assert plan == ResumePlan(
        pick(200), (pick(100),), (PassedOver(pick(300), "no commit marker"),), "step 200", "/shared/r.json"
    )


def test_the_environment_names_the_checkpoint_and_the_rollback_terms():
    plan = ResumePlan(pick(2000), file="/shared/r.json", skip_iterations="2001-2300", lr_scale=0.5)
    assert resume_env(plan) == {
        "SSV_RESUME_CHECKPOINT": ROOT + "step_002000/",
        "SSV_RESUME_STEP": "2000",
        "SSV_RESUME_GUARANTEE": "manifest",
        "SSV_RESUME_FILE": "/shared/r.json",
        "SSV_SKIP_ITERATIONS": "2001-2300",
        "SSV_LR_SCALE": "0.5",
    }


def test_no_verified_checkpoint_means_an_empty_checkpoint_and_an_unchanged_lr_is_not_passed():
    env = resume_env(ResumePlan(None, lr_scale=1.0))
    assert env == {"SSV_RESUME_CHECKPOINT": "", "SSV_RESUME_STEP": "", "SSV_RESUME_GUARANTEE": ""}


def test_the_logbook_clause_names_what_was_passed_over_unless_it_is_a_rollback():
    skipped = (PassedOver(pick(300), "no commit marker"),)
    assert describe_plan(ResumePlan(pick(200), skipped=skipped)) == (
        f"resuming from step 200 ({ROOT}step_000200/); step 300 skipped: no commit marker"
    )
    rollback = ResumePlan(pick(2000), skipped=skipped, lr_scale=0.5, rollback=RollbackRef(2130, 2000, "2001-2300"))
    assert (
        describe_plan(rollback)
        == f"resuming from step 2000 ({ROOT}step_002000/), skipping iterations 2001-2300, LR ×0.5"
    )
    assert describe_plan(ResumePlan(None)).startswith("no verified checkpoint to resume from")
