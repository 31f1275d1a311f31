"""The chronicle's Markdown as HTML: the small subset ``render_markdown`` writes (headings, lists two
deep, quotes, tables, inline code and bold, plain text), every piece of text escaped."""

from __future__ import annotations

import re
from html import escape

_INLINE = re.compile(r"(?<!\\)`([^`]+)`|(?<!\\)\*\*([^*]+)\*\*")  # not where a backslash escapes the mark
_ESCAPED = re.compile(r"\\([!-/:-@\[-`{-~])")  # Markdown's backslash escape: the punctuation itself
_HEADING = re.compile(r"^(#{1,6}) (.*)$")
_ITEM = re.compile(r"^( *)- (.*)$")


def markdown_to_html(md: str, *, skip_title: bool = False) -> str:
    """The subset of Markdown the chronicle writes (headings, lists two deep, quotes, tables, text)."""
    page = _Page(skip_title)
    for line in md.splitlines():
        page.add(line)
    return page.html()


def inline(text: str) -> str:
    """Text with its `code` and **bold** spans as HTML; everything else escaped."""
    out, pos = [], 0
    for m in _INLINE.finditer(text):
        out.append(escape(_ESCAPED.sub(r"\1", text[pos : m.start()])))
        out.append(f"<code>{escape(m.group(1))}</code>" if m.group(1) is not None else f"<b>{escape(m.group(2))}</b>")
        pos = m.end()
    return "".join(out) + escape(_ESCAPED.sub(r"\1", text[pos:]))


class _Page:
    """The HTML so far, line by line; open lists and a table's pending rows are the only state."""

    def __init__(self, skip_title: bool) -> None:
        self.skip_title = skip_title
        self.out: list[str] = []
        self.depth = 0  # nesting depth of the open <ul>s
        self.table: list[list[str]] = []

    def add(self, line: str) -> None:
        if line.startswith("|"):
            self._close_lists()
            self._table_row(line)
            return
        self._flush_table()
        if m := _HEADING.match(line):
            self._close_lists()
            self._heading(len(m.group(1)), m.group(2))
        elif m := _ITEM.match(line):
            self._item(len(m.group(1)) // 2 + 1, m.group(2))
        else:
            self._close_lists()
            self._text(line)

    def html(self) -> str:
        self._flush_table()
        self._close_lists()
        return "".join(self.out).replace("</blockquote><blockquote>", "<br>")

    def _table_row(self, line: str) -> None:
        cells = [c.strip() for c in re.split(r"(?<!\\)\|", line.strip().strip("|"))]  # not at an escaped \|
        if not all(set(c) <= {"-", ":"} for c in cells):  # not the |---|---| rule under the head
            self.table.append(cells)

    def _flush_table(self) -> None:
        if not self.table:
            return
        head, *rest = self.table
        self.out.append(
            "<table><thead><tr>"
            + "".join(f"<th>{inline(c)}</th>" for c in head)
            + "</tr></thead><tbody>"
            + "".join("<tr>" + "".join(f"<td>{inline(c)}</td>" for c in r) + "</tr>" for r in rest)
            + "</tbody></table>"
        )
        self.table.clear()

    def _heading(self, level: int, text: str) -> None:
        if self.skip_title and level == 1:
            return
        ident = re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")[:80]
        self.out.append(f'<h{level + 1} id="{ident}">{inline(text)}</h{level + 1}>')

    def _item(self, depth: int, text: str) -> None:
        if depth > self.depth:
            self.out.append("<ul><li>" * (depth - self.depth))
            self.depth = depth
        else:
            self._close_lists(depth)
            self.out.append("</li><li>")
        self.out.append(inline(text))

    def _text(self, line: str) -> None:
        if line.startswith(">"):
            self.out.append(f"<blockquote>{inline(line[1:].strip())}</blockquote>")
        elif line.strip():
            self.out.append(f"<p>{inline(line)}</p>")

    def _close_lists(self, depth: int = 0) -> None:
        while self.depth > depth:
            self.out.append("</li></ul>")
            self.depth -= 1
