"""sbatch's option grammar as supervisor.config.sbatch_options reads it (checked against sbatch
22.05.8's own getopt errors when the table was made; see the module docstring)."""

from __future__ import annotations

import pytest

from supervisor.config.sbatch_options import LONG, SHORT, Arg, SbatchArgError, read_options


def read(*args: str) -> list[tuple[str | None, str | None, int]]:
    return [(o.name, o.value, o.index) for o in read_options(args)]


def test_long_options_with_attached_or_separate_values():
    assert read("--time=10", "--time", "20", "--hold") == [("time", "10", 0), ("time", "20", 1), ("hold", None, 3)]


def test_a_required_value_is_taken_even_when_it_looks_like_an_option():
    assert read("--constraint", "-xgpu", "-t", "--wait") == [("constraint", "-xgpu", 0), ("time", "--wait", 2)]


def test_bundled_short_options_end_at_the_first_that_takes_a_value():
    assert read("-vQxgpu-[1-2]") == [("verbose", None, 0), ("quiet", None, 0), ("exclude", "gpu-[1-2]", 0)]
    assert read("-vN", "4") == [("verbose", None, 0), ("nodes", "4", 0)]


def test_optional_values_only_attached():
    assert read("-k", "--exclusive", "--exclusive=user", "-koff") == [
        ("no-kill", None, 0),
        ("exclusive", None, 1),
        ("exclusive", "user", 2),
        ("no-kill", "off", 3),
    ]


def test_prefixes_and_aliases():
    assert read("--reserv=r", "--cluster=x", "--tasks=2") == [
        ("reservation", "r", 0),
        ("clusters", "x", 1),
        ("ntasks-per-node", "2", 2),
    ]


def test_a_long_name_this_table_lacks_passes_and_the_next_element_is_still_read():
    assert read("--tres-per-task=gpu:1", "--oom-kill-step", "-W") == [
        (None, "gpu:1", 0),
        (None, None, 1),
        ("wait", None, 2),
    ]


@pytest.mark.parametrize(
    ("args", "index", "problem"),
    [
        (["--ex"], 0, "ambiguous"),
        (["--hold=1"], 0, "takes no value"),
        (["-Z"], 0, "no option -Z"),
        (["--time"], 0, "needs a value"),
        (["-vt"], 0, "needs a value"),
        (["-v", "script.sh"], 1, "not an option"),
        (["--"], 0, "not an option"),
    ],
)
def test_what_sbatch_could_not_read(args, index, problem):
    with pytest.raises(SbatchArgError) as caught:
        read_options(args)
    assert caught.value.index == index and problem in caught.value.problem


def test_every_short_letter_names_a_long_option():
    assert set(SHORT.values()) <= set(LONG)
    assert {name for name, kind in LONG.items() if kind is Arg.OPTIONAL} == {
        "exclusive",
        "get-user-env",
        "nice",
        "no-kill",
        "propagate",
    }
