"""Log lines that announce a pause in training steps: a checkpoint save or an evaluation.

A synchronous save of a large model can stall the log for minutes; without knowing why, a hang
detector patient enough for that would be slow to catch real hangs. Trainers announce these
pauses: Megatron ("saving checkpoint at iteration N to ...", "successfully saved checkpoint",
"validation loss at iteration" printed *after* evaluating), NeMo/Lightning ("Saving checkpoint"),
Hugging Face Trainer ("Saving model checkpoint to", "***** Running Evaluation *****"), torchtitan
("Saving the checkpoint", "Finished saving the checkpoint"), and our JSONL protocol
(``"event": "checkpoint_start"`` / ``"checkpoint_end"``). Pure.
"""

from __future__ import annotations

import re

_STARTS = re.compile(
    r"saving checkpoint at iteration|saving model checkpoint to|\bsaving checkpoint\b|saving the checkpoint"
    r"|running evaluation|\bevaluating\b|\"event\"\s*:\s*\"(?:checkpoint|eval)_start\"",
    re.IGNORECASE,
)
_ENDS = re.compile(
    r"successfully saved checkpoint|finished saving the checkpoint|\"event\"\s*:\s*\"(?:checkpoint|eval)_end\"",
    re.IGNORECASE,
)


def _may_announce(line: str) -> bool:
    """Every announcement above has a "v" ("saving", "saved", "evaluation", "event"; no other
    character matches one, whatever the case): a step line (most lines) is passed over without
    the patterns' search."""
    return "v" in line or "V" in line


def pause_of(line: str) -> str | None:
    """What the line says has begun ("a checkpoint save", "an evaluation"), else None."""
    if not _may_announce(line):
        return None
    m = _STARTS.search(line)
    if m is None:
        return None
    text = m.group(0).lower()
    return "an evaluation" if "eval" in text else "a checkpoint save"


def ends_pause(line: str) -> bool:
    return _may_announce(line) and _ENDS.search(line) is not None
