"""A note with ``<script>`` and a ``javascript:`` link: escaped in the Markdown chronicle, inert on
the HTML page (markdown-it-py with raw HTML, links and images off, behind the chronicle's escaping)."""

import re

from markdown_it import MarkdownIt

from supervisor.adapters.logbook_html.markdown import markdown_to_html
from supervisor.adapters.logbook_html.page import render_html
from supervisor.domain.records import Event, EventKind, RunRecord
from supervisor.domain.run import RunState
from supervisor.report.chronicle import render_markdown
from supervisor.testing.kit.specs import spec

T0 = 1795910400.0
NOTE = (
    "<script>alert(1)</script> see [the runbook](javascript:alert(2)) or <javascript:alert(3)>\n"
    '<img src=x onerror="alert(4)">\n'
    "![x](javascript:alert(5))"
)


def _records() -> tuple[RunRecord, list[Event]]:
    run = RunRecord(spec(name="bob", script="/t.sbatch", partition="gpu"), RunState.RUNNING, created_at=T0)
    events = [
        Event("bob", EventKind.NOTE, NOTE, "n", T0 + 10, None, None, "alice"),
        Event("bob", EventKind.WARNING, "[click](javascript:alert(6)) <script>x</script>", "w", T0 + 20),
    ]
    return run, events


def test_the_markdown_chronicle_escapes_the_note():
    run, events = _records()
    md = render_markdown(run, [], events)
    tokens = MarkdownIt("commonmark").parse(md)  # raw HTML ON: what any other renderer would do
    found = {t.type for t in tokens} | {c.type for t in tokens for c in t.children or ()}
    assert not found & {"html_block", "html_inline", "link_open", "image"}, found
    assert "\\<script\\>alert(1)\\</script\\>" in md and "\\[the runbook\\](javascript:alert(2))" in md


def test_the_html_page_shows_the_note_inert():
    run, events = _records()
    page = render_html(run, [], events)
    chronicle = page.split('<section id="chronicle">')[1].split("</section>")[0]
    tags = re.findall(r"<[a-z][^>]*>", chronicle)
    assert not [t for t in tags if re.match(r"<(script|img|a|iframe)\b", t) or re.search(r"\b(href|src|on\w+)=", t)]
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in chronicle and "[the runbook](javascript:alert(2))" in chronicle
    assert "<br />" in chronicle  # the note's lines stay lines


def test_the_converter_itself_allows_no_html_link_or_image():
    html = markdown_to_html("<script>alert(1)</script>\n\n[a](javascript:alert(2)) ![b](x.png) <http://evil.example>")
    assert "<script" not in html and "<a " not in html and "<img" not in html
    assert "&lt;script&gt;" in html
