"""The chronicle's Markdown as HTML, by markdown-it-py (CommonMark-exact, with GFM tables).

Raw HTML is off (``{"html": False}``: a ``<script>`` that slipped into the Markdown is shown as
text, never run), and so are links, images and autolinks: the chronicle writes none, so any that
appear came from a record and must not become a ``javascript:`` link. The chronicle escapes what
records say before this (domain.text_safety.markdown); this is the second wall.

Headings go one level down (the page's own ``<h1>`` is the run's title, the chronicle sits in a
section under an ``<h2>``) and get an ``id`` for linking to an incident.
"""

from __future__ import annotations

import re

from markdown_it import MarkdownIt
from markdown_it.token import Token

# breaks: a note's lines stay lines (the chronicle writes every other paragraph on one line).
_MD = MarkdownIt("commonmark", {"html": False, "breaks": True}).enable("table").disable(["link", "image", "autolink"])
_NOT_IN_ID = re.compile(r"[^a-z0-9]+")


def markdown_to_html(md: str, *, skip_title: bool = False) -> str:
    """The chronicle as HTML; ``skip_title`` leaves out its ``#`` title (the page has one)."""
    tokens = _MD.parse(md)
    if skip_title:
        tokens = _without_title(tokens)
    _headings(tokens)
    return str(_MD.renderer.render(tokens, _MD.options, {}))


def _without_title(tokens: list[Token]) -> list[Token]:
    """The tokens less the first level-1 heading (its open, inline and close tokens)."""
    for i, t in enumerate(tokens):
        if t.type == "heading_open" and t.tag == "h1":
            return tokens[:i] + tokens[i + 3 :]
    return tokens


def _headings(tokens: list[Token]) -> None:
    """Each heading one level down, with a unique ``id`` made of its words."""
    seen: dict[str, int] = {}
    for i, t in enumerate(tokens):
        if t.type not in ("heading_open", "heading_close"):
            continue
        t.tag = f"h{min(6, int(t.tag[1:]) + 1)}"
        if t.type == "heading_open":
            ident = _NOT_IN_ID.sub("-", tokens[i + 1].content.lower()).strip("-")[:80] or "section"
            seen[ident] = seen.get(ident, 0) + 1
            t.attrSet("id", ident if seen[ident] == 1 else f"{ident}-{seen[ident]}")
