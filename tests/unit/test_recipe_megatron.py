"""The Megatron recipe: the supervisor's orders as Megatron arguments (supervisor.telemetry.megatron),
hostile orders refused, and the recipe's documented example (docs/recipes.md) checked against the
builder and against the supervisor's own parsers."""

from __future__ import annotations

import os
import re
import shlex
from pathlib import Path

import pytest

pytestmark = pytest.mark.torch  # the orders are read by supervisor.telemetry.torch, which imports torch
if os.environ.get("CI", "").lower() != "true":  # under CI the torch extra is installed: a missing one fails
    pytest.importorskip("torch")

from supervisor.domain.progress import parser_for  # noqa: E402
from supervisor.domain.progress.loads import LoadMark, load_mark  # noqa: E402
from supervisor.domain.progress.pauses import ends_pause, pause_of  # noqa: E402
from supervisor.telemetry.megatron import (  # noqa: E402
    EXIT_BAD_INPUT,
    MegatronArgsError,
    main,
    megatron_argv,
    read_orders,
    skip_iterations,
)
from supervisor.telemetry.torch import ResumeOrders  # noqa: E402

DOC = Path(__file__).parents[2] / "docs" / "recipes.md"
CHOSEN = "/ckpt/run/iter_0000300"
COMMAND = ["torchrun", "--nproc-per-node", "8", "pretrain_gpt.py", "--load", "/ckpt/run", "--save", "/ckpt/run"]


def orders(**env: str) -> ResumeOrders:
    return read_orders(env)


def test_resume_loads_the_chosen_iteration_not_the_trackers():
    got = megatron_argv(
        [*COMMAND, "--ckpt-step", "900"], orders(SSV_RESUME_CHECKPOINT=CHOSEN + "/"), resume_managed=True
    )
    assert got == [*COMMAND[:4], "--save", "/ckpt/run", "--load", "/ckpt/run", "--ckpt-step", "300"]


def test_no_verified_checkpoint_means_no_load_and_no_orders_mean_no_change():
    assert "--load" not in megatron_argv(COMMAND, orders(SSV_RESUME_CHECKPOINT=""), resume_managed=True)
    assert megatron_argv(COMMAND, orders(), resume_managed=False) == COMMAND


def test_skip_ranges_join_the_commands_own_skips_in_one_flag():
    command = [*COMMAND, "--iterations-to-skip", "5", "7", "--lr", "1e-4"]
    got = megatron_argv(command, orders(SSV_SKIP_ITERATIONS="61-63,100"), resume_managed=False)
    assert got.count("--iterations-to-skip") == 1
    assert got[got.index("--iterations-to-skip") :] == ["--iterations-to-skip", "5", "7", "61", "62", "63", "100"]
    assert got[got.index("--lr") + 1] == "1e-4"  # the flag's values end at the next option


def test_megatron_deepspeed_gets_ranges_and_resumes_only_what_its_tracker_names():
    ds = dict(flavor="megatron-deepspeed", resume_managed=True)
    command = [*COMMAND, "--skip-train-iteration-range", "10-20"]
    mine = orders(SSV_RESUME_CHECKPOINT=CHOSEN, SSV_SKIP_ITERATIONS="61-131 200")
    got = megatron_argv(command, mine, tracker="300\n", **ds)
    assert got[-6:] == ["--load", "/ckpt/run", "--skip-train-iteration-range", "10-20", "61-131", "200-200"]
    with pytest.raises(MegatronArgsError, match="latest_checkpointed_iteration.txt names \\(400\\)"):
        megatron_argv(command, mine, tracker="400", **ds)


def test_lr_scale_scales_every_lr_and_overrides_the_checkpoints_schedule():
    command = [*COMMAND, "--lr=3e-4", "--min-lr", "3e-5", "--lr-warmup-init", "0", "--override-opt_param-scheduler"]
    got = megatron_argv(command, orders(SSV_LR_SCALE="0.5"), resume_managed=False)
    assert got[len(COMMAND) :] == [
        "--lr",
        "0.00015",
        "--min-lr",
        "1.5e-05",
        "--lr-warmup-init",
        "0.0",
        "--override-opt_param-scheduler",
    ]
    with pytest.raises(MegatronArgsError, match="no --lr"):
        megatron_argv(COMMAND, orders(SSV_LR_SCALE="0.5"), resume_managed=False)
    with pytest.raises(MegatronArgsError, match="use-checkpoint"):
        megatron_argv(
            [*command, "--use-checkpoint-opt_param-scheduler"], orders(SSV_LR_SCALE="0.5"), resume_managed=False
        )


