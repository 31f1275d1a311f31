"""Progress telemetry from training logs: records, the formats understood, and the stateful
parser that turns a job's raw output lines into records. Pure: no I/O, no clock."""

from supervisor.domain.progress.formats import (
    ALIASES,
    FORMATS,
    canonical_name,
    detect_format,
    parse_lines,
    parse_text,
    parser_for,
)
from supervisor.domain.progress.frameworks.hf import parse_trainer_state
from supervisor.domain.progress.frameworks.ssv import parse_object as parse_ssv_object
from supervisor.domain.progress.prefixes import split_prefix, strip_ansi
from supervisor.domain.progress.record import FIELD_NAMES, ProgressRecord
from supervisor.domain.progress.stream import ProgressParser

__all__ = [
    "ALIASES",
    "FIELD_NAMES",
    "FORMATS",
    "ProgressParser",
    "ProgressRecord",
    "canonical_name",
    "detect_format",
    "parse_lines",
    "parse_ssv_object",
    "parse_text",
    "parse_trainer_state",
    "parser_for",
    "split_prefix",
    "strip_ansi",
]
