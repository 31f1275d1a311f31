"""Loss spikes in the engine, on the simulated cluster: a spike that heals is logged and left alone;
one that does not is rolled back to the right verified checkpoint with the skip range (and, on a
repeat near the same place, more skip and a lower LR) in the restarted job's environment; past the
cap, or without checkpoints, a human is paged instead."""

from __future__ import annotations

import json
from dataclasses import replace

from unit.sim_world import SimWorld

from supervisor.domain.progress.hang import HangSettings
from supervisor.domain.records import EventKind
from supervisor.domain.run import CheckpointPolicy, RunSpec, SpikePolicy
from supervisor.testing.kit.specs import spec

SPEC = spec(
    script="/w/train.sbatch",
    workdir="/w",
    output="/logs/%x-%j.out",
    max_restarts=5,
    checkpoints=CheckpointPolicy(root="mem://ckpt/", scan_interval_s=5.0, resume_file="/w/resume.json"),
    spikes=SpikePolicy(heal_window_steps=50, min_steps_before=100, skip_batches=300, max_rollbacks=2),
)


def line(step: int, loss: float, grad: float = 1.0) -> str:
    return (
        f" iteration {step:8d}/ 1000000 | consumed samples: {step * 64} | elapsed time per iteration (ms): "
        f"1000.0 | learning rate: 1.0E-04 | global batch size: 64 | lm loss: {loss:.6E} | loss scale: 1.0 | "
        f"grad norm: {grad:.3f} | number of skipped iterations: 0 | number of nan iterations: 0 |"
    )


class Trainer(SimWorld):
    """Logs every 10 steps (one line per virtual second); the test scripts the loss per step."""

    def __init__(self, tmp_path, spec: RunSpec = SPEC) -> None:
        hang = HangSettings(multiple=50, floor_s=600, cap_s=3600, startup_grace_s=600)
        super().__init__(tmp_path, spec, probe=False, hang=hang, watch_checkpoints=True)
        self.step = 0
        self.loss = lambda step: 2.0 - step * 1e-5

    def train(self, until_step: int, seq: int, checkpoint_every: int = 500) -> None:
        """Run attempt ``seq`` up to ``until_step``, saving verified-to-be checkpoints as it goes."""
        for _ in range(5000):
            if self.step >= until_step or not self.running(seq):
                break
            self.step += 10
            if self.step % checkpoint_every == 0:
                self.ckpt.save(self.step)
            self.logs.append_all(line(self.step, self.loss(self.step)))
            self.tick()


def test_a_spike_that_heals_is_logged_and_left_alone(tmp_path):
    t = Trainer(tmp_path)
    t.until(lambda: t.running(0))
    base = t.loss
    t.loss = lambda s: base(s) * (1.8 if 1500 <= s < 1520 else 1.0)  # BLOOM-176B-like: back in ~20 steps
    t.train(2000, 0)
    assert t.running(0) and len(t.events(EventKind.SPIKE)) == 1
    healed = t.events(EventKind.SPIKE_HEALED)
    assert len(healed) == 1 and healed[0].evidence["onset_step"] == 1500
    assert not t.events(EventKind.ROLLBACK) and [s for s, *_ in healed[0].evidence["series"]][-1] >= 1520


def test_a_spike_that_does_not_heal_rolls_back_to_a_verified_checkpoint_before_it_with_a_skip_range(tmp_path):
    t = Trainer(tmp_path)
    t.until(lambda: t.running(0))
    base = t.loss
    t.loss = lambda s: base(s) * (1.8 if s >= 2130 else 1.0)  # never comes back
    t.train(2400, 0)
    t.until(lambda: t.running(1))
    rollback = t.events(EventKind.ROLLBACK)
    assert len(rollback) == 1
    ev = rollback[0].evidence
    assert ev["onset_step"] == 2130 and ev["checkpoint_step"] == 2000  # newest verified >= 100 steps before
    assert (ev["skip_first"], ev["skip_last"]) == (2001, 2300) and ev["series"]
    env = t.submitted_env()
    assert env["SSV_RESUME_STEP"] == "2000" and env["SSV_SKIP_ITERATIONS"] == "2001-2300"
    assert "SSV_LR_SCALE" not in env  # a first rollback keeps the LR
    plan = json.loads(t.files["/w/resume.json"])
    assert plan["rollback"]["onset_step"] == 2130 and plan["checkpoint"]["step"] == 2000
    restarted = t.events(EventKind.RESTARTED)[-1]
    assert "rollback to step 2000" in restarted.message and "skipping iterations 2001-2300" in restarted.message


