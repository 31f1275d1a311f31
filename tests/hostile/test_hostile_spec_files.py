"""Issue 32, finding 10: the run spec (and any config) is read bounded, and only from a regular file.
``submit /dev/zero`` (any member of the instance's group may submit) grew the daemon until it was
OOM-killed; a FIFO held an API thread and its slot for good."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest

from supervisor.config import MAX_FILE_BYTES, load_run_spec
from supervisor.config.errors import ConfigError


def _refused(path: str | Path) -> str:
    with pytest.raises(ConfigError) as caught:
        load_run_spec(path)
    return str(caught.value)


def test_dev_zero_is_refused_before_it_is_read() -> None:
    assert "not a regular file" in _refused("/dev/zero")


def test_a_fifo_is_refused_at_once_without_a_writer(tmp_path: Path) -> None:
    fifo = tmp_path / "run.toml"
    os.mkfifo(fifo)
    result: list[str] = []
    reader = threading.Thread(target=lambda: result.append(_refused(fifo)), daemon=True)
    reader.start()
    reader.join(5)
    assert result and "not a regular file" in result[0], "the read of a FIFO blocked"


def test_a_spec_larger_than_a_mebibyte_is_refused(tmp_path: Path) -> None:
    big = tmp_path / "run.toml"
    big.write_text("# " + "x" * MAX_FILE_BYTES + "\n")
    assert f"larger than {MAX_FILE_BYTES} bytes" in _refused(big)
