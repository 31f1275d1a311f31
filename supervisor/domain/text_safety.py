"""Strings from outside (node agents, job logs, Slurm) made safe for the place they are shown.

Pure functions, one per exit: the ingest checks identifiers (``is_identifier``) and refuses control
characters (``has_controls``); what is printed to a terminal, put in a Slurm reason or sent to a
webhook goes through ``printable``; what lands in the Markdown chronicle through ``markdown`` (or
``markdown_code`` inside a code span, ``markdown_block`` for a person's multi-line note); Slack's
mrkdwn through ``slack``.

Control characters are C0 (U+0000-U+001F), DEL and C1 (U+0080-U+009F) — ESC, CSI and OSC among
them, which a terminal obeys (clear the screen, set the title, write the clipboard) — and the
Unicode bidirectional overrides and isolates, which reorder what a reader sees.
"""

from __future__ import annotations

import re

MAX_IDENTIFIER = 128
_IDENTIFIER_PUNCTUATION = b":._/-"  # with ASCII letters and digits, what an identifier may hold
_BIDI = "\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069"
_CONTROL = re.compile(f"[\x00-\x1f\x7f-\x9f{_BIDI}\u2028\u2029]")
_SPACE = re.compile("[\t\n\v\f\r\u0085\u2028\u2029]")
# Markdown: what could open HTML, a link or image, an entity, code, emphasis or a table cell.
_MD_INLINE = re.compile(r"([\\`*\[\]<>&|~])|(?<![A-Za-z0-9])_|_(?![A-Za-z0-9])")
_MD_LINE_START = re.compile(r"^(\s*(?:\d+)?)([#+=.)-])")


def is_identifier(text: str, limit: int = MAX_IDENTIFIER) -> bool:
    """``[A-Za-z0-9:._/-]``, at most ``limit`` characters: a bus id, a UUID, a field or error name."""
    if len(text) > limit or not text.isascii():
        return False
    rest = text.encode("ascii").translate(None, _IDENTIFIER_PUNCTUATION)  # in C, twice a regex's speed
    return not rest or rest.isalnum()


def has_controls(text: str) -> bool:
    # Every control character is unprintable to Python (Cc, Cf, Zl, Zp): most text is done in C.
    return not text.isprintable() and _CONTROL.search(text) is not None


def printable(text: str, limit: int | None = None) -> str:
    """One line: line breaks and tabs as spaces, every other control character as ``?``; cut to
    ``limit`` characters when given."""
    text = _CONTROL.sub("?", _SPACE.sub(" ", str(text)))
    return text if limit is None or len(text) <= limit else text[: max(0, limit - 1)] + "…"


def markdown(text: str) -> str:
    """Plain text inside a Markdown line: it reads the same, and opens no HTML, link, image,
    entity, code span, emphasis or table cell; one line (it can start no heading or list)."""
    return _MD_INLINE.sub(lambda m: "\\" + m.group(0), printable(text))


def markdown_block(text: str) -> str:
    """Several lines of plain text (a note), each escaped as ``markdown`` does, and none starting
    a heading, quote, list or rule."""
    return "\n".join(_MD_LINE_START.sub(r"\1\\\2", markdown(line)) for line in str(text).splitlines())


def markdown_code(text: str) -> str:
    """Text for inside a Markdown code span: one line, no backticks (they would close it)."""
    return printable(text).replace("`", "'")


def slack(text: str) -> str:
    """Text for Slack's mrkdwn: ``&``, ``<`` and ``>`` escaped as Slack asks, so that ``<!channel>``
    pings no one and ``<URL|text>`` links nowhere; control characters as ``printable`` does."""
    return printable(text).replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
