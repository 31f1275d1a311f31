"""Goodput from the evidence the daemon keeps agrees with what the simulator measured.

The simulator knows the truth (steps kept x step time over the wall time); the logbook only knows
what the daemon read and recorded. Same run, same figures: within 0.5 percentage points, no "upper
bound" caveat, every interruption's lost work on record, lost time by cause summing to the
simulator's lost time. The demo's own day (the four scripted faults: a faulty GPU, a dead host, an
NCCL hang, a software bug); bench/goodput.py runs the 54-day check over 10 seeds.
"""

import json
import re

import pytest
from click.testing import CliRunner

from supervisor.adapters.sqlite import SqliteStore
from supervisor.cli import main
from supervisor.domain.goodput.account import goodput
from supervisor.report.goodput import cause_rows, summary_rows
from supervisor.sim.plan import demo_failures, demo_settings
from supervisor.sim.runner import RUN, Simulation
from supervisor.sim.training.settings import Mode


@pytest.fixture(scope="module")
def simulated(tmp_path_factory):
    settings = demo_settings(7)
    state = tmp_path_factory.mktemp("state")
    result = Simulation(settings, Mode.SUPERVISOR, state).run(demo_failures(7))
    store = SqliteStore(state)
    try:
        attempts, events, series = store.attempts(RUN), store.events(RUN), store.progress(RUN)
    finally:
        store.close()
    end = result.wall_s + attempts[0].submitted_at
    g = goodput(RUN, attempts, events, now=end, series=series)
    return result, g, series, state


def test_logbook_ettr_agrees_with_the_simulators_measured_ettr(simulated):
    result, g, _, _ = simulated
    assert g.ettr is not None
    assert abs(100 * g.ettr - 100 * result.ettr) < 0.5, (g.ettr, result.ettr)


def test_no_upper_bound_and_lost_work_on_record_for_every_interruption(simulated):
    result, g, _, _ = simulated
    assert len(g.interruptions) == result.interruptions == 4
    assert all(i.lost_work_s is not None for i in g.interruptions)
    assert all(i.restart_s is not None and i.restart_s > 0 for i in g.interruptions)
    assert all(i.detection_s is not None for i in g.interruptions), [i.cause.category for i in g.interruptions]
    assert "upper bound" not in dict(summary_rows(g, g.advice(None)))["ETTR (productive / wall)"]
    assert not any("upper bound" in n for n in g.notes)


def test_lost_time_by_cause_sums_to_the_simulators_lost_time(simulated):
    result, g, _, _ = simulated
    sim_lost = result.wall_s - result.productive_s
    assert sum(lost.total_s for lost in g.by_cause.values()) == pytest.approx(g.lost.total_s)
    assert g.lost.total_s + g.idle_s == pytest.approx(sim_lost, abs=0.005 * result.wall_s)


def test_every_interruption_in_exactly_one_cause_row_and_an_xid_is_a_gpu_fault(simulated):
    _, g, _, _ = simulated
    rows = cause_rows(g)
    assert sum(int(n) for _, n, _, _ in rows) == len(g.interruptions)
    xid = next(i for i in g.interruptions if "XID" in i.cause.basis.upper())
    assert (xid.cause.category, xid.cause.table5) == ("GPU", True)


def test_the_series_the_daemon_read_is_kept_bounded(simulated):
    _, _, series, _ = simulated
    assert series, "no progress points on record"
    assert all(p.loss is not None for p in series)
    assert {p.attempt for p in series} == {0, 1, 2, 3, 4}


def test_the_command_ends_the_account_where_supervision_stopped(simulated):
    """No daemon supervises the simulated run any more: the wall clock's hours since are not
    productive (nor counted); the command's figure is the simulator's."""
    result, _, _, state = simulated
    out = CliRunner().invoke(main, ["--state-dir", str(state), "logbook", "goodput", RUN, "--json"])
    assert out.exit_code == 0, out.output
    figures = json.loads(out.output)
    assert figures["wall_s"] == pytest.approx(result.wall_s, abs=10.0)
    assert abs(100 * figures["ettr"] - 100 * result.ettr) < 0.5


@pytest.mark.parametrize("fmt", ["html", "markdown"])
def test_the_page_and_the_chronicle_end_the_account_where_supervision_stopped(simulated, fmt, tmp_path):
    """Before: the page of a run no daemon supervises any more counted up to the wall clock
    (ETTR 37.5 % for the demo's day, looked at two days later)."""
    result, _, _, state = simulated
    out = tmp_path / f"page.{fmt}"
    ran = CliRunner().invoke(main, ["--state-dir", str(state), "logbook", RUN, "--format", fmt, "-o", str(out)])
    assert ran.exit_code == 0, ran.output
    shown = re.search(r"ETTR.*?(\d+(?:\.\d)?) %", out.read_text(), re.DOTALL)
    assert shown is not None and abs(float(shown.group(1)) - 100 * result.ettr) < 0.5
