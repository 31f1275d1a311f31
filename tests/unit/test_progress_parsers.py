"""Progress parsers (supervisor.domain.progress) against real training logs, plus properties.

Fixtures: tests/data/train_logs/ (README.md there names each file's source). Each log fixture has a
golden file ``<fixture>.golden.json`` with every record parsed from it; after a deliberate change
of the parsers regenerate them with

    UPDATE_GOLDEN=1 .venv/bin/python -m pytest tests/unit/test_progress_parsers.py

and review the diff. The golden files are not the only check: the ``test_hand_read_*`` tests
compare records against values read off the log lines by eye.
"""

from __future__ import annotations

import io
import json
import math
import os
import time
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from supervisor.domain.progress import (
    FORMATS,
    ProgressRecord,
    detect_format,
    parse_lines,
    parse_ssv_object,
    parse_trainer_state,
    parser_for,
    split_prefix,
    strip_ansi,
)
from supervisor.domain.progress.stream import MAX_PARTS
from supervisor.telemetry.jsonl import encode, report

DATA = Path(__file__).resolve().parents[1] / "data" / "train_logs"
UPDATE_GOLDEN = os.environ.get("UPDATE_GOLDEN") == "1"

# fixture -> (detected format, number of records)
LOG_CASES = {
    "megds_gpt2_3d_n16_L740-900.out": ("megatron", 20),
    "meg_gpt2_base_n8_L1420-1550.out": ("megatron", 20),
    "bloom13b_spike_iter29020-29090.log": ("megatron", 8),
    "bloom176b_spike_iter31214-31251.log": ("megatron", 11),
    "bloom176b_throughput_drop_iter42780-42784_wrapped.log": ("megatron", 5),
    "tr11_readme_epoch1_end_wrapped_L659-663.log": ("megatron", 1),
    "tr11_chronicles_eval_hang_L302-313.log": ("megatron", 1),
    "tr8_104b_exp1_glitch_iter7000-7220.log": ("megatron", 3),
    "tr8_104b_exp2_glitch_iter6900-6940.log": ("megatron", 5),
    "tr8_104b_exp11_spike_iter11446-11448.log": ("megatron", 3),
    "tr8_104b_exp12_spike_then_divergence_iter8738-9027.log": ("megatron", 8),
    "tr8b_104b_overflow_L445-462.log": ("megatron", 9),
    "issues_megatron_L5-34.log": ("megatron", 14),
    "issues_nemo_L35-47.log": ("nemo", 5),
    "issues_torchtitan_L48-71.log": ("torchtitan", 13),
    "issues_hf_trainer_L72-77.log": ("hf-trainer", 3),
    "issues_fairseq_L78-83.log": ("fairseq", 3),
}
STATE_CASES = {
    "hf_trainer_state_whisper_excerpt.json": 40,
    "hf_trainer_state_jaong_cpt.json": 10,
}


def lines_of(name: str) -> list[str]:
    return (DATA / name).read_text(encoding="utf-8").split("\n")


def records_of(name: str) -> list[ProgressRecord]:
    return parse_lines(lines_of(name), LOG_CASES[name][0])


def by_step(records: list[ProgressRecord]) -> dict[int, ProgressRecord]:
    return {r.step: r for r in records if r.step is not None}


def is_nan(value: float | None) -> bool:
    return value is not None and math.isnan(value)


def plain(value: Any) -> Any:
    """JSON-safe form: non-finite floats as strings, so golden files stay strict JSON."""
    if isinstance(value, float) and not math.isfinite(value):
        return "NaN" if math.isnan(value) else ("Infinity" if value > 0 else "-Infinity")
    if isinstance(value, list | tuple):
        return [plain(v) for v in value]
    return value


def encoded(records: list[ProgressRecord]) -> list[dict[str, Any]]:
    return [{k: plain(v) for k, v in r.as_dict().items()} for r in records]


