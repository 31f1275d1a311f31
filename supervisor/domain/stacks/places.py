"""Where a rank waits, from its main thread's stack: in a collective (all-reduce, barrier,
broadcast, send/recv of any backend), in data loading, in checkpoint I/O, or elsewhere.

The stack is read from the innermost frame out; the first frame that names a place decides (a
barrier inside a checkpoint save is a rank waiting in a collective). Names are matched, so a
trainer's own data loader is recognised by its name (``load_batch``, ``DataLoader.__next__``,
anything under ``torch/utils/data``) — the rules are the table below, kept small on purpose.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from enum import StrEnum

from supervisor.domain.stacks.dumps import Frame, RankDump


class Place(StrEnum):
    COLLECTIVE = "collective"
    DATA = "data loading"
    CHECKPOINT = "checkpoint I/O"
    ELSEWHERE = "elsewhere"
    UNKNOWN = "unknown"  # no stack (py-spy failed for it)


COLLECTIVES = frozenset(
    {
        "all_reduce", "all_reduce_coalesced", "all_gather", "all_gather_into_tensor", "all_gather_object",
        "reduce_scatter", "reduce_scatter_tensor", "broadcast", "broadcast_object_list", "barrier",
        "monitored_barrier", "send", "recv", "isend", "irecv", "batch_isend_irecv", "all_to_all",
        "all_to_all_single", "reduce", "gather", "gather_object", "scatter", "scatter_object_list",
        "send_object_list", "recv_object_list", "wait",
    }
)  # fmt: skip
# The libraries' communication layers: a frame in them waits on peers whatever its name.
_COMM_FILES = re.compile(r"(torch/distributed/distributed_c10d\.py|/mpi4py/|/horovod/|/deepspeed/comm/)")
_DATA_FILES = re.compile(r"(torch/utils/data/|/datasets/|/webdataset/|/streaming/|/dali/)")
_DATA_NAMES = re.compile(r"(?i)(data_?loader|dataset|(load|next|get|fetch|read)_?batch|collate|prefetch)")
_CKPT_FILES = re.compile(r"(torch/distributed/checkpoint/|torch/serialization\.py|/safetensors/)")
_CKPT_NAMES = re.compile(r"(?i)((save|load|write|read)_?(checkpoint|state_dict|ckpt)|checkpoint)")


@dataclass(frozen=True)
class Placement:
    """Where one rank waits: the place, what names it (the collective's name, else the function),
    and the frame that decided (None: elsewhere, or no stack)."""

    place: Place
    what: str
    frame: Frame | None


def frame_place(frame: Frame) -> Place | None:
    """The place one frame names, None: it names none."""
    file, name = frame.file, frame.function
    if _COMM_FILES.search(file) or (name in COLLECTIVES and "torch/distributed" in file):
        return Place.COLLECTIVE
    if _CKPT_FILES.search(file) or _CKPT_NAMES.search(name):
        return Place.CHECKPOINT
    if _DATA_FILES.search(file) or _DATA_NAMES.search(name):
        return Place.DATA
    return None


def placement(dump: RankDump) -> Placement:
    frames = dump.main_frames
    if dump.error is not None or not frames:
        return Placement(Place.UNKNOWN, dump.error or "no stack", None)
    for frame in frames:
        place = frame_place(frame)
        if place is not None:
            return Placement(place, frame.function, frame)
    return Placement(Place.ELSEWHERE, frames[0].function, frames[0])
