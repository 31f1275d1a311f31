"""What training logs say of a checkpoint load (domain/progress/loads.py): the lines that mark a
load's start, end and failure, and the evidence an attempt's log gives."""

from __future__ import annotations

import pytest

from supervisor.domain.progress import parse_ssv_object
from supervisor.domain.progress.loads import LoadMark, LoadWatch, load_mark, load_segments


@pytest.mark.parametrize(
    ("line", "mark"),
    [
        (" loading checkpoint from /ckpt/gpt at iteration 2000", LoadMark.BEGAN),  # Megatron
        ("[default0]: loading distributed checkpoint from /ckpt at iteration 2000", LoadMark.BEGAN),
        (" successfully loaded checkpoint from /ckpt [ t 0, p 0 ] at iteration 2000", LoadMark.ENDED),
        ("[rank0]:[titan] 2024-05-01 INFO - Loading the checkpoint at step 10.", LoadMark.BEGAN),  # torchtitan
        ("[titan] INFO - Finished loading the checkpoint in 3.21 seconds.", LoadMark.ENDED),
        ("Restoring states from the checkpoint path at /r/last.ckpt", LoadMark.BEGAN),  # NeMo / Lightning
        ("Restored all states from the checkpoint at /r/last.ckpt", LoadMark.ENDED),
        ("Loading model from /out/checkpoint-500.", LoadMark.BEGAN),  # Hugging Face Trainer
        ('{"ssv": 1, "event": "checkpoint_load_start", "step": 2000}', LoadMark.BEGAN),
        ('{"ssv": 1, "event": "checkpoint_load_end", "step": 2000}', LoadMark.ENDED),
        ('{"ssv": 1, "event": "checkpoint_load_failed", "error": "shard 3 missing"}', LoadMark.FAILED),
        ("RuntimeError: Error(s) in loading state_dict for GPTModel:", LoadMark.FAILED),
        (
            "[rank3]: torch.distributed.checkpoint.api.CheckpointException: CheckpointException ranks:dict_keys([3])",
            LoadMark.FAILED,
        ),
        (
            "RuntimeError: PytorchStreamReader failed reading zip archive: failed finding central directory",
            LoadMark.FAILED,
        ),
        ("_pickle.UnpicklingError: Weights only load failed.", LoadMark.FAILED),
        ("ERROR: Failed to load checkpoint /ckpt/iter_0002000", LoadMark.FAILED),
        ("Error loading checkpoint: shard mismatch", LoadMark.FAILED),
        # not about a checkpoint load
        ("saving checkpoint at iteration 2000 to /ckpt", None),
        ('{"ssv": 1, "event": "checkpoint_start"}', None),
        ("Lmod has detected the following error: Unable to load module because of error: cuda/12.4", None),
        ("FileNotFoundError: [Errno 2] No such file or directory: '/lustre/data/tokens.bin'", None),
        (" iteration     2010/  100000 | lm loss: 2.5 |", None),
    ],
)
def test_load_marks(line, mark):
    assert load_mark(line) is mark


def test_the_jsonl_load_events_are_not_progress_records():
    assert parse_ssv_object('{"ssv": 1, "event": "checkpoint_load_failed", "step": 2000, "error": "x"}') is not None
    assert parse_ssv_object('{"ssv": 1, "event": "checkpoint_load_start"}') is None


def test_segments_keep_the_lines_and_cut_before_each_mark():
    lines = ["a", " loading checkpoint from /c", "b", "Finished loading the checkpoint in 1 s", "c"]
    segments = load_segments(lines)
    assert [m for m, _ in segments] == [None, LoadMark.BEGAN, LoadMark.ENDED]
    assert [x for _, seg in segments for x in seg] == lines
    assert load_segments([]) == []


def _watch(*events: tuple[str, str]) -> LoadWatch:
    w = LoadWatch()
    for kind, line in events:
        if kind == "step":
            w.stepped()
        elif kind == "lines":
            w.lines([line])
        else:
            mark = load_mark(line)
            assert mark is not None
            w.mark(mark, line)
    return w


BEGIN = ("mark", " loading checkpoint from /ckpt at iteration 2000")


def test_an_error_line_is_evidence_at_once():
    w = _watch(BEGIN, ("mark", "RuntimeError: Error(s) in loading state_dict for GPTModel:"))
    assert "Error(s) in loading state_dict" in (w.failure(ended=False) or "")


def test_an_exception_while_loading_is_evidence_naming_the_load():
    w = _watch(BEGIN, ("lines", "Traceback (most recent call last):"), ("lines", "KeyError: 'model'"))
    why = w.failure(ended=False) or ""
    assert "KeyError: 'model'" in why and "loading checkpoint from /ckpt" in why


def test_a_load_that_began_and_was_never_followed_is_evidence_once_the_attempt_ended():
    w = _watch(BEGIN)
    assert w.failure(ended=False) is None
    assert "logged no step and no finished load" in (w.failure(ended=True) or "")


@pytest.mark.parametrize(
    "after",
    [("step", ""), ("mark", " successfully loaded checkpoint from /ckpt [ t 0, p 0 ] at iteration 2000")],
)
def test_a_step_or_a_finished_load_ends_the_load_and_later_exceptions_are_not_its(after):
    w = _watch(BEGIN, after, ("lines", "FileNotFoundError: [Errno 2] No such file or directory: '/data'"))
    assert w.failure(ended=True) is None


def test_no_load_no_evidence():
    w = _watch(("lines", "RuntimeError: CUDA error: an illegal memory access was encountered"))
    assert w.failure(ended=True) is None


def test_a_retried_load_clears_the_earlier_failure():
    w = _watch(BEGIN, ("mark", "Error loading checkpoint: timeout"), BEGIN, ("step", ""))
    assert w.failure(ended=True) is None


def test_an_exception_before_any_load_or_step_says_the_checkpoint_is_not_to_blame():
    w = _watch(
        ("lines", "Traceback (most recent call last):"), ("lines", "ModuleNotFoundError: No module named 'apex'")
    )
    assert w.failure(ended=True) is None
    assert "ModuleNotFoundError: No module named 'apex'" in (w.before_load() or "")


@pytest.mark.parametrize("then", [BEGIN, ("step", "")])
def test_a_load_or_a_step_after_the_exception_takes_that_back(then):
    w = _watch(("lines", "RuntimeError: a warning-like error printed at start"), then)
    assert w.before_load() is None