def check_golden(name: str, document: dict[str, Any]) -> None:
    path = DATA / f"{name}.golden.json"
    text = json.dumps(document, indent=1, allow_nan=False) + "\n"
    if UPDATE_GOLDEN:
        path.write_text(text, encoding="utf-8")
    assert path.exists(), f"{path.name} missing: run with UPDATE_GOLDEN=1"
    assert json.loads(path.read_text(encoding="utf-8")) == document


# ---------------------------------------------------------------------------- golden files


@pytest.mark.parametrize("name", sorted(LOG_CASES))
def test_golden_log(name: str) -> None:
    fmt, expected = LOG_CASES[name]
    lines = lines_of(name)
    assert detect_format(lines) == fmt
    records = parse_lines(lines, fmt)
    assert len(records) == expected
    assert encoded(parse_lines(lines)) == encoded(records)  # auto mode agrees
    check_golden(name, {"source": name, "format": fmt, "records": encoded(records)})


@pytest.mark.parametrize("name", sorted(STATE_CASES))
def test_golden_trainer_state(name: str) -> None:
    records = parse_trainer_state((DATA / name).read_text(encoding="utf-8"))
    assert len(records) == STATE_CASES[name]
    check_golden(name, {"source": name, "format": "hf-trainer", "records": encoded(records)})


def test_every_fixture_has_a_case() -> None:
    fixtures = {p.name for p in DATA.iterdir() if not p.name.endswith((".golden.json", ".md"))}
    assert fixtures == set(LOG_CASES) | set(STATE_CASES)


# ---------------------------------------------------------------------------- values read by eye


def test_hand_read_megatron_deepspeed_spike_with_rank_prefix() -> None:
    # [default7]: iteration 31219/ 115311 | ... | elapsed time per iteration (s): 106.36 | ...
    r = by_step(records_of("bloom176b_spike_iter31214-31251.log"))[31219]
    assert (r.loss, r.grad_norm, r.step_time_s) == (5.098124, 960.351, 106.36)
    assert (r.samples_per_s, r.tflops, r.rank) == (19.256, 147.43, 7)
    assert (r.consumed_samples, r.consumed_tokens, r.global_batch_size) == (47778736, 97850851328, 2048)
    assert r.loss_scale is None and r.nonfinite is False
    assert [r.step for r in records_of("bloom176b_spike_iter31214-31251.log")] == [
        *range(31214, 31223),
        31250,
        31251,
    ]


def test_hand_read_terminal_wrapped_lines() -> None:
    records = records_of("bloom176b_throughput_drop_iter42780-42784_wrapped.log")
    assert [r.step for r in records] == [42780, 42781, 42782, 42783, 42784]
    assert [r.step_time_s for r in records] == [105.16, 105.17, 106.25, 110.17, 111.14]
    r = records[3]
    # "... | learning" / " rate: 4.475E-05 | ... | number of nan" / "iterations:  0 | ..."
    assert (r.lr, r.loss, r.grad_norm) == (4.475e-05, 2.124820, 0.135)
    assert (r.skipped_iters, r.nan_iters, r.samples_per_s, r.tflops) == (0, 0, 18.589, 142.32)
    assert r.rank == 7


def test_hand_read_wrap_inside_words() -> None:
    # "... elapsed time per iteration (s)" / ": 104.70 | ... | number of sk" / "ipped iterations: ..."
    (r,) = records_of("tr11_readme_epoch1_end_wrapped_L659-663.log")
    assert (r.step, r.step_time_s, r.lr, r.loss) == (85376, 104.70, 1.150e-05, 1.979558)
    assert (r.skipped_iters, r.nan_iters, r.tflops) == (0, 0, 149.77)


def test_hand_read_skipped_iterations_and_missing_fields() -> None:
    records = by_step(records_of("meg_gpt2_base_n8_L1420-1550.out"))
    warmup = records[10]  # all 10 iterations skipped: no lm loss, no grad norm
    assert (warmup.loss, warmup.grad_norm, warmup.skipped_iters) == (None, None, 10)
    assert (warmup.loss_scale, warmup.step_time_s, warmup.lr) == (8388608.0, 3.1713, 0.0)
    assert warmup.nonfinite is False  # the missing loss is explained by the skipped iterations
    r = records[30]
    assert (r.loss, r.grad_norm, r.skipped_iters, r.step_time_s) == (26.48119, 67.033, 1, 1.6137)


