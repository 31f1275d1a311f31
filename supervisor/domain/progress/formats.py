"""The formats understood, by name; choosing one from a sample of lines; building parsers.

Names (docs/progress-formats.md has an example line of each):

=================  ==========================================================================
``megatron``       Megatron-LM (old and 2024+ formats), Megatron-DeepSpeed, Megatron-Bridge
``nemo``           NeMo 1.x (Lightning progress bar) and NeMo 2 (plain-text progress logger)
``torchtitan``     torchtitan's metrics line
``hf-trainer``     Hugging Face Trainer console dicts (``trainer_state.json``: ``parse_trainer_state``)
``fairseq``        fairseq and metaseq: JSON, ``key=value`` and ``| key value |`` lines
``ssv-jsonl``      our JSONL protocol (docs/telemetry-jsonl.md)
=================  ==========================================================================

A run spec may also use the aliases in ``ALIASES`` (``megatron-lm``, ``metaseq``, ``jsonl``, ...).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping

from supervisor.domain.progress.base import LineFormat
from supervisor.domain.progress.frameworks.fairseq import FairseqFormat
from supervisor.domain.progress.frameworks.hf import HfTrainerFormat
from supervisor.domain.progress.frameworks.megatron import MegatronFormat
from supervisor.domain.progress.frameworks.nemo import NemoFormat
from supervisor.domain.progress.frameworks.ssv import SsvJsonlFormat
from supervisor.domain.progress.frameworks.torchtitan import TorchtitanFormat
from supervisor.domain.progress.record import ProgressRecord
from supervisor.domain.progress.stream import ProgressParser

# In the order auto mode tries them: the most specific first.
_FACTORIES: Mapping[str, Callable[[], LineFormat]] = {
    "ssv-jsonl": SsvJsonlFormat,
    "megatron": MegatronFormat,
    "torchtitan": TorchtitanFormat,
    "nemo": NemoFormat,
    "fairseq": FairseqFormat,
    "hf-trainer": HfTrainerFormat,
}
FORMATS: tuple[str, ...] = tuple(_FACTORIES)

ALIASES: Mapping[str, str] = {
    "megatron-lm": "megatron",
    "megatron-deepspeed": "megatron",
    "megatron-bridge": "megatron",
    "nemo1": "nemo",
    "nemo2": "nemo",
    "metaseq": "fairseq",
    "hf": "hf-trainer",
    "huggingface": "hf-trainer",
    "transformers": "hf-trainer",
    "jsonl": "ssv-jsonl",
    "ssv": "ssv-jsonl",
}

DETECT_SAMPLE_LINES = 5000


def canonical_name(name: str) -> str:
    """The format's name for ``name`` or an alias of it; ``ValueError`` naming the known ones."""
    key = name.strip().lower()
    key = ALIASES.get(key, key)
    if key not in _FACTORIES:
        known = ", ".join(sorted((*FORMATS, *ALIASES)))
        raise ValueError(f"unknown progress format {name!r}; known: {known}")
    return key


def parser_for(name: str | None) -> ProgressParser:
    """A fresh stateful parser for one stream: of format ``name`` (or an alias), or with ``None``
    one that tries every format and keeps the first that yields a record."""
    if name is None:
        return ProgressParser([factory() for factory in _FACTORIES.values()])
    return ProgressParser([_FACTORIES[canonical_name(name)]()])


def detect_format(lines: Iterable[str], *, max_lines: int = DETECT_SAMPLE_LINES) -> str | None:
    """The format that reads the most records from the first ``max_lines`` lines (the earlier in
    ``FORMATS`` on a tie); ``None`` when no format reads any."""
    sample = []
    for i, line in enumerate(lines):
        if i >= max_lines:
            break
        sample.append(line)
    best, best_count = None, 0
    for name in FORMATS:
        parser = parser_for(name)
        found = len(parser.feed_all(sample)) + len(parser.flush())
        if found > best_count:
            best, best_count = name, found
    return best


def parse_lines(lines: Iterable[str], format: str | None = None) -> list[ProgressRecord]:  # noqa: A002 - public keyword
    """Every record in ``lines`` (a whole text's lines, in order), the last partial one included."""
    parser = parser_for(format)
    records = parser.feed_all(lines)
    records.extend(parser.flush())
    return records


def parse_text(text: str, format: str | None = None) -> list[ProgressRecord]:  # noqa: A002 - public keyword
    """``parse_lines`` over ``text`` split at newlines (``\\r`` refreshes are split by the parser)."""
    return parse_lines(text.split("\n"), format)
