"""The synthetic trainer's scripted troubles (bench/storms.py): attempts doomed by a cause unrelated
to checkpoints, and checkpoints that fail to load. Both off by default."""

from __future__ import annotations

from dataclasses import replace

import pytest

from supervisor.adapters.sqlite import SqliteStore
from supervisor.domain.progress import parser_for
from supervisor.domain.progress.loads import LoadMark, LoadWatch, load_mark
from supervisor.sim.clock import VirtualClock
from supervisor.sim.faults.failures import FailureModel
from supervisor.sim.runner import RUN, Simulation
from supervisor.sim.training.checkpoints import SimCheckpointStore
from supervisor.sim.training.settings import Mode, SimSettings
from supervisor.sim.training.trainer import ENV_RESUME_STEP, SimTrainer, TrainerSettings

BASE = TrainerSettings(
    step_s=1.0, log_every=10, checkpoint_steps=100, save_s=2.0, restore_s=5.0, startup_s=5.0, step_noise=0.0
)


def trainer(**options):
    clock = VirtualClock()
    store = SimCheckpointStore(clock)
    return clock, store, SimTrainer(replace(BASE, **options), clock, store)


def test_both_are_off_by_default():
    s = TrainerSettings()
    assert s.doomed_from_s is None and s.unloadable_steps == ()
    clock, _, tr = trainer()
    a = tr.start((1, 0), "/logs/a.out", ("n001",), {})
    assert a.exit_at is None and not a.notes
    clock.advance(200.0)
    assert all(load_mark(line) is None for line in tr.read("/logs/a.out"))


def test_an_attempt_starting_from_doomed_from_s_on_writes_its_line_and_exits():
    clock, _, tr = trainer(doomed_from_s=100.0, doomed_after_s=20.0, startup_s=60.0)
    early = tr.start((1, 0), "/logs/a.out", ("n001",), {})
    assert early.exit_at is None  # started before the doom: trains as usual
    clock.advance(100.0)
    tr.end(early, clock.now())
    doomed = tr.start((2, 0), "/logs/b.out", ("n001",), {})
    assert doomed.exit_at == clock.now() + 20.0 and doomed.stopped_at == doomed.exit_at
    clock.advance(18.0)
    assert tr.read("/logs/b.out") == []  # nothing written yet (still starting up)
    clock.advance(2.0)
    lines = tr.read("/logs/b.out")
    assert lines == ["Traceback (most recent call last):", "ModuleNotFoundError: No module named 'apex'"]
    assert all(load_mark(line) is None for line in lines)  # nothing said about a checkpoint load
    tr.end(doomed, clock.now())
    clock.advance(500.0)
    assert tr.read("/logs/b.out") == [] and tr.reached(doomed) == doomed.resume_step


def test_doomed_lines_come_in_time_order_with_the_steps_and_nothing_after_them():
    clock, _, tr = trainer(doomed_from_s=0.0, doomed_after_s=45.0, doomed_line="OSError: [Errno 5] Input/output error")
    a = tr.start((1, 0), "/logs/a.out", ("n001",), {})
    clock.advance(45.0)
    tr.end(a, clock.now())
    clock.advance(100.0)
    lines = tr.read("/logs/a.out")
    steps = [r.step for r in parser_for(None).feed_all(lines) if r.step is not None]
    assert steps == [10, 20, 30, 40]  # computing from 5 s, a line every 10 s
    assert lines[-1] == "OSError: [Errno 5] Input/output error"


def test_resuming_from_an_unloadable_save_logs_a_failed_load_and_exits():
    clock, store, tr = trainer(unloadable_steps=(200,), unloadable_after_s=30.0)
    store.begin_save(100, clock.now(), clock.now() + 1.0)
    store.begin_save(200, clock.now(), clock.now() + 1.0)
    clock.advance(10.0)
    bad = tr.start((1, 0), "/logs/a.out", ("n001",), {ENV_RESUME_STEP: "200"})
    assert bad.exit_at == clock.now() + 30.0
    clock.advance(30.0)
    lines = tr.read("/logs/a.out")
    marks = [load_mark(line) for line in lines]
    assert marks[0] is LoadMark.BEGAN and "at iteration 200" in lines[0] and "step_00000200" in lines[0]
    assert marks[-1] is LoadMark.FAILED and "Error(s) in loading state_dict" in lines[-1]
    watch = LoadWatch()
    for line, mark in zip(lines, marks, strict=True):
        if mark is not None:
            watch.mark(mark, line)
    assert "failed checkpoint load" in (watch.failure(ended=True) or "")
    tr.end(bad, clock.now())
    good = tr.start((2, 0), "/logs/b.out", ("n001",), {ENV_RESUME_STEP: "100"})
    assert good.exit_at is None and not good.notes  # another save loads


def test_negative_durations_are_refused():
    with pytest.raises(ValueError, match="doomed_after_s"):
        TrainerSettings(doomed_after_s=-1.0)
    with pytest.raises(ValueError, match="unloadable_after_s"):
        TrainerSettings(unloadable_after_s=float("nan"))
    with pytest.raises(ValueError, match="doomed_from_s"):
        TrainerSettings(doomed_from_s=-5.0)


def test_the_world_ends_each_doomed_job_failed_after_doomed_after_s(tmp_path):
    settings = SimSettings(
        gpus=16,
        spares=1,
        days=1 / 24,
        seed=3,
        failures=FailureModel(per_gpu_hour=0.0),
        trainer=replace(TrainerSettings(), doomed_from_s=0.0, doomed_after_s=20.0),
    )
    sup = Simulation(settings, Mode.SUPERVISOR, tmp_path / "sup").run([])
    store = SqliteStore(tmp_path / "sup")
    try:
        attempts = [a for a in store.attempts(RUN, 100) if a.ended_at is not None]
    finally:
        store.close()
    assert len(attempts) >= 2
    assert {a.end_state for a in attempts} == {"FAILED"}
    assert all(a.ended_at - a.started_at == pytest.approx(20.0) for a in attempts)
    assert sup.kept_steps == 0
    base = Simulation(settings, Mode.BASELINE).run([])  # plain Slurm: the trap requeues, again and again
    assert base.attempts > sup.attempts and base.kept_steps == 0
