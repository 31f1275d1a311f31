"""Issue 32, finding 10 for the batch script: its ``#SBATCH`` lines are read as sbatch reads them
(``src/sbatch/opt.c``: the magic words ``#SBATCH`` and ``#SLURM`` at the start of a line, the
options right after them, quotes and backslashes, an unquoted ``#`` ending the line, every line's
words one argument list), so a directive the command line does not override cannot slip past the
check by its spelling; and the script is read bounded, as a regular file only. Before: a comment
after the option, quotes, ``#SLURM``, no space after ``#SBATCH`` or a value on the next directive
line each let ``--nodelist``/``--array``/``--dependency`` through, and a script of one endless
comment line was read whole into memory."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from test_config import MINIMAL_RUN, error_of, spec_in

from supervisor.config import load_run_spec

HEAD = "#!/bin/bash\n#SBATCH --time=1:00:00\n"


@pytest.mark.parametrize(
    "directive",
    [
        "#SBATCH --nodelist=gpu-1 # keep to the good node",
        '#SBATCH "--array=1-3"',
        "#SBATCH '--dependency=afterok:1'",
        "#SBATCH --time=1:00:00 --array=1-3#comment",
        "#SBATCH--array=1-3",
        "#SLURM --array=1-3",
        "#SBATCH --nodelist\n#SBATCH gpu-1",  # getopt takes the next word as the value, next line or not
        "#SBATCH -\\w gpu-1",
        "#SBATCH --wait",
        "#SBATCH --time=1:00:00\t-a 1-3",
    ],
)
def test_a_directive_sbatch_reads_is_checked_however_it_is_spelled(tmp_path: Path, directive: str) -> None:
    message = error_of(spec_in(tmp_path, MINIMAL_RUN, script=HEAD + directive + "\nsrun true\n"))
    assert "of the script" in message and "delete that line" in message, message


@pytest.mark.parametrize(
    "directive",
    [
        "#SBATCH --time=1:00:00 # --array=1-3 is only a comment",
        "  #SBATCH --array=1-3",  # not at the line's start: sbatch reads a comment
        "# SBATCH --array=1-3",
        "#SBATCH --comment='a # in quotes' --job-name=x",
    ],
)
def test_what_sbatch_reads_as_a_comment_is_no_directive(tmp_path: Path, directive: str) -> None:
    spec = load_run_spec(spec_in(tmp_path, MINIMAL_RUN, script=HEAD + directive + "\nsrun true\n"))
    assert spec.nodes == 16


def test_a_directive_line_sbatch_cannot_read_is_refused(tmp_path: Path) -> None:
    message = error_of(spec_in(tmp_path, MINIMAL_RUN, script=HEAD + "#SBATCH --job-name='unclosed\nsrun true\n"))
    assert "unmatched" in message.lower()


def test_a_script_of_one_endless_comment_is_refused_unread(tmp_path: Path) -> None:
    path = spec_in(tmp_path, MINIMAL_RUN, script="#!/bin/bash\n# " + "x" * (8 << 20))
    message = error_of(path)
    assert "4 MiB" in message, message


def test_a_script_that_is_not_a_regular_file_is_refused_without_blocking(tmp_path: Path) -> None:
    path = spec_in(tmp_path, MINIMAL_RUN)
    script = tmp_path / "train.sbatch"
    script.unlink()
    os.mkfifo(script)
    message = error_of(path)
    assert "not a file" in message or "regular file" in message, message
