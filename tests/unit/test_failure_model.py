"""The failure model: Llama 3 Table 5 weighted by counts, seeded draws, repairs, Titan, Young/Daly."""

from __future__ import annotations

import csv
import math
import statistics
from pathlib import Path

import pytest

from supervisor.sim.faults.failures import (
    TABLE5,
    TABLE5_TOTAL,
    FailureModel,
    Manifestation,
    RepairKind,
    RepairTimes,
    by_cause,
    titan_model,
    young_daly_interval,
)

SHARED_CSV = Path(__file__).resolve().parents[1] / "data/failure_tables/llama3_405b_table5_unexpected_interruptions.csv"


def test_table5_sums_to_419_and_keeps_the_papers_faulty_gpu_typo():
    assert TABLE5_TOTAL == 419
    faulty = next(c for c in TABLE5 if c.component == "Faulty GPU")
    assert faulty.printed_percent == 30.1  # what the paper prints ...
    assert round(100 * faulty.count / 419, 1) == 35.3  # ... and what its count says
    off = [c.component for c in TABLE5 if abs(round(100 * c.count / 419, 1) - c.printed_percent) > 0.1]
    assert off == ["Faulty GPU"]
    gpu_rows = sum(c.count for c in TABLE5 if c.group == "GPU")
    assert gpu_rows == 268 and round(sum(c.printed_percent for c in TABLE5 if c.group == "GPU"), 1) == 58.7


def test_table5_matches_the_shared_transcription_row_by_row():
    with open(SHARED_CSV, newline="") as fh:
        rows = list(csv.DictReader(fh))
    assert [
        (
            r["component"],
            r["category"],
            int(r["interruption_count"]),
            float(r["percent_of_interruptions_as_printed"].rstrip("%")),
        )
        for r in rows
    ] == [(c.component, c.group, c.count, c.printed_percent) for c in TABLE5]


def test_weights_are_counts_not_printed_percentages():
    model = FailureModel()
    weights = dict(zip((c.component for c in TABLE5), model.weights, strict=True))
    assert math.isclose(sum(model.weights), 1.0)
    assert math.isclose(weights["Faulty GPU"], 148 / 419)


def test_rate_scales_with_gpus_and_gives_one_interruption_every_three_hours_at_16k():
    model = FailureModel()
    assert math.isclose(model.expected(16384, 54 * 86400.0), 419.0)
    assert math.isclose(model.mtbf_s(16384) / 3600, 54 * 24 / 419)
    assert math.isclose(model.expected(1024, 54 * 86400.0), 419.0 / 16)


def test_draws_are_seeded_and_average_near_the_published_count():
    model = FailureModel()
    a, b, c = (model.draw(s, 16384, 54 * 86400.0) for s in (3, 3, 4))
    assert [(f.at, f.category.component) for f in a] == [(f.at, f.category.component) for f in b]
    assert [f.at for f in a] != [f.at for f in c]
    counts = [len(model.draw(s, 16384, 54 * 86400.0)) for s in range(60)]
    assert abs(statistics.fmean(counts) - 419) < 3 * math.sqrt(419 / 60)
    mix = by_cause([f for s in range(60) for f in model.draw(s, 16384, 54 * 86400.0)])
    share = mix["Faulty GPU"] / sum(mix.values())
    assert abs(share - 148 / 419) < 0.02


def test_every_category_says_how_it_shows_and_what_repairs_it():
    for cat in TABLE5:
        assert isinstance(cat.shows, Manifestation) and isinstance(cat.repair, RepairKind)
        if cat.shows in (Manifestation.SOFTWARE, Manifestation.NCCL_ERROR, Manifestation.HANG):
            assert cat.repair is RepairKind.NONE  # nothing is wrong with a node afterwards
    assert Manifestation.XID.agent_visible and Manifestation.XID.health_check_visible
    assert not Manifestation.HANG.kills_job and not Manifestation.SOFTWARE.agent_visible


def test_repair_times_are_lognormal_around_their_medians():
    times = RepairTimes(reboot_s=600.0, replace_s=7200.0, sigma=0.5)
    assert times.draw(RepairKind.NONE, 0.3) == 0.0
    assert math.isclose(times.draw(RepairKind.REBOOT, 0.5), 600.0)
    assert times.draw(RepairKind.REPLACE, 0.9) > 7200.0 > times.draw(RepairKind.REPLACE, 0.1)


def test_young_daly():
    assert math.isclose(young_daly_interval(10.0, 11124.0), math.sqrt(2 * 10 * 11124))
    with pytest.raises(ValueError, match="positive save cost"):
        young_daly_interval(0.0, 100.0)


def test_titan_trace_gives_gpu_failures_per_gpu_hour(tmp_path):
    trace = tmp_path / "gc_full.csv"
    trace.write_text(
        "SN,location,insert,remove,duration,out,event\n"
        "1,c0,2014-01-01,2015-01-01,3600000,TRUE,DBE\n"
        "2,c1,2014-01-01,2015-01-01,3600000,TRUE,OTB\n"
        "3,c2,2014-01-01,2015-01-01,3600000,FALSE,\n"
    )
    model = titan_model(trace)
    assert math.isclose(model.per_gpu_hour, 2 / 3000.0)
    assert {c.shows for c in model.categories} == {Manifestation.ECC, Manifestation.XID}
    (tmp_path / "empty.csv").write_text("SN,duration,event\n")
    with pytest.raises(ValueError, match="no GPU operation time"):
        titan_model(tmp_path / "empty.csv")