def test_hand_read_missing_loss_without_skips_is_nonfinite() -> None:
    records = by_step(records_of("tr8_104b_exp12_spike_then_divergence_iter8738-9027.log"))
    last = records[9027]  # "| global batch size: 192 | loss scale: 8192.0 |": no lm loss
    assert (last.loss, last.loss_scale, last.grad_norm, last.skipped_iters) == (None, 8192.0, 20609.780, 0)
    assert last.nonfinite is True
    assert records[8741].loss == 7.267764 and records[8741].nonfinite is False


def test_hand_read_megatron_variants() -> None:
    records = by_step(records_of("issues_megatron_L5-34.log"))
    new = records[43]  # [2024-04-06 02:59:36] iteration 43/ 100 | ... throughput per GPU ...: 239.8
    assert (new.step_time_s, new.tflops, new.loss, new.lr, new.grad_norm) == (
        5.4449,
        239.8,
        1.825991,
        8.6e-06,
        1.426,
    )
    assert records[29].loss == 0.8716962  # Megatron-Bridge: lm loss, not the MTP losses
    nan = records[5426]  # Megatron-DeepSpeed: grad norm: nan, no lm loss
    assert is_nan(nan.grad_norm) and nan.loss is None and nan.nonfinite
    assert (nan.consumed_tokens, nan.samples_per_s, nan.tflops) == (88899584, 1.883, 78.36)
    cut = records[20]  # the excerpt ends "| number of skipp [...]": what is there is kept
    assert (cut.loss, cut.grad_norm, cut.skipped_iters) == (10.05022, 217.199, None)
    assert records[124].step_time_s == 89.4748


def test_hand_read_nemo() -> None:
    records = records_of("issues_nemo_L35-47.log")
    bar_nan, bar_rate, *nemo2 = records
    assert bar_nan.step == 9000 and is_nan(bar_nan.loss) and bar_nan.nonfinite  # nan.0
    assert (bar_nan.step_time_s, bar_nan.consumed_samples) == (0.615, 630000)
    assert (bar_rate.step, bar_rate.loss, bar_rate.step_time_s) == (794, 3.090, 41.36)  # 41.36s/it
    assert [(r.step, r.loss, r.step_time_s, r.lr) for r in nemo2] == [
        (120, 1.233, 0.03146, 3e-05),
        (121, 1.288, 0.03163, 3e-05),
        (122, 1.333, 0.03215, 3e-05),
    ]


def test_hand_read_torchtitan() -> None:
    records = records_of("issues_torchtitan_L48-71.log")
    first = records[0]
    assert (first.step, first.loss, first.tokens_per_s, first.tflops, first.rank) == (
        200,
        6.1384,
        5856.0,
        339.16,
        0,
    )
    assert by_step(records)[23].tokens_per_s == 212462.0
    newer = [r for r in records if r.grad_norm is not None]
    assert [(r.step, r.grad_norm, r.rank) for r in newer] == [(4, 26.625, None), (4, 26.625, None), (5, 46.5, None)]
    pipeline = records[-2:]  # "loss: -1.0000" on a stage without the loss
    assert [(r.step, r.loss) for r in pipeline] == [(1, None), (2, None)]


def test_hand_read_hf_console_and_fairseq() -> None:
    first = records_of("issues_hf_trainer_L72-77.log")[0]
    assert (first.step, first.loss, first.lr, first.epoch) == (None, 0.2051, 9.774074342405685e-06, 0.53)
    assert is_nan(first.grad_norm) and first.nonfinite
    inner, summary, js = records_of("issues_fairseq_L78-83.log")
    assert (inner.step, inner.loss, inner.grad_norm, inner.tokens_per_s, inner.epoch) == (
        None,
        1.27,
        2.1427,
        962.0,
        10.0,
    )
    assert (summary.loss, summary.tokens_per_s, summary.lr) == (1.44, 961.0, 0.001)
    assert (js.step, js.loss, js.grad_norm, js.lr, js.tokens_per_s) == (33700, 8.206, 1.833, 0.00017226, 1195.4)
    assert js.step_time_s == pytest.approx(1 / 1.62)


