"""``[continuation] prequeue_s`` (issue 31, item 2): the time limit it counts from, and what it needs."""

from __future__ import annotations

import pytest
from test_config import MINIMAL_RUN, spec_in

from supervisor.config import ConfigError, load_run_spec
from supervisor.config.continuation_section import time_limit_of

CHECKPOINTS = '\n[checkpoints]\nroot = "/ckpt/llm/"\nresume_file = "shared/resume.json"\n'


def folder(tmp_path):
    tmp_path.mkdir(parents=True, exist_ok=True)
    (tmp_path / "shared").mkdir(exist_ok=True)
    return tmp_path


def test_prequeue_takes_the_time_limit_from_the_runs_time(tmp_path):
    text = MINIMAL_RUN + 'sbatch_args = ["--time=1-00:00:00"]\n' + CHECKPOINTS + "\n[continuation]\nprequeue_s = 1800\n"
    spec = load_run_spec(spec_in(folder(tmp_path), text))
    assert spec.continuation.prequeue_s == 1800 and spec.continuation.time_limit_s == 86400


def test_prequeue_without_a_resume_file_or_a_time_limit_is_refused(tmp_path):
    with pytest.raises(ConfigError, match="resume_file"):
        load_run_spec(
            spec_in(folder(tmp_path / "a"), MINIMAL_RUN + "\n[continuation]\nprequeue_s = 600\ntime_limit_s = 3600\n")
        )
    with pytest.raises(ConfigError, match="time limit"):
        load_run_spec(
            spec_in(folder(tmp_path / "b"), MINIMAL_RUN + CHECKPOINTS + "\n[continuation]\nprequeue_s = 600\n")
        )


@pytest.mark.parametrize(
    ("args", "seconds"),
    [(("--time=90",), 5400), (("-t", "30:00"), 1800), (("--time=12:00:00",), 43200), (("--time=2-12",), 216000)],
)
def test_slurm_time_formats(args, seconds):
    assert time_limit_of(args) == seconds
