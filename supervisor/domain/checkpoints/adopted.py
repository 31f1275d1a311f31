"""Presence checks for an adopted checkpoint (DCP, Megatron, NeMo): what a listing alone can say.

Adopted layouts are weak (see ``Guarantee.weak``): each check says in its docstring what it does
not catch. Which layout a checkpoint is, and whether it is committed, is domain.checkpoints.layouts.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterable, Mapping

from supervisor.domain.checkpoints.layouts import (
    DCP_METADATA,
    DCP_SUFFIX,
    MEGATRON_TRACKER,
    MP_RANK,
    NEMO_UNFINISHED,
    key_parent,
    key_parts,
    nemo_base,
)
from supervisor.domain.checkpoints.manifest import MANIFEST_NAME, CheckpointRef, Guarantee, ObjectInfo, ShardProblem

_MEGATRON_MODEL_FILES = ("model_optim_rng.pt", "model_rng.pt")
_UNCOMMITTED = {
    Guarantee.MANIFEST: f"shards without {MANIFEST_NAME}: torn, or still being written",
    Guarantee.DCP: f"no {DCP_METADATA}: the DCP writer had not finished",
    Guarantee.MEGATRON: f"newer than the iteration {MEGATRON_TRACKER} names",
    Guarantee.NEMO: f"NeMo's {NEMO_UNFINISHED} marker is still there",
}


def check_adopted(
    ref: CheckpointRef, objects: Iterable[ObjectInfo], *, prefix: str | None = None
) -> tuple[ShardProblem, ...]:
    """Metadata-level presence checks for a checkpoint without our manifest (weak: see the docs
    of each ``_check_*`` for what they do not catch). ``objects`` is a listing with keys relative to
    the run's root (then the checkpoint's own ``prefix`` is given or found from its location) or
    relative to the checkpoint itself. NeMo's marker sits next to the checkpoint: list its parent.
    A committed manifest checkpoint has no adopted checks (use ``check_listing``): ``()``.
    """
    objects = list(objects)
    if prefix is None:
        prefix = _guess_prefix(ref, (o.key for o in objects))
    inside, siblings = _inside("/".join(key_parts(prefix)), objects)
    problems: list[ShardProblem] = []
    if not ref.committed:
        problems.append(ShardProblem(ref.name, "uncommitted", _UNCOMMITTED[ref.guarantee]))
    if ref.guarantee is Guarantee.MANIFEST:
        return tuple(problems)
    if not inside:
        return (*problems, ShardProblem(ref.name, "missing", "no objects under the checkpoint"))
    return (*problems, *_layout_problems(ref, inside, siblings))


def _layout_problems(
    ref: CheckpointRef, inside: Mapping[str, ObjectInfo], siblings: Mapping[str, ObjectInfo]
) -> list[ShardProblem]:
    if ref.guarantee is Guarantee.DCP:
        return _check_dcp("", inside)
    if ref.guarantee is Guarantee.MEGATRON:
        return _check_megatron(inside)
    return _check_nemo(ref, inside, siblings)


def _inside(prefix: str, objects: Iterable[ObjectInfo]) -> tuple[dict[str, ObjectInfo], dict[str, ObjectInfo]]:
    """Objects inside ``prefix`` (keys made relative to it) and the siblings of ``prefix``."""
    inside: dict[str, ObjectInfo] = {}
    siblings: dict[str, ObjectInfo] = {}
    parent = key_parent(prefix)
    for obj in objects:
        key = "/".join(key_parts(obj.key))
        if not prefix:
            inside[key] = obj
        elif key == prefix or key.startswith(prefix + "/"):
            inside[key[len(prefix) + 1 :] if key != prefix else ""] = obj
        elif key_parent(key) == parent:
            siblings[key.rsplit("/", 1)[-1]] = obj
    return inside, siblings


def _guess_prefix(ref: CheckpointRef, keys: Iterable[str]) -> str:
    """The ref's prefix among ``keys`` (root-relative) by the longest match with its location's end;
    "" (the objects are already relative to the checkpoint) when nothing matches."""
    location = ref.location.rstrip("/")
    best = ""
    for key in keys:
        parts = key_parts(key)
        for i in range(len(parts), 0, -1):
            candidate = "/".join(parts[:i])
            if len(candidate) > len(best) and (location == candidate or location.endswith("/" + candidate)):
                best = candidate
                break
    return best


# --------------------------------------------------------------------------- DCP


def _check_dcp(where: str, files: Mapping[str, ObjectInfo]) -> list[ShardProblem]:
    """DCP: ``.metadata`` present and non-empty, at least one non-empty ``.distcp``, no empty
    ``.distcp`` and no leftover ``.metadata.tmp`` (a newer save overwriting this one).
    Does NOT catch: a shard named in ``.metadata`` but missing (that needs unpickling it), a
    truncated or bit-flipped shard, shards from two different saves mixed in one directory."""
    here = {k[len(where) :]: v for k, v in files.items() if k.startswith(where) and "/" not in k[len(where) :]}
    problems = _dcp_metadata_problems(where, here)
    shards = {k: v for k, v in here.items() if k.endswith(DCP_SUFFIX)}
    if not any(v.size > 0 for v in shards.values()):
        problems.append(ShardProblem(where or ".", "missing", f"no non-empty {DCP_SUFFIX} shard"))
    problems += [ShardProblem(where + k, "size", "empty shard") for k, v in sorted(shards.items()) if v.size == 0]
    return problems


def _dcp_metadata_problems(where: str, here: Mapping[str, ObjectInfo]) -> list[ShardProblem]:
    problems = []
    meta = here.get(DCP_METADATA)
    if meta is None:
        problems.append(
            ShardProblem(where + DCP_METADATA, "missing", "DCP writes it last; without it the save did not finish")
        )
    elif meta.size == 0:
        problems.append(ShardProblem(where + DCP_METADATA, "size", "empty"))
    if DCP_METADATA + ".tmp" in here:
        problems.append(
            ShardProblem(
                where + DCP_METADATA + ".tmp", "uncommitted", "a newer DCP save into this directory had not finished"
            )
        )
    return problems


# --------------------------------------------------------------------------- Megatron


def _check_megatron(files: Mapping[str, ObjectInfo]) -> list[ShardProblem]:
    """Megatron: legacy layout — every ``mp_rank_*`` directory holds a non-empty model file and the
    rank numbers form a full grid from 0 (no hole in TP x PP x EP); torch_dist layout — the DCP
    checks. Does NOT catch: the highest ranks missing altogether (the grid looks complete), a
    truncated or bit-flipped ``.pt``, a missing ``distrib_optim.pt``."""
    ranks = _mp_ranks(files)
    if not ranks:
        if any(k.endswith(DCP_SUFFIX) or k == DCP_METADATA for k in files):
            return _check_dcp("", files)
        return [ShardProblem(".", "missing", "neither mp_rank_* directories nor a torch_dist checkpoint")]
    problems = [p for rank in sorted(ranks) if (p := _model_problem(rank, files)) is not None]
    return problems + _grid_holes(ranks)


def _mp_ranks(files: Mapping[str, ObjectInfo]) -> dict[str, tuple[int, ...]]:
    """The ``mp_rank_*`` directories that hold something, with their rank numbers."""
    ranks: dict[str, tuple[int, ...]] = {}
    for key in files:
        top = key.split("/", 1)[0]
        m = MP_RANK.match(top)
        if m and "/" in key:
            ranks[top] = tuple(int(g) for g in m.groups() if g is not None)
    return ranks


def _model_problem(rank: str, files: Mapping[str, ObjectInfo]) -> ShardProblem | None:
    models = [files.get(f"{rank}/{n}") for n in _MEGATRON_MODEL_FILES]
    present = [m for m in models if m is not None]
    if not present:
        return ShardProblem(f"{rank}/{_MEGATRON_MODEL_FILES[0]}", "missing", "no model file for this rank")
    if all(m.size == 0 for m in present):
        return ShardProblem(f"{rank}/{_MEGATRON_MODEL_FILES[0]}", "size", "empty model file")
    return None


def _grid_holes(ranks: Mapping[str, tuple[int, ...]]) -> list[ShardProblem]:
    dims = {len(r) for r in ranks.values()}
    if len(dims) != 1:
        return [ShardProblem("mp_rank_*", "missing", "rank directories of different parallel layouts mixed")]
    (n,) = dims
    extent = [max(r[i] for r in ranks.values()) + 1 for i in range(n)]
    have = set(ranks.values())
    if len(have) == math.prod(extent):
        return []
    return [
        ShardProblem(_rank_dir(g), "missing", "rank directory absent from an otherwise complete grid")
        for g in itertools.product(*(range(e) for e in extent))
        if g not in have
    ]


def _rank_dir(rank: tuple[int, ...]) -> str:
    return "mp_rank_" + "_".join(f"{v:02d}" if j == 0 else f"{v:03d}" for j, v in enumerate(rank))


# --------------------------------------------------------------------------- NeMo


def _check_nemo(
    ref: CheckpointRef, inside: Mapping[str, ObjectInfo], siblings: Mapping[str, ObjectInfo]
) -> list[ShardProblem]:
    """NeMo: no ``-unfinished`` marker next to it (when its parent was listed), nothing empty, and
    the DCP checks on every directory inside holding DCP files. Does NOT catch: truncation or bit
    flips, a marker removed by hand, a save that died before creating its marker."""
    problems = []
    marker = nemo_base(ref.name) + NEMO_UNFINISHED
    if marker in siblings and ref.committed:
        problems.append(ShardProblem(marker, "uncommitted", "NeMo's unfinished marker is present"))
    if "" in inside:  # a single-file checkpoint
        return problems + ([ShardProblem(ref.name, "size", "empty checkpoint file")] if inside[""].size == 0 else [])
    for where in _dcp_dirs(inside):
        problems += _check_dcp(where, inside)
    return problems


def _dcp_dirs(inside: Mapping[str, ObjectInfo]) -> list[str]:
    """The directories (``"a/b/"``, ``""`` for the top) holding DCP files, in name order."""
    return sorted(
        {
            k.rsplit("/", 1)[0] + "/" if "/" in k else ""
            for k in inside
            if k.endswith(DCP_SUFFIX) or k.rsplit("/", 1)[-1] == DCP_METADATA
        }
    )
