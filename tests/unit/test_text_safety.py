"""Strings from outside made safe for each exit (supervisor/domain/text_safety.py)."""

from __future__ import annotations

import re

import pytest
from hypothesis import given
from hypothesis import strategies as st
from markdown_it import MarkdownIt

from supervisor.domain.text_safety import (
    has_controls,
    is_identifier,
    markdown,
    markdown_block,
    markdown_code,
    printable,
    slack,
)


@pytest.mark.parametrize(
    ("text", "ok"),
    [
        ("00000000:19:00.0", True),
        ("GPU-5f0e5b7e-1a2b-3c4d-5e6f-000000000000", True),
        ("MIG-GPU-5f0e5b7e/1/0", True),
        ("535.104.05", True),
        ("", True),
        ("x" * 128, True),
        ("x" * 129, False),
        ("GPU 0", False),
        ("a\x1bb", False),
        ("ümlaut", False),
        ("a<b>", False),
    ],
)
def test_identifiers(text, ok):
    assert is_identifier(text) is ok


def test_printable_keeps_words_and_drops_their_power():
    assert printable("a\tb\nc\r\x1b[2Jd\x9be\u202ef\x00") == "a b c ?[2Jd?e?f?"
    assert printable("x" * 10, 5) == "xxxx…" and printable("short", 5) == "short"
    assert not has_controls(printable("".join(map(chr, range(0x2100)))))


def test_markdown_escapes_only_what_could_act():
    assert markdown("report_seq 3 (gpu 0), a-b.c") == "report_seq 3 (gpu 0), a-b.c"
    assert markdown("_x_ *y* [l](u) <b> & | `c`") == r"\_x\_ \*y\* \[l\](u) \<b\> \& \| \`c\`"
    assert markdown_code("a `b` <c>") == "a 'b' <c>"


def test_a_note_keeps_its_lines_but_starts_no_block():
    assert markdown_block("# h\n1. one\n  - two\n12) x\n---\nplain # text") == (
        "\\# h\n1\\. one\n  \\- two\n12\\) x\n\\---\nplain # text"
    )


@given(st.text(max_size=60))
def test_markdown_text_renders_as_itself(text):
    line = "- **Evidence**: " + markdown(text)  # where the chronicle puts it: inside a line of its own
    tokens = MarkdownIt("commonmark").parse(line)
    inline = [c.type for t in tokens if t.type == "inline" for c in t.children or ()]
    assert set(inline) <= {"text", "strong_open", "strong_close"} and inline.count("strong_open") == 1, inline
    assert [t.type for t in tokens if t.block and t.nesting == 1] == [
        "bullet_list_open",
        "list_item_open",
        "paragraph_open",
    ]


def test_slack_pings_no_one():
    assert slack("<!channel> & <https://x|y>") == "&lt;!channel&gt; &amp; &lt;https://x|y&gt;"


@given(
    st.text(alphabet=st.characters(max_codepoint=0x3000), max_size=40)
    | st.from_regex(r"[A-Za-z0-9:._/-]{0,140}", fullmatch=True)
)
def test_the_fast_checks_say_what_the_patterns_say(text):
    """is_identifier and has_controls answer in C first; they must agree with the plain patterns."""
    assert is_identifier(text) is (len(text) <= 128 and re.fullmatch(r"[A-Za-z0-9:._/-]*", text) is not None)
    assert has_controls(text) is (
        re.search("[\x00-\x1f\x7f-\x9f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069\u2028\u2029]", text) is not None
    )