def test_hand_read_trainer_state() -> None:
    whisper = parse_trainer_state((DATA / "hf_trainer_state_whisper_excerpt.json").read_text())
    assert (whisper[0].step, whisper[0].loss, whisper[0].lr, whisper[0].epoch) == (
        25,
        0.3048,
        4.6000000000000004e-07,
        0.19,
    )
    assert whisper[0].grad_norm is None  # older schema
    jaong = parse_trainer_state((DATA / "hf_trainer_state_jaong_cpt.json").read_text())
    assert (jaong[0].step, jaong[0].loss, jaong[0].grad_norm) == (500, 1.1409, 2.757542133331299)


def test_hand_read_deepspeed_overflow_lines_between_records() -> None:
    records = by_step(records_of("tr8b_104b_overflow_L445-462.log"))
    assert sorted(records) == list(range(17060, 17069))
    assert [records[s].loss_scale for s in (17062, 17063, 17064, 17065)] == [1048576.0, 524288.0, 262144.0, 131072.0]
    assert records[17063].step_time_s == 424.3778


# ---------------------------------------------------------------------------- constructed lines
# Built from the real lines above where the real logs lack the case (srun labels, colour codes,
# tqdm refreshes); each says what it adds.

MEGATRON = lines_of("tr8_104b_exp2_glitch_iter6900-6940.log")[0]


@pytest.mark.parametrize(
    ("prefix", "rank"),
    [
        ("3: ", 3),  # srun --label
        ("  12: ", 12),  # srun pads the label
        ("[default7]:", 7),  # torchrun --tee
        ("[rank5]:", 5),
        ("0: [default3]:", 0),  # srun task id over torchrun's local rank
        ("[default0]:[rank3]:", 3),  # a global rank wins
    ],
)
def test_rank_prefixes(prefix: str, rank: int) -> None:
    (r,) = parse_lines([prefix + MEGATRON], "megatron")
    assert (r.rank, r.step, r.loss) == (rank, 6900, 6.365808)


def test_prefix_lookalikes_are_not_ranks() -> None:
    assert split_prefix("[2022-05-01 03:56:11] PULSE: x") == (None, "[2022-05-01 03:56:11] PULSE: x")
    assert split_prefix("[Rank 43] (after 1 iterations)")[0] is None
    assert split_prefix("12:30:45 INFO")[0] is None


def test_ansi_colours_are_removed() -> None:
    line = lines_of("issues_torchtitan_L48-71.log")[3]  # the step 200 line
    coloured = line.replace("step:", "\x1b[31mstep:").replace("loss:", "\x1b[32mloss:") + "\x1b[39m"
    assert strip_ansi(coloured) == line
    assert records_of("issues_torchtitan_L48-71.log")[0] == parse_lines([coloured], "torchtitan")[0]


def test_tqdm_refreshes_split_at_carriage_returns() -> None:
    bar = "Epoch 0:  {p}%|#  | {n}/10 [00:0{n}<00:09,  1.25it/s, reduced_train_loss={loss}, global_step={s}.0]"
    line = "\r".join(bar.format(p=n * 10, n=n, loss=3 - n / 10, s=n - 1) for n in (1, 2, 3))
    records = parser_for("nemo").feed(line + "\n")
    assert [(r.step, r.loss, r.step_time_s) for r in records] == [(0, 2.9, 0.8), (1, 2.8, 0.8), (2, 2.7, 0.8)]


def test_hf_dict_takes_the_training_bar_step() -> None:
    parser = parser_for("hf-trainer")
    lines = [
        " 5%|5         | 50/1000 [00:30<09:30,  1.66it/s]",
        "\r100%|##########| 32/32 [00:05<00:00,  6.10it/s]",  # an evaluation bar: shorter
        "{'loss': 2.3, 'grad_norm': 1.5, 'learning_rate': 5e-05, 'epoch': 0.1}",
        "{'eval_loss': 2.1, 'eval_runtime': 5.2, 'epoch': 0.1}",
    ]
    (r,) = parser.feed_all(lines)
    assert (r.step, r.loss, r.grad_norm, r.lr, r.epoch) == (50, 2.3, 1.5, 5e-05, 0.1)
    assert r.step_time_s == pytest.approx(1 / 1.66)


