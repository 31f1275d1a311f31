"""One contract for the LogSource port (a job's output, followed), run against the real ``LogTail``
on a file and the tests' ``MemoryLog`` (supervisor.testing.kit.logs), which stands in for it in every
engine test. What ``ProgressWatch`` relies on: each complete line once, in order, whatever pieces
it was written in; a partial line waits for its break; ``\\n``, ``\\r\\n`` and ``\\r`` end lines.

File-specific behaviour (truncation, rotation, huge lines, resuming) is LogTail's own, in
tests/unit/test_logtail.py.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

from supervisor.adapters.logtail import LogTail
from supervisor.ports import LogSource
from supervisor.testing.kit.logs import MemoryLog


@dataclass
class Output:
    write: Callable[[str], None]  # the job appending to its output
    source: LogSource  # the supervisor following it


def _tail(tmp_path: Path, request: pytest.FixtureRequest) -> Output:
    path = tmp_path / "slurm-1000.out"

    def write(text: str) -> None:
        with open(path, "a", encoding="utf-8", newline="") as f:
            f.write(text)

    tail = LogTail(path)
    request.addfinalizer(tail.close)
    return Output(write, tail)


def _memory() -> Output:
    log = MemoryLog()
    return Output(log.write, log)


@pytest.fixture(params=["tail", "memory"])
def out(request: pytest.FixtureRequest, tmp_path: Path) -> Output:
    return _tail(tmp_path, request) if request.param == "tail" else _memory()


def test_nothing_written_reads_nothing(out: Output) -> None:
    assert out.source.read_lines() == []
    assert out.source.read_lines() == []


def test_each_complete_line_is_read_once_in_order(out: Output) -> None:
    out.write("iteration 1 | loss 2.5\niteration 2 | loss 2.4\n")
    assert out.source.read_lines() == ["iteration 1 | loss 2.5", "iteration 2 | loss 2.4"]
    assert out.source.read_lines() == []
    out.write("iteration 3 | loss 2.3\n")
    assert out.source.read_lines() == ["iteration 3 | loss 2.3"]


def test_a_partial_line_waits_for_its_break(out: Output) -> None:
    out.write("iteration 1 | lo")
    assert out.source.read_lines() == []
    out.write("ss 2.5\niteration 2")
    assert out.source.read_lines() == ["iteration 1 | loss 2.5"]
    out.write(" | loss 2.4\n")
    assert out.source.read_lines() == ["iteration 2 | loss 2.4"]


def test_empty_lines_and_text_beyond_ascii_are_kept(out: Output) -> None:
    out.write("a\n\nbé \u20ac\n")
    assert out.source.read_lines() == ["a", "", "bé \u20ac"]


def test_crlf_and_lone_cr_end_lines_and_a_refresh_adds_no_empty_line(out: Output) -> None:
    out.write("one\r\ntwo\r\n\r  0%|  | 0/10\r 50%|# | 5/10\r100%|##| 10/10\nthree\n")
    assert out.source.read_lines() == ["one", "two", "  0%|  | 0/10", " 50%|# | 5/10", "100%|##| 10/10", "three"]


def test_crlf_split_across_writes_is_one_break(out: Output) -> None:
    out.write("one\r")
    assert out.source.read_lines() == ["one"]  # a \r ends the line at once
    out.write("\ntwo\n")
    assert out.source.read_lines() == ["two"]


def test_writes_byte_by_byte_read_as_one_write(out: Output) -> None:
    text = "a\r\nb\r10%\r20%\nc\n\rtail\r\n"
    for ch in text:
        out.write(ch)
    got = out.source.read_lines()
    assert got == ["a", "b", "10%", "20%", "c", "tail"]
