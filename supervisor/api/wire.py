"""The local API's messages: one JSON object per line each way, typed and bounded.

A request names its operation in ``op``; unknown operations, unknown fields and oversize values
are refused before anything runs. An answer is ``{"ok": true, "data": ...}`` or
``{"ok": false, "kind": ..., "error": ...}`` where ``kind`` is one of :class:`Failure`.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated, Any

import msgspec

MAX_REQUEST_BYTES = 64 * 1024  # one request line; a longer one is refused and the connection closed
MAX_EVENTS_PAGE = 2000  # logbook events per answer; the client asks page after page

Name = Annotated[str, msgspec.Meta(min_length=1, max_length=256)]
Text = Annotated[str, msgspec.Meta(max_length=8192)]
PathText = Annotated[str, msgspec.Meta(min_length=1, max_length=4096)]


class Failure(StrEnum):
    DENIED = "denied"  # the rules do not allow this caller
    UNKNOWN_RUN = "unknown_run"
    REFUSED = "refused"  # the request is understood and wrong (a bad spec, a run name in use)
    INVALID = "invalid"  # not a request this API knows
    BUSY = "busy"  # too many connections at once
    INTERNAL = "internal"  # the daemon failed; its log says why


class _Request(msgspec.Struct, tag_field="op", forbid_unknown_fields=True, frozen=True):
    pass


class Whoami(_Request, tag="whoami", frozen=True):
    pass


class Runs(_Request, tag="runs", frozen=True):
    pass


class Leader(_Request, tag="leader", frozen=True):
    """Who leads the instance (the lease of a shared store; none with SQLite)."""


class GetRun(_Request, tag="run", frozen=True):
    run: Name


class Attempts(_Request, tag="attempts", frozen=True):
    run: Name


class Progress(_Request, tag="progress", frozen=True):
    run: Name


class Events(_Request, tag="events", frozen=True):
    run: Name | None = None
    offset: Annotated[int, msgspec.Meta(ge=0)] = 0
    limit: Annotated[int, msgspec.Meta(ge=1, le=MAX_EVENTS_PAGE)] = MAX_EVENTS_PAGE


class Nodes(_Request, tag="nodes", frozen=True):
    pass


class Faults(_Request, tag="faults", frozen=True):
    since: float


class Clears(_Request, tag="clears", frozen=True):
    pass


class Submit(_Request, tag="submit", frozen=True):
    spec: PathText
    slurm_check: bool = True


class Cancel(_Request, tag="cancel", frozen=True):
    run: Name


class Note(_Request, tag="note", frozen=True):
    run: Name
    text: Text


class ClearQuarantine(_Request, tag="clear", frozen=True):
    node: Name
    note: Text


Request = (
    Whoami
    | Runs
    | Leader
    | GetRun
    | Attempts
    | Progress
    | Events
    | Nodes
    | Faults
    | Clears
    | Submit
    | Cancel
    | Note
    | ClearQuarantine
)

_decoder = msgspec.json.Decoder(Request)
_encoder = msgspec.json.Encoder()


def decode_request(line: bytes) -> Request:
    """The request on one line; msgspec.ValidationError / DecodeError when it is not one."""
    return _decoder.decode(line)


def encode_request(op: str, args: dict[str, Any]) -> bytes:
    return _encoder.encode({"op": op, **args}) + b"\n"


def answer(data: Any) -> bytes:
    return _encoder.encode({"ok": True, "data": data}) + b"\n"


def failure(kind: Failure, message: str) -> bytes:
    return _encoder.encode({"ok": False, "kind": kind.value, "error": message}) + b"\n"
