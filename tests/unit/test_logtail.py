"""LogTail (supervisor.adapters.logtail) on real files in tmp_path: appends in pieces, partial and
huge lines, CR/CRLF, truncation, rotation, removal, a file appearing later, resuming."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from supervisor.adapters.logtail import LogTail, TailPosition


def append(path: Path, data: bytes) -> None:
    with open(path, "ab") as f:
        f.write(data)


def opened(log: Path, content: bytes = b"") -> LogTail:
    """A tail on ``log``, written with ``content`` first."""
    log.write_bytes(content)
    return LogTail(log)


def at(log: Path, offset: int) -> TailPosition:
    """Where a tail stands ``offset`` bytes into the file now at ``log``."""
    st = os.stat(log)
    return TailPosition(st.st_dev, st.st_ino, offset)


def test_missing_file_then_appearing(tmp_path: Path) -> None:
    log = tmp_path / "slurm-1.out"
    tail = LogTail(log)
    assert tail.read_lines() == []
    assert tail.position is None
    append(log, b"hello\n")
    assert tail.read_lines() == ["hello"]
    assert tail.position == at(log, 6)


def test_appends_in_pieces_and_partial_lines(tmp_path: Path) -> None:
    log = tmp_path / "out"
    tail = opened(log)
    assert tail.read_lines() == []
    append(log, b"iteration 1 | lo")
    assert tail.read_lines() == []
    assert tail.pending_bytes == len(b"iteration 1 | lo")
    append(log, b"ss 2.5\niteration 2")
    assert tail.read_lines() == ["iteration 1 | loss 2.5"]
    append(log, b" | loss 2.4\n\nnext\n")
    assert tail.read_lines() == ["iteration 2 | loss 2.4", "", "next"]
    assert tail.read_lines() == []
    assert tail.pending_bytes == 0


def test_byte_by_byte_equals_all_at_once(tmp_path: Path) -> None:
    data = "a\r\nbé\r10%\r20%\nc\u20ac\n\rtail\r\n".encode()
    whole, pieces = tmp_path / "whole", tmp_path / "pieces"
    whole.write_bytes(data)
    pieces.write_bytes(b"")
    expected = LogTail(whole).read_lines()
    assert expected == ["a", "bé", "10%", "20%", "c\u20ac", "tail"]
    tail = LogTail(pieces)
    got: list[str] = []
    for i in range(len(data)):
        append(pieces, data[i : i + 1])
        got += tail.read_lines()
    assert got == expected


def test_read_is_bounded_per_call(tmp_path: Path) -> None:
    log = tmp_path / "out"
    log.write_bytes(b"".join(b"line %d\n" % i for i in range(1000)))
    tail = LogTail(log)
    first = tail.read_lines(max_bytes=100)
    assert 0 < len(first) <= 100 // len(b"line 0\n") + 1
    rest: list[str] = []
    while batch := tail.read_lines(max_bytes=100):
        rest += batch
    assert first + rest == [f"line {i}" for i in range(1000)]


def test_crlf_and_cr_progress_bars(tmp_path: Path) -> None:
    log = tmp_path / "out"
    log.write_bytes(b"one\r\ntwo\r\n\r  0%|  | 0/10\r 50%|# | 5/10\r100%|##| 10/10\nthree\n")
    assert LogTail(log).read_lines() == ["one", "two", "  0%|  | 0/10", " 50%|# | 5/10", "100%|##| 10/10", "three"]


def test_crlf_split_across_reads_is_one_break(tmp_path: Path) -> None:
    log = tmp_path / "out"
    tail = opened(log, b"one\r")
    assert tail.read_lines() == ["one"]
    append(log, b"\ntwo\n")
    assert tail.read_lines() == ["two"]


def test_invalid_utf8_is_replaced(tmp_path: Path) -> None:
    log = tmp_path / "out"
    tail = opened(log, b"ok \xff\xfe bad\n\xe2\x82")  # then a euro sign cut across writes
    assert tail.read_lines() == ["ok \ufffd\ufffd bad"]
    append(log, b"\xac\n")
    assert tail.read_lines() == ["\u20ac"]


def test_huge_line_is_cut_and_counted(tmp_path: Path) -> None:
    log = tmp_path / "out"
    log.write_bytes(b"short\n")
    tail = LogTail(log, max_line_bytes=1000)
    assert tail.read_lines() == ["short"]
    for _ in range(50):  # 5,000 bytes without a newline, in pieces
        append(log, b"x" * 100)
        tail.read_lines()
        assert tail.pending_bytes <= 1000
    append(log, b"y" * 100 + b"\nafter\n")
    assert tail.read_lines() == ["after"]
    assert tail.cut_lines == 1


def test_huge_line_in_one_read(tmp_path: Path) -> None:
    log = tmp_path / "out"
    log.write_bytes(b"a" * 5000 + b"\nb\n" + b"c" * 1000 + b"\n")
    tail = LogTail(log, max_line_bytes=1000)
    assert tail.read_lines() == ["a" * 1000, "b", "c" * 1000]
    assert tail.cut_lines == 1


def test_one_mib_default_bounds_memory(tmp_path: Path) -> None:
    log = tmp_path / "out"
    log.write_bytes(b"z" * (3 * 1024 * 1024))
    tail = LogTail(log)
    lines = tail.read_lines()
    assert lines == ["z" * (1024 * 1024)]
    assert tail.pending_bytes == 0 and tail.cut_lines == 1


def test_truncation_restarts_from_zero(tmp_path: Path) -> None:
    log = tmp_path / "out"
    tail = opened(log, b"attempt 1 line 1\nattempt 1 line 2\npart")
    assert tail.read_lines() == ["attempt 1 line 1", "attempt 1 line 2"]
    log.write_bytes(b"attempt 2\n")  # requeue without --open-mode=append: truncated, rewritten
    assert tail.read_lines() == ["part", "attempt 2"]
    assert tail.truncations == 1
    append(log, b"more\n")
    assert tail.read_lines() == ["more"]


def test_open_mode_append_across_requeue(tmp_path: Path) -> None:
    log = tmp_path / "out"
    tail = opened(log, b"attempt 1\n")
    assert tail.read_lines() == ["attempt 1"]
    append(log, b"attempt 2\n")
    assert tail.read_lines() == ["attempt 2"]
    assert tail.truncations == 0 and tail.reopenings == 0


def test_rotation_drains_old_file_then_reads_new(tmp_path: Path) -> None:
    log = tmp_path / "out"
    tail = opened(log, b"old 1\n")
    assert tail.read_lines() == ["old 1"]
    append(log, b"old 2\nold tail")  # written before the rotation, not read yet
    os.rename(log, tmp_path / "out.1")
    log.write_bytes(b"new 1\n")
    assert tail.read_lines() == ["old 2", "old tail", "new 1"]
    assert tail.reopenings == 1
    assert tail.position == at(log, 6)


def test_rotation_read_in_bounded_steps(tmp_path: Path) -> None:
    log = tmp_path / "out"
    tail = opened(log)
    assert tail.read_lines() == []  # opened: the tail follows this file from now on
    append(log, b"".join(b"old %03d\n" % i for i in range(50)))
    os.rename(log, tmp_path / "out.1")
    log.write_bytes(b"".join(b"new %03d\n" % i for i in range(50)))
    got: list[str] = []
    while batch := tail.read_lines(max_bytes=64):
        got += batch
    assert got == [f"old {i:03d}" for i in range(50)] + [f"new {i:03d}" for i in range(50)]


def test_removed_file_then_recreated(tmp_path: Path) -> None:
    log = tmp_path / "out"
    tail = opened(log, b"first\nlast")
    assert tail.read_lines() == ["first"]
    log.unlink()
    assert tail.read_lines() == ["last"]
    assert tail.position is None
    assert tail.read_lines() == []
    log.write_bytes(b"again\n")
    assert tail.read_lines() == ["again"]


def test_resume_from_position(tmp_path: Path) -> None:
    log = tmp_path / "out"
    log.write_bytes(b"one\ntwo\n")
    with LogTail(log) as tail:
        assert tail.read_lines() == ["one", "two"]
        position = tail.position
    append(log, b"three\n")
    assert LogTail(log, position=position).read_lines() == ["three"]
    # Another file at the path now: the stored offset does not apply.
    os.rename(log, tmp_path / "out.1")
    log.write_bytes(b"fresh\n")
    assert LogTail(log, position=position).read_lines() == ["fresh"]


def test_start_at_end(tmp_path: Path) -> None:
    log = tmp_path / "out"
    log.write_bytes(b"backlog\n")
    tail = LogTail(log, start_at_end=True)
    assert tail.read_lines() == []
    append(log, b"live\n")
    assert tail.read_lines() == ["live"]


def test_bad_arguments(tmp_path: Path) -> None:
    with pytest.raises(ValueError):
        LogTail(tmp_path / "x", max_line_bytes=0)
    with pytest.raises(ValueError):
        LogTail(tmp_path / "x").read_lines(max_bytes=0)
