"""A batch script's own ``#SBATCH`` lines, read as sbatch reads them (``src/sbatch/opt.c``,
``_opt_batch_script`` and ``_get_argument``), so that what the command line does not override
(``sbatch_options.SCRIPT_OWNED``) cannot slip past the check by its spelling (issue 32, finding 10):

* a directive is a line that starts, at its first character, with ``#SBATCH`` or ``#SLURM``; its
  options follow at once (``#SBATCH--array=1`` is one);
* words are split on whitespace, with single or double quotes (the quotes dropped) and backslash
  escapes; an unquoted ``#`` ends the line (a comment); an unmatched quote is sbatch's fatal error;
* every directive line's words are one argument list (``#SBATCH --nodelist`` then ``#SBATCH n1``);
* the first line that is neither blank nor a comment ends the directives.

The script is opened without following a FIFO's wait (``O_NONBLOCK``), read only as a regular
file, and at most ``MAX_HEAD_BYTES`` of it: sbatch's own default limit on a whole script
(``max_script_size``) is 4 MiB.
"""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass
from pathlib import Path

MAGIC_WORDS = ("#SBATCH", "#SLURM")
MAX_HEAD_BYTES = 4 << 20


@dataclass(frozen=True)
class Directive:
    number: int  # the line's number in the script
    line: str
    words: tuple[str, ...]


class UnreadableScript(ValueError):
    """What keeps the script's directives from being read (the message says what and why)."""


def script_head(script: Path) -> bytes:
    """At most ``MAX_HEAD_BYTES`` + 1 bytes of the script, a regular file (never a FIFO's wait)."""
    fd = os.open(script, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise UnreadableScript(f"{script} is not a regular file")
        chunks, size = [], 0
        while size <= MAX_HEAD_BYTES and (chunk := os.read(fd, MAX_HEAD_BYTES + 1 - size)):
            chunks.append(chunk)
            size += len(chunk)
        return b"".join(chunks)
    finally:
        os.close(fd)


def directives(head: bytes) -> list[Directive]:
    """The script's directive lines, each with the words sbatch reads from it."""
    lines = head.split(b"\n")
    found: list[Directive] = []
    for number, raw in enumerate(lines, start=1):
        if len(head) > MAX_HEAD_BYTES and number == len(lines):
            raise UnreadableScript("its #SBATCH lines run past 4 MiB, more than sbatch takes in a whole script")
        line = raw.decode("utf-8", errors="replace").rstrip("\r")
        magic = next((m for m in MAGIC_WORDS if line.startswith(m)), None)
        if magic is not None:
            found.append(Directive(number, line, tuple(_words(line[len(magic) :], number))))
        elif line.strip() and not line.lstrip().startswith("#"):
            break  # the first command: sbatch reads no further
    return found


def _words(text: str, number: int) -> list[str]:
    """The words of one directive line (after its magic word), as sbatch's ``_get_argument``:
    unquoted whitespace ends a word even after a backslash. (An empty word, ``''``, ends sbatch's
    reading of the line; here it is a word, so what follows is still checked: stricter.)"""
    words: list[str] = []
    word: list[str] | None = None  # the open word, None between words
    quote, escaped = "", False
    for char in text:
        if not quote and char.isspace():
            if word is not None:
                words.append("".join(word))
            word, escaped = None, False
            continue
        if not quote and not escaped and char == "#":
            break  # the rest of the line is a comment
        word = word if word is not None else []
        if escaped:
            word.append(char)
            escaped = False
        elif char == "\\":
            escaped = True
        elif quote and char == quote:
            quote = ""
        elif quote or char not in "\"'":
            word.append(char)
        else:
            quote = char
    if quote:
        raise UnreadableScript(f"line {number}: unmatched {quote} (sbatch refuses the script)")
    return words + (["".join(word)] if word is not None else [])
