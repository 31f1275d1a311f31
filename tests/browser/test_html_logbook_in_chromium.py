"""The HTML logbook in a real browser: it loads offline, runs its script, logs nothing to the
console, and shows its timeline, curves and chronicle."""

import re
from pathlib import Path

import pytest

from supervisor.adapters.logbook_html.page import render_html
from supervisor.adapters.sqlite import SqliteStore
from supervisor.sim.demo import RUN

pytestmark = [pytest.mark.browser, pytest.mark.slow]

T0 = 1795910400.0  # the demo's start, 2026-11-29 00:00 UTC


@pytest.fixture(scope="module")
def demo_page(tmp_path_factory: pytest.TempPathFactory, demo_state_copy) -> Path:
    """The demo run's page, with a made-up progress series (the demo's trainer writes none) so the
    curves are drawn: a loss spike at 6 h. Built once for the module; the tests only read it."""
    tmp_path = tmp_path_factory.mktemp("logbook-page")
    demo_state_copy(tmp_path / "state")  # the demo's 12 h run, simulated once per session
    store = SqliteStore(tmp_path / "state")
    try:
        series = [
            (T0 + t, t // 10, 3.0 - t / 40000 + (1.5 if 21600 <= t < 22000 else 0.0), 41000.0 + (t % 700))
            for t in range(0, 43200, 60)
        ]
        html = render_html(store.get_run(RUN), store.attempts(RUN), store.events(RUN), series, now=T0 + 43200)
    finally:
        store.close()
    page = tmp_path / "logbook.html"
    page.write_text(html, encoding="utf-8")
    return page


def test_the_page_loads_without_console_messages_and_shows_its_timeline(chromium, demo_page):
    loaded = chromium.load(demo_page)
    assert loaded.console == [], loaded.console
    assert 'data-ready="1"' in loaded.dom  # the inline script ran to its end
    assert re.search(r'<svg id="timeline"[^>]*>.*?<g class="bar run', loaded.dom, re.S)
    assert loaded.dom.count('class="mark fault"') == 2
    assert '<svg id="loss"' in loaded.dom and '<svg id="throughput"' in loaded.dom
    assert "Lost time by cause" in loaded.dom
    assert "restart after node fault on n002" in loaded.dom


def test_the_console_check_catches_errors_and_blocked_fetches(chromium, demo_page, tmp_path):
    """The check above can fail: a page that fetches from the network and throws is caught."""
    page = tmp_path / "bad.html"
    html = demo_page.read_text()
    html = html.replace("</main>", '</main><img src="https://cdn.example.com/x.png"><script>nosuch();</script>')
    page.write_text(html)
    loaded = chromium.load(page)
    assert any("Content Security Policy" in line for line in loaded.console), loaded.stderr[-2000:]
    assert any("nosuch is not defined" in line for line in loaded.console)