@pytest.mark.parametrize(
    ("env", "why"),
    [
        ({"SSV_RESUME_CHECKPOINT": "--save=/etc/iter_0000001"}, "not a Megatron iteration folder"),
        ({"SSV_RESUME_CHECKPOINT": "/ckpt/run/iter_12"}, "not a Megatron iteration folder"),
        ({"SSV_RESUME_CHECKPOINT": "iter_0000300"}, "not a Megatron iteration folder"),
        ({"SSV_RESUME_CHECKPOINT": "/ckpt/run/iter_\u0663\u0660\u0660\u0660\u0660\u0660\u0660"}, "not a Megatron"),
        ({"SSV_RESUME_CHECKPOINT": "/ckpt/run/iter_0000300\n--load /evil"}, "control characters"),
        ({"SSV_SKIP_ITERATIONS": "1-2," * 30_000}, "longer than"),
        ({"SSV_SKIP_ITERATIONS": " ".join(f"{i}-{i}" for i in range(2_000))}, "more than 1024 ranges"),
        ({"SSV_SKIP_ITERATIONS": "1-10000000000000"}, "past"),
        ({"SSV_SKIP_ITERATIONS": "1-200000"}, "more than 100000 iterations"),
        ({"SSV_SKIP_ITERATIONS": "9-3"}, "skip range"),
        ({"SSV_LR_SCALE": "nan"}, "SSV_LR_SCALE"),
    ],
)
def test_hostile_orders_are_refused_with_the_reason(env, why):
    with pytest.raises(ValueError, match=why):
        megatron_argv([*COMMAND, "--lr", "1e-4"], read_orders(env), resume_managed=True)


def test_main_prints_or_refuses_with_93(capsys):
    env = {"SSV_RESUME_CHECKPOINT": CHOSEN, "SSV_SKIP_ITERATIONS": "301-302"}
    assert main(["--dry-run", "--", *COMMAND], env) == 0
    assert shlex.split(capsys.readouterr().out)[-6:] == [
        "/ckpt/run",
        "--ckpt-step",
        "300",
        "--iterations-to-skip",
        "301",
        "302",
    ]
    assert main(["--", *COMMAND], {"SSV_RESUME_CHECKPOINT": "/nowhere"}) == EXIT_BAD_INPUT
    assert "not a Megatron iteration folder" in capsys.readouterr().err
    assert main(["--flavor", "nemo", "--", *COMMAND], {}) == EXIT_BAD_INPUT
    assert main(["--dry-run"], {}) == EXIT_BAD_INPUT


def test_skip_iterations_lists_each_once_in_order():
    assert skip_iterations(orders(SSV_SKIP_ITERATIONS="5-7 6-8,3")) == [3, 5, 6, 7, 8]


def doc_block(kind: str) -> list[str]:
    blocks = re.findall(rf"```{kind}\n(.*?)```", DOC.read_text(), flags=re.DOTALL)
    return blocks[0].splitlines()


def test_the_documented_rewrite_is_what_the_builder_does():
    script = " ".join(doc_block("bash")).replace("\\", " ")
    command = shlex.split(script[script.index("pretrain_gpt.py") :].replace("...", ""))
    env = {
        "SSV_RESUME_CHECKPOINT": "/lustre/run42/ckpt/iter_0000300",
        "SSV_SKIP_ITERATIONS": "301-310",
        "SSV_LR_SCALE": "0.5",
    }
    assert shlex.join(megatron_argv(command, read_orders(env), resume_managed=True)) == doc_block("console")[0]


def test_the_documented_megatron_lines_read_as_the_doc_says():
    lines = doc_block("log")
    assert [load_mark(x) for x in lines[:2]] == [LoadMark.BEGAN, LoadMark.ENDED]
    parser = parser_for("megatron")
    records = [r for x in lines for r in parser.feed(x)] + parser.flush()
    assert [r.step for r in records] == [320]
    record = records[0]
    assert (record.loss, record.grad_norm, record.lr) == (pytest.approx(2.456789), 0.912, 1.5e-4)
    assert record.step_time_s == pytest.approx(2.1503) and record.consumed_samples == 655360 and not record.nonfinite
    assert pause_of(lines[3]) == "a checkpoint save" and ends_pause(lines[4])