def test_a_repeat_near_the_same_place_skips_more_and_lowers_the_lr_then_pages_a_human(tmp_path):
    t = Trainer(tmp_path)
    t.until(lambda: t.running(0))
    base = t.loss
    t.loss = lambda s: base(s) * (1.8 if s >= 2130 else 1.0)
    t.train(2400, 0)
    t.until(lambda: t.running(1))
    t.step = 2000  # the job resumed from checkpoint 2000; the data after the skip still blows up
    t.loss = lambda s: base(s) * (1.8 if s >= 2330 else 1.0)
    t.train(2600, 1)
    t.until(lambda: t.running(2))
    second = t.events(EventKind.ROLLBACK)[1].evidence
    assert second["escalation"] == 1 and second["lr_scale"] == 0.5
    assert second["skip_last"] - second["skip_first"] + 1 == 600  # the skip doubled
    env = t.submitted_env()
    assert env["SSV_SKIP_ITERATIONS"] == f"2001-2300,{second['skip_first']}-{second['skip_last']}"
    assert env["SSV_LR_SCALE"] == "0.5"
    t.step = 2000
    t.loss = lambda s: base(s) * (1.8 if s >= 2130 else 1.0)
    t.train(2400, 2)
    t.ticks(20)
    assert len(t.events(EventKind.ROLLBACK)) == 2  # max_rollbacks = 2 per window
    blocked = t.events(EventKind.ROLLBACK_BLOCKED)
    assert len(blocked) == 1 and "a human decides" in blocked[0].message and blocked[0].evidence["page"]
    assert t.running(2)


def test_without_checkpoints_an_unhealed_spike_pages_a_human_and_the_job_keeps_running(tmp_path):
    t = Trainer(tmp_path, replace(SPEC, checkpoints=None))
    t.until(lambda: t.running(0))
    base = t.loss
    t.loss = lambda s: base(s) * (1.8 if s >= 1130 else 1.0)
    t.train(1400, 0)
    blocked = t.events(EventKind.ROLLBACK_BLOCKED)
    assert len(blocked) == 1 and "no [checkpoints] section" in blocked[0].message
    assert t.running(0) and not t.events(EventKind.ROLLBACK)


def test_a_checkpoint_is_not_passed_over_when_the_failed_attempts_had_trained_past_it(tmp_path):
    t = Trainer(tmp_path)
    t.until(lambda: t.running(0))
    t.train(1100, 0)  # checkpoints 500 and 1000
    for seq in (0, 1, 2):
        t.cluster.finish_job(t.run().attempt.job_id, exit_code=1)  # e.g. an NCCL error, not the checkpoint
        t.until(lambda seq=seq: t.running(seq + 1))
        assert t.submitted_env()["SSV_RESUME_STEP"] == "1000"
        t.step = 1000
        t.train(1050, seq + 1)  # it loaded 1000 and trained on
    assert not [e for e in t.events(EventKind.WARNING) if "passed over" in e.message]


def test_a_loss_climbing_without_a_jump_is_rolled_back_to_a_checkpoint_before_the_climb(tmp_path):
    """Issue 20: a steady climb (+1 % per logged record, never a jump) is a divergence, handled like
    a spike that did not heal: the checkpoint lies before the climb began, the rule and its figures
    and the decision latency are in the logbook."""
    t = Trainer(tmp_path)
    t.until(lambda: t.running(0))
    base = t.loss
    t.loss = lambda s: base(s) * (1 + max(0, s - 2130) / 1000)
    t.train(2600, 0)
    t.until(lambda: t.running(1))
    (rollback,) = t.events(EventKind.ROLLBACK)
    ev = rollback.evidence
    assert ev["rule"] == "trend" and ev["kind"] == "trend" and 2130 <= ev["onset_step"] <= 2150
    assert ev["checkpoint_step"] == 2000 and ev["decision_steps"] == ev["steps_after_onset"] <= 120
    assert ev["figures"]["mann_kendall_z"] >= 3 and ev["figures"]["rise_pct"] >= 8
    assert rollback.message.startswith("rollback: loss trend at step") and "rule trend" in rollback.message
    assert [e for e in t.events(EventKind.SPIKE) if e.message.startswith("loss trend at step")]
    assert t.submitted_env()["SSV_RESUME_STEP"] == "2000"
