"""The HTML page (self-contained, escaped, charts present), the daemon's handler, and the CLI's
logbook renderings: filters, --follow, html export, goodput."""

import json
import os
import re
import signal
import subprocess
import sys
import threading

import hostlist
import pytest
from click.testing import CliRunner
from test_goodput import RUN, T0, scenario

from supervisor.adapters.logbook_html.page import logbook_page, markdown_to_html, render_html, series_from_events
from supervisor.adapters.logbook_html.svg import thin
from supervisor.adapters.sqlite import SqliteStore
from supervisor.cli import main
from supervisor.cli.views import render
from supervisor.domain.records import Event, EventKind, RunRecord
from supervisor.domain.run import RunState
from supervisor.sim.demo import RUN as DEMO
from supervisor.testing.kit.clock import ManualClock
from supervisor.testing.kit.specs import spec

SPEC = spec(name=RUN, script="t.sbatch", partition="gpu", max_restarts=5, sbatch_args=("--gpus-per-node=8",))


def _html(series=None, extra=()) -> str:
    attempts, events = scenario()
    return render_html(RunRecord(SPEC, RunState.COMPLETED, restarts_spent=2), attempts, [*events, *extra], series)


def test_the_page_is_one_self_contained_file_with_its_charts():
    series = [(T0 + t, t // 10, 3.0 - t / 1e5, 40000.0) for t in range(600, 30000, 100)]
    html = _html(series)
    assert html.startswith("<!DOCTYPE html>") and html.rstrip().endswith("</html>")
    assert not re.search(r"""(?:src|href)\s*=\s*["']?(?:https?:)?//""", html)  # nothing fetched
    assert "<link" not in html and "<script src" not in html and "@import" not in html
    assert "default-src 'none'" in html
    for chart in ('<svg id="timeline"', '<svg id="loss"', '<svg id="throughput"', '<svg id="causes"'):
        assert chart in html
    assert html.count('class="mark fault"') == 2 and html.count('class="bar run') == 3
    assert "ETTR</span><b>89.8 % ≤</b>" in html  # upper bound: one interruption's lost work unknown
    assert "GPU (1)" in html and "Hang (no progress) (1)" in html  # lost time by cause, with counts
    assert "restart after hang at step 900" in html and "<strong>Lost work</strong>: 100 steps, 16.7 min" in html


def test_no_progress_data_is_said_not_drawn():
    html = _html()
    assert '<svg id="loss"' not in html and "No progress data on record" in html


def test_progress_from_event_evidence_and_spikes_are_marked():
    extra = [
        Event(
            RUN,
            EventKind.WARNING,
            f"step {s}",
            f"p{s}",
            T0 + 1000 + s,
            0,
            500,
            evidence={"step": s, "loss": 2.0 + (3.0 if s == 50 else 0.0)},
        )
        for s in range(0, 100, 10)
    ]
    assert series_from_events(extra)[5] == (T0 + 1050, 50, 5.0, None)
    html = _html(extra=extra)
    assert '<svg id="loss"' in html and '<svg id="throughput"' not in html


def test_text_is_escaped():
    evil = Event(RUN, EventKind.NOTE, "<script>alert('x')</script> & <b>", "evil", T0 + 700, 0, 500, actor="<i>mallory")
    html = _html(extra=[evil])
    assert "<script>alert" not in html and "&lt;script&gt;alert(&#x27;x&#x27;)&lt;/script&gt; &amp; &lt;b&gt;" in html
    assert "<i>mallory" not in html


def test_markdown_subset():
    md = (
        "# T\n\n## H\n\n### 2026 [x]: Run r — y\n\n- **Evidence**: `a<b`\n- **Decision**:\n  - one\n  - two\n"
        "\n> quote\n>\n> more\n\n| a | b |\n|---|---|\n| 1 | 2 |\n"
    )
    html = markdown_to_html(md, skip_title=True).replace("\n", "")
    assert '<h3 id="h">H</h3>' in html and "<h4" in html and "<h2" not in html and "T</" not in html
    assert (
        "<li><strong>Evidence</strong>: <code>a&lt;b</code></li><li><strong>Decision</strong>:<ul><li>one</li>" in html
    )
    assert "<blockquote><p>quote</p><p>more</p></blockquote>" in html
    assert "<table><thead><tr><th>a</th><th>b</th></tr></thead><tbody><tr><td>1</td><td>2</td></tr>" in html
    assert "<p>one<br />\ntwo</p>" in markdown_to_html("one\ntwo\n")  # a note's lines stay lines


def test_thinning_keeps_spikes():
    pts = [(float(i), 1.0) for i in range(100_000)]
    pts[54_321] = (54_321.0, 99.0)
    out = thin(pts, 1000)
    assert len(out) <= 1000 and (54_321.0, 99.0) in out


def test_logbook_page_handler(demo_state_copy, tmp_path):
    demo_state_copy(tmp_path, hours=6, crashes=1)
    store = SqliteStore(tmp_path)
    try:
        status, headers, body = logbook_page(store, DEMO)
        h = dict(headers)
        assert status == 200 and h["Content-Type"] == "text/html; charset=utf-8"
        assert "default-src 'none'" in h["Content-Security-Policy"] and h["X-Content-Type-Options"] == "nosniff"
        assert b'<svg id="timeline"' in body and b"Logbook of run llama-demo" in body
        status, headers, body = logbook_page(store, "nope")
        assert status == 404 and b"unknown run 'nope'" in body
    finally:
        store.close()


# ---------------------------------------------------------------- the CLI


@pytest.fixture(scope="module")
def demo_dir(tmp_path_factory, demo_state_copy):
    return demo_state_copy(tmp_path_factory.mktemp("demo"))  # this module's copy: the follow test adds a note


def _cli(demo_dir, *args, code=0):
    result = CliRunner().invoke(main, ["logbook", *args], env={"SLURM_SUPERVISOR_STATE_DIR": str(demo_dir)})
    assert result.exit_code == code, result.output
    return result.output


def named(line: str) -> list[str]:
    """The nodes a logbook line names, by name or in a hostlist (more than 8 nodes)."""
    return [n for word in re.findall(r"n\[[\d,-]+\]|n\d+", line) for n in hostlist.expand_hostlist(word)]


def test_filters_by_kind_node_and_time(demo_dir):
    lines = _cli(demo_dir, DEMO, "--kind", "fault").splitlines()
    assert len(lines) == 2 and all(" fault " in line for line in lines)
    n004 = _cli(demo_dir, DEMO, "--node", "n004").splitlines()
    assert n004 and all("n004" in named(line) for line in n004)
    assert any("node_drained" in line for line in n004) and any("restarted" in line for line in n004)
    window = _cli(demo_dir, DEMO, "--since", "2026-11-29T02:00", "--until", "2026-11-29 03:00Z").splitlines()
    assert window and all(line.startswith("2026-11-29 02:") for line in window)
    as_json = [json.loads(x) for x in _cli(demo_dir, "--kind", "started", "--json").splitlines()]  # every run
    assert [e["attempt"] for e in as_json] == [0, 1, 2]


def test_bad_filters_say_what_to_do(demo_dir):
    assert "known kinds: adopted" in _cli(demo_dir, DEMO, "--kind", "bogus", code=1)
    assert "span back from now such as 90m" in _cli(demo_dir, DEMO, "--since", "yesterday", code=1)
    assert "swap them" in _cli(demo_dir, DEMO, "--since", "2026-11-29T05:00", "--until", "2026-11-29T01:00", code=1)
    assert "shows the whole run" in _cli(demo_dir, DEMO, "--format", "html", "--kind", "fault", code=1)
    assert "shows one run: name it" in _cli(demo_dir, "--format", "markdown", code=1)


def test_html_export_and_goodput(demo_dir, tmp_path):
    out = tmp_path / "page.html"
    _cli(demo_dir, DEMO, "--format", "html", "-o", str(out))
    assert out.read_text().startswith("<!DOCTYPE html>") and '<svg id="timeline"' in out.read_text()
    g = json.loads(_cli(demo_dir, "goodput", DEMO, "--json", "--window", "6"))
    assert g["run"] == DEMO and g["interruptions"] == 2 and g["ettr_upper_bound"] is True
    assert [i["cause"]["category"] for i in g["interruption_list"]] == ["Node lost (cause not seen)"] * 2
    assert len(g["windows"]) >= 1
    text = _cli(demo_dir, "goodput", DEMO, "--save-s", "300")
    assert "ETTR (productive / wall)" in text and "checkpoint interval (Young)" in text and "sqrt(2 x 300 s" in text


def test_follow_hands_over_only_new_events():
    log = [Event(RUN, EventKind.STARTED, "a", "a", T0, 0, 1)]
    got = []

    def daemon_writes_then_stop_at_the_third(seconds: float) -> bool:
        if not clock.waits[1:]:  # the daemon writes while the first wait runs
            log.append(Event(RUN, EventKind.FAULT, "b", "b", T0 + 1, 0, 1))
        return len(clock.waits) >= 3

    clock = ManualClock(T0, on_wait=daemon_writes_then_stop_at_the_third)
    seen = render.follow(lambda: list(log), got.extend, clock, 2.0, skip=1)
    assert [e.key for e in got] == ["b"] and seen == 2 and clock.waits == [2.0, 2.0, 2.0]


def test_follow_prints_new_events_and_exits_cleanly_on_ctrl_c(demo_dir):
    from supervisor.api.testing import local_api

    with local_api(demo_dir):  # the note goes through the instance's API; --follow reads through it
        _follow_sees_a_note(demo_dir)


def _follow_sees_a_note(demo_dir):
    env = {**os.environ, "SLURM_SUPERVISOR_STATE_DIR": str(demo_dir)}
    proc = subprocess.Popen(
        [sys.executable, "-m", "supervisor", "logbook", DEMO, "--follow", "--interval", "0.2", "--kind", "note"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        lines: list[str] = []
        reader = threading.Thread(target=lambda: lines.extend(proc.stdout), daemon=True)
        reader.start()
        note = subprocess.run(
            [sys.executable, "-m", "supervisor", "logbook", "note", DEMO, "swapped the PSU on n004"],
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert note.returncode == 0, note.stderr
        deadline = threading.Event()
        for _ in range(600):  # until the note is shown (a SIGINT before the follower runs is click's "Aborted!")
            if any("swapped the PSU" in line for line in lines):
                break
            deadline.wait(0.1)
        assert any("swapped the PSU" in line for line in lines), lines
        proc.send_signal(signal.SIGINT)
        assert proc.wait(30) == 0, proc.stderr.read()
        reader.join(5)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert any("note" in line and "swapped the PSU on n004" in line for line in lines), lines
    assert "Traceback" not in proc.stderr.read()


def test_the_pages_chronicle_keeps_the_newest_entries_and_says_how_many_it_left_out():
    """Before: 20,000 notes made the page's Markdown rendering take 8 s and 70 MB more (the
    renderer's peak under bench/ingest_abuse.py went over its 300 MB goal)."""
    from supervisor.adapters.logbook_html.page import bounded

    text = (
        "# T\n\n## Incidents and notes\n\n"
        + "".join(f"### entry {i}\n\nbody {i}\n\n" for i in range(7))
        + "## Goodput\n"
    )
    kept = bounded(text, keep=3)
    assert "entry 3" not in kept and all(f"entry {i}" in kept for i in (4, 5, 6))
    assert "4 earlier entries are left out here" in kept and kept.endswith("## Goodput\n")
    assert bounded(text, keep=7) == text