def test_partial_record_is_flushed_by_the_next_record_and_at_the_end() -> None:
    head = MEGATRON.partition(" | lm loss:")[0]  # cut inside a record: no closing "|"
    parser = parser_for("megatron")
    assert parser.feed(head) == [] and parser.pending
    cut, full = parser.feed(MEGATRON)  # a new record: the partial one is parsed with what it has
    assert (cut.step, cut.loss, cut.loss_scale, cut.lr, cut.global_batch_size) == (6900, None, None, 6e-05, 96)
    assert (full.step, full.loss) == (6900, 6.365808)
    assert parser.pending is False
    assert parser.feed(head) == []
    assert [r.step for r in parser.flush()] == [6900]
    assert parser.flush() == []


def test_a_prefixed_line_never_continues_a_wrapped_record() -> None:
    head, _, tail = MEGATRON.partition(" | lm loss:")
    parser = parser_for("megatron")
    parser.feed("[default7]:" + head)
    (partial,) = parser.feed("[default6]: |" + tail)
    assert partial.loss is None and partial.rank == 7


def test_pending_record_is_bounded() -> None:
    parser = parser_for("megatron")
    parser.feed(" iteration 1/ 10 | consumed samples: 8")
    records = [r for _ in range(MAX_PARTS) for r in parser.feed(" | x: 1")]
    assert [r.step for r in records] == [1] and not parser.pending


def test_nemo2_line_is_not_megatron() -> None:
    line = next(x for x in lines_of("issues_nemo_L35-47.log") if x.startswith("Training epoch"))
    assert parse_lines([line], "megatron") == []
    assert detect_format([line]) == "nemo"


def test_detect_format_on_noise_and_empty_input() -> None:
    assert detect_format([]) is None
    assert detect_format(lines_of("tr11_chronicles_eval_hang_L302-313.log")[2:]) is None


def test_parser_for_names_and_aliases() -> None:
    assert parser_for("Megatron-DeepSpeed").format == "megatron"
    assert parser_for("metaseq").format == "fairseq"
    assert parser_for("jsonl").format == "ssv-jsonl"
    assert parser_for(None).format is None
    with pytest.raises(ValueError, match="unknown progress format 'nemo3'.*megatron"):
        parser_for("nemo3")


def test_from_values_equals_the_constructor() -> None:
    values: dict[str, Any] = {"step": 3, "source_format": "megatron", "loss": float("inf"), "rank": 2}
    assert ProgressRecord.from_values(dict(values)) == ProgressRecord(**values)
    assert ProgressRecord.from_values(dict(values)).nonfinite is True
    assert ProgressRecord(step=1, grad_norm=float("nan")).nonfinite is True


# ---------------------------------------------------------------------------- our JSONL protocol


def test_jsonl_report_writes_one_flushed_line() -> None:
    stream = io.StringIO()
    line = report(10, loss=2.3, step_time_s=0.5, rank_step_times_s=[0.5, 0.52], stream=stream)
    assert stream.getvalue() == line + "\n"
    assert line == '{"ssv": 1, "step": 10, "loss": 2.3, "step_time_s": 0.5, "rank_step_times_s": [0.5, 0.52]}'
    (r,) = parse_lines(stream.getvalue().split("\n"))
    assert (r.source_format, r.step, r.loss, r.step_time_s) == ("ssv-jsonl", 10, 2.3, 0.5)
    assert r.per_rank_step_time_s == (0.5, 0.52)


