"""The daemon's collector settings (supervisor/adapters/gc_tuning.py)."""

import gc

from supervisor.adapters import gc_tuning


def test_settle_freezes_what_exists_and_collects_the_young_generation_rarely():
    before = gc.get_threshold()
    try:
        gc_tuning.settle()
        assert gc.get_threshold() == (20_000, 50, 100)
        assert gc.get_freeze_count() > 0
        garbage = []
        garbage.append(garbage)  # a cycle: still freed, by a collection
        del garbage
        assert gc.collect() >= 1
    finally:
        gc.unfreeze()
        gc.set_threshold(*before)