def test_jsonl_helper_refuses_unknown_names_and_negative_counts() -> None:
    with pytest.raises(TypeError, match="unknown metric 'los'"):
        encode(1, los=2.0)
    with pytest.raises(ValueError, match="step must not be negative"):
        encode(-1)
    with pytest.raises(ValueError, match="consumed_samples must be a whole number"):
        encode(1, consumed_samples=2.5)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ('{"ssv": 2, "step": 1}', None),  # another protocol version
        ('{"ssv": 1, "step": -1}', None),
        ('{"ssv": 1, "step": 1.5}', None),
        ('{"ssv": 1}', None),
        ('{"ssv": true, "step": 1}', None),
        ('{"ssv": 1, "step": 4, "loss": "2.0", "lr": "nan", "rank": -1}', {"step": 4, "lr": "NaN"}),
        (
            '{"ssv": 1, "step": 4, "loss": NaN, "grad_norm": "-inf"}',
            {"step": 4, "loss": "NaN", "grad_norm": "-Infinity"},
        ),
        (
            '{"ssv": 1, "step": 4, "rank_step_times_s": [1, null, "x"], "extra": 1}',
            {"step": 4, "per_rank_step_time_s": [1.0, "NaN", "NaN"]},
        ),
        ('{"ssv": 1, "step": 4, "rank": 6} trailing', {"step": 4, "rank": 6}),
    ],
)
def test_jsonl_reading_rules(text: str, expected: dict[str, Any] | None) -> None:
    r = parse_ssv_object(text)
    if expected is None:
        assert r is None
        return
    assert r is not None
    got = {k: plain(v) for k, v in r.as_dict().items() if k not in ("source_format", "nonfinite")}
    assert got == expected


def test_jsonl_rank_field_wins_over_the_prefix() -> None:
    (r,) = parse_lines(['3: {"ssv": 1, "step": 2, "rank": 17}'])
    assert r.rank == 17
    (r,) = parse_lines(['3: {"ssv": 1, "step": 2}'])
    assert r.rank == 3


# ---------------------------------------------------------------------------- properties

REAL_LINES = [line for name in sorted(LOG_CASES) for line in lines_of(name) if line.strip()]
FRAGMENTS = [
    "iteration",
    " iteration 5/ 10 |",
    "|",
    ":",
    " | ",
    "lm loss: ",
    "nan",
    "-inf",
    "1.5E+00",
    "{",
    "}",
    "'loss': ",
    '"ssv": 1, "step": ',
    "[default7]:",
    "3: ",
    "[rank0]:",
    "\r",
    "\n",
    "\x1b[31m",
    "Epoch 0: ",
    "| 5/10 [",
    "global_step=",
    "]",
    "step: ",
    "loss: ",
    "tps: ",
    "Training epoch 0, iteration 1/2 |",
    "epoch 001 |",
    "num_updates=",
    "=",
    ",",
    " ",
    "é",
    "\x00",
]
texts = st.one_of(
    st.text(),
    st.lists(st.one_of(st.sampled_from(FRAGMENTS), st.text(max_size=4)), max_size=40).map("".join),
)
FUZZ = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@FUZZ
@given(st.lists(texts, max_size=12))
def test_parsers_never_raise_on_arbitrary_text(lines: list[str]) -> None:
    for name in (*FORMATS, None):
        records = parse_lines(lines, name)
        assert all(isinstance(r, ProgressRecord) for r in records)
    detect_format(lines)
    parse_trainer_state("\n".join(lines))


@FUZZ
@given(st.sampled_from(REAL_LINES), st.integers(0, 400), st.integers(0, 40), texts)
def test_parsers_never_raise_on_damaged_real_lines(line: str, at: int, cut: int, insert: str) -> None:
    damaged = line[:at] + insert + line[at + cut :]
    for name in (*FORMATS, None):
        parse_lines([damaged, line[:at], line[at:]], name)


LONG = 50_000
PATHOLOGICAL = [
    "iteration 1/2 |" + " a" * LONG,  # no colon anywhere after the fields start
    " iteration 1/ 2 | a" + ": b" * LONG,
    "Epoch 0:" + "1" * LONG,  # a digit run with no "/"
    "Epoch 0: " + "12/" * LONG,
    "step: 1 loss: 2 tps: " + "x" * LONG,
    "epoch 1: 1 / 2 " + "a" * LONG,
    "{'" + "'a': 1, " * LONG,
    '{"ssv": 1, "step": 1, "x": ' + "[" * LONG,
    "[default7]:" * LONG,
    "\x1b[" * LONG,
]


@pytest.mark.timing
@pytest.mark.parametrize("text", PATHOLOGICAL, ids=lambda t: repr(t[:16]))
def test_long_lines_cost_linear_time(text: str) -> None:
    # A backtracking regex made the first case take minutes at 100,000 characters.
    start = time.perf_counter()
    for name in (*FORMATS, None):
        parse_lines([text, text[: LONG // 2]], name)
    assert time.perf_counter() - start < 2.0


finite_or_not = st.floats(allow_nan=True, allow_infinity=True)
counts = st.integers(0, 2**53)
metrics = st.fixed_dictionaries(
    {},
    optional={
        **dict.fromkeys(
            (
                "loss",
                "grad_norm",
                "lr",
                "step_time_s",
                "tokens_per_s",
                "samples_per_s",
                "tflops",
                "loss_scale",
                "epoch",
            ),
            finite_or_not,
        ),
        **dict.fromkeys(
            ("skipped_iters", "nan_iters", "consumed_samples", "consumed_tokens", "global_batch_size", "rank"), counts
        ),
        "rank_step_times_s": st.lists(st.one_of(st.floats(min_value=0), st.just(math.nan)), max_size=16),
    },
)


def same(a: Any, b: Any) -> bool:
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a):
        return math.isnan(b)
    return bool(a == b)


@FUZZ
@given(counts, metrics, st.sampled_from(["", "[default7]:", "5: "]))
def test_jsonl_round_trip(step: int, values: dict[str, Any], prefix: str) -> None:
    stream = io.StringIO()
    report(step, stream=stream, **values)
    (r,) = parse_lines([prefix + stream.getvalue()], "ssv-jsonl")
    assert r.step == step
    times = values.pop("rank_step_times_s", None)
    if times is not None:
        assert r.per_rank_step_time_s is not None
        assert all(same(a, b) for a, b in zip(times, r.per_rank_step_time_s, strict=True))
    for key, value in values.items():
        assert same(value, getattr(r, key)), key
    assert r.nonfinite == any(
        isinstance(values.get(k), float) and not math.isfinite(values[k]) for k in ("loss", "grad_norm")
    )


positive = st.floats(min_value=1e-6, max_value=1e6, allow_nan=False)


@FUZZ
@given(
    st.integers(1, 10**7),
    st.integers(0, 10**9),
    positive,
    positive,
    st.one_of(positive, st.just(float("nan"))),
    positive,
    st.integers(0, 3),
    st.sampled_from(["", "[default7]:", "[2024-04-06 02:59:36]"]),
)
def test_megatron_lines_as_megatron_writes_them(
    step: int, samples: int, ms: float, lr: float, loss: float, gnorm: float, skipped: int, prefix: str
) -> None:
    # The field formats of Megatron-LM's training_log().
    line = (
        f"{prefix} iteration {step:8d}/ 1000000 | consumed samples: {samples:12d} |"
        f" elapsed time per iteration (ms): {ms:.1f} | learning rate: {lr:.3E} |"
        f" global batch size: {512:5d} | lm loss: {loss:.6E} | loss scale: 1.0 |"
        f" grad norm: {gnorm:.3f} | number of skipped iterations: {skipped:3d} |"
        f" number of nan iterations: {0:3d} |"
    )
    (r,) = parse_lines([line], "megatron")
    assert (r.step, r.consumed_samples, r.skipped_iters, r.nan_iters) == (step, samples, skipped, 0)
    assert r.step_time_s == pytest.approx(float(f"{ms:.1f}") / 1000)
    assert r.lr == float(f"{lr:.3E}") and r.grad_norm == float(f"{gnorm:.3f}")
    assert same(r.loss, float(f"{loss:.6E}")) and r.nonfinite == math.isnan(loss)
