"""Recognise checkpoints in a listing: our manifest layout and the common layouts we adopt.

Input is what a listing says (keys relative to a run's checkpoint root, sizes, times); no object
is read here, so the step comes from names and "committed" from each layout's own commit signal:

- ours: ``ssv-manifest.json`` in the checkpoint's prefix, written last. A step-named prefix
  (``step_000100/``, ``global_step100/``, ``checkpoint-100/``...) with shards but no manifest is
  ours, uncommitted: torn, or still being written.
- PyTorch DCP: ``__R_N.distcp`` shard files and ``.metadata``, which the filesystem writer writes
  after every rank's shards, to ``.metadata.tmp`` first and then renames. ``.metadata`` present
  means committed.
- Megatron: ``iter_NNNNNNN/`` (or ``release/``) next to ``latest_checkpointed_iteration.txt``,
  which rank 0 rewrites after a barrier (or in the async finaliser) once every rank has saved.
  An iteration newer than the tracker is not committed.
- NeMo: a checkpoint (directory or ``.ckpt`` file, names carrying ``step=N``) is unfinished while
  a sibling marker ``<name without .nemo/.ckpt/-EMA>-unfinished`` exists; the callback creates the
  marker before saving and removes it when everything is written.

Adopted layouts are weak (see ``Guarantee.weak``): ``check_adopted`` checks presence only.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from functools import cached_property

from supervisor.domain.checkpoints import (
    MANIFEST_NAME,
    CheckpointRef,
    Guarantee,
    ObjectInfo,
    ShardProblem,
    step_from_name,
)

MEGATRON_TRACKER = "latest_checkpointed_iteration.txt"
DCP_METADATA = ".metadata"
DCP_SUFFIX = ".distcp"
NEMO_UNFINISHED = "-unfinished"

_MEGATRON_ITER = re.compile(r"^iter_(\d+)$")
_MP_RANK = re.compile(r"^mp_rank_(\d+)(?:_(\d+))?(?:_(\d+))?$")
_MEGATRON_MODEL_FILES = ("model_optim_rng.pt", "model_rng.pt")
_MEGATRON_DIST_FILES = frozenset({"common.pt", "metadata.json"})  # megatron.core dist_checkpointing's own
_NEMO_STEP = re.compile(r"(?:^|[^a-z])step=(\d+)", re.IGNORECASE)
_STEP_NAMED = re.compile(
    r"^(?:.*[_\-.=])?(?:global_step|step|checkpoint|ckpt|iter|iteration)[_\-=]?\d+$|^\d+$", re.IGNORECASE
)

Locate = Callable[[str], str]


# --------------------------------------------------------------------------- the listing as a tree


@dataclass
class _Dir:
    prefix: str  # "" for the root, else "a/b" (no trailing slash)
    files: dict[str, ObjectInfo] = field(default_factory=dict)
    dirs: set[str] = field(default_factory=set)
    newest: float = 0.0  # newest modified_at in the subtree
    all_timed: bool = True  # every object in the subtree has a modified_at
    count: int = 0  # objects in the subtree

    @property
    def name(self) -> str:
        return self.prefix.rsplit("/", 1)[-1]

    @cached_property
    def iterations(self) -> list[int]:
        """Megatron iteration numbers among the subdirectories (asked once the tree is built)."""
        return [int(m.group(1)) for n in self.dirs if (m := _MEGATRON_ITER.match(n))]

    @cached_property
    def unfinished(self) -> set[str]:
        """Stems named by NeMo ``-unfinished`` markers in this directory."""
        return {n[: -len(NEMO_UNFINISHED)] for n in self.files if n.endswith(NEMO_UNFINISHED) and n != NEMO_UNFINISHED}


def _parts(key: str) -> list[str]:
    return [p for p in key.split("/") if p]


def _join(prefix: str, name: str) -> str:
    return f"{prefix}/{name}" if prefix else name


def _parent(prefix: str) -> str:
    return prefix.rsplit("/", 1)[0] if "/" in prefix else ""


def _tree(objects: Iterable[ObjectInfo]) -> dict[str, _Dir]:
    tree: dict[str, _Dir] = {"": _Dir("")}
    for obj in objects:
        parts = _parts(obj.key)
        if not parts:
            continue
        prefix = ""
        chain = [tree[""]]
        for part in parts[:-1]:
            child = _join(prefix, part)
            tree[prefix].dirs.add(part)
            prefix = child
            chain.append(tree.setdefault(prefix, _Dir(prefix)))
        files = tree[prefix].files
        same = files.get(parts[-1])  # "a//b" and "a/b" are one name here: keep the newer, whatever the order
        if same is None or (same.modified_at or -1.0, same.size) < (obj.modified_at or -1.0, obj.size):
            files[parts[-1]] = obj
        for d in chain:
            d.count += 1
            if obj.modified_at is None:
                d.all_timed = False
            else:
                d.newest = max(d.newest, obj.modified_at)
    return tree


# --------------------------------------------------------------------------- discovery


@dataclass(frozen=True)
class _Found:
    prefix: str
    guarantee: Guarantee
    committed: bool
    step: int | None
    is_file: bool = False


def _nemo_base(name: str) -> str:
    """The marker stem NeMo derives from a checkpoint path: without .nemo, .ckpt and -EMA."""
    for suffix in (".nemo", ".ckpt", "-EMA"):
        name = name.removesuffix(suffix)
    return name


def _nemo_step(name: str) -> int | None:
    m = _NEMO_STEP.search(name)
    return int(m.group(1)) if m else step_from_name(_nemo_base(name))


def _is_dcp(d: _Dir) -> bool:
    return DCP_METADATA in d.files or any(n.endswith(DCP_SUFFIX) for n in d.files)


def _tracker_iteration(text: str | None) -> int | str | None:
    """The tracker's content: an iteration, "release", or None when unreadable (empty while being rewritten)."""
    if text is None:
        return None
    text = text.strip()
    if text == "release":
        return text
    return int(text) if text.isdigit() else None


def _megatron(d: _Dir, parent: _Dir, texts: Mapping[str, str], siblings: Iterable[int]) -> _Found | None:
    m = _MEGATRON_ITER.match(d.name)
    if not (m or d.name == "release"):
        return None
    tracker = parent.files.get(MEGATRON_TRACKER)
    if tracker is None:
        # iteration directories without a tracker: only Megatron's own shape counts as Megatron
        if m and (any(_MP_RANK.match(n) for n in d.dirs) or _is_dcp(d) and _MEGATRON_DIST_FILES & d.files.keys()):
            return _Found(d.prefix, Guarantee.MEGATRON, False, int(m.group(1)))
        return None
    step = int(m.group(1)) if m else None
    said = _tracker_iteration(texts.get(_join(parent.prefix, MEGATRON_TRACKER)))
    if said == "release":
        committed = d.name == "release" or _older_than(d, tracker)
    elif isinstance(said, int):
        committed = step is not None and step <= said
    elif d.all_timed and tracker.modified_at is not None:
        committed = _older_than(d, tracker)
    else:
        # no times and no tracker text: the newest iteration may be the one being written
        committed = step is not None and step < max(siblings, default=step)
    return _Found(d.prefix, Guarantee.MEGATRON, committed, step)


def _older_than(d: _Dir, tracker: ObjectInfo) -> bool:
    """Every object of ``d`` was written no later than the tracker was (the tracker follows a save)."""
    return d.all_timed and tracker.modified_at is not None and d.newest <= tracker.modified_at


def _strong(d: _Dir, tree: Mapping[str, _Dir], texts: Mapping[str, str]) -> _Found | None:
    """The layout ``d`` itself is a checkpoint of, by content (not by name alone)."""
    if MANIFEST_NAME in d.files:
        return _Found(d.prefix, Guarantee.MANIFEST, True, None)
    if d.prefix:
        parent = tree[_parent(d.prefix)]
        found = _megatron(d, parent, texts, parent.iterations)
        if found is not None:
            return found
        base = _nemo_base(d.name)
        if _NEMO_STEP.search(d.name) or base in parent.unfinished:
            return _Found(d.prefix, Guarantee.NEMO, base not in parent.unfinished, _nemo_step(d.name))
    if _is_dcp(d):
        return _Found(d.prefix, Guarantee.DCP, DCP_METADATA in d.files, None)
    return None


def _step_of(prefix: str) -> int | None:
    """The step a checkpoint's own name, or failing that its nearest ancestor's, carries."""
    parts = _parts(prefix)
    for name in reversed(parts):
        if _STEP_NAMED.match(name) or _NEMO_STEP.search(name):
            return _nemo_step(name) if _NEMO_STEP.search(name) else step_from_name(name)
    return step_from_name(parts[-1]) if parts else None


def _nemo_files(d: _Dir) -> list[_Found]:
    markers = d.unfinished
    return [
        _Found(_join(d.prefix, n), Guarantee.NEMO, _nemo_base(n) not in markers, _nemo_step(n), is_file=True)
        for n in sorted(d.files)
        if n.endswith(".ckpt") and not n.endswith("-EMA.ckpt")
    ]


def _find(tree: Mapping[str, _Dir], texts: Mapping[str, str]) -> list[_Found]:
    strong = {p: f for p, d in tree.items() if (f := _strong(d, tree, texts)) is not None}
    below: set[str] = set()  # dirs with a strong candidate strictly inside them
    for p in strong:
        while p:
            p = _parent(p)
            below.add(p)
    found: list[_Found] = []
    pending = [""]  # depth-first, in name order, without recursion (keys are arbitrary strings)
    while pending:
        prefix = pending.pop()
        d = tree[prefix]
        if prefix in strong:
            found.append(strong[prefix])
            continue
        if prefix and prefix not in below and _STEP_NAMED.match(d.name) and d.count:
            found.append(_Found(prefix, Guarantee.MANIFEST, False, None))
            continue
        found.extend(_nemo_files(d))
        pending.extend(_join(prefix, name) for name in sorted(d.dirs, reverse=True))
    return found


def discover(
    objects: Iterable[ObjectInfo], locate: Locate, texts: Mapping[str, str] | None = None
) -> list[CheckpointRef]:
    """Every checkpoint in ``objects`` (all objects under a run's checkpoint root, keys relative to
    it), committed or not, oldest step first. ``locate`` turns a relative prefix into a location:
    it is called with ``"dir/"`` for directories, ``"dir/file.ckpt"`` for single-file checkpoints
    and ``""`` for the root itself.

    ``texts`` optionally maps keys of small marker files (see ``wanted_texts``: Megatron's tracker)
    to their contents; without them Megatron commitment is judged by modification times.
    """
    tree = _tree(objects)
    refs = []
    for f in _find(tree, texts or {}):
        d = tree.get(f.prefix)
        if f.is_file:
            info = tree[_parent(f.prefix)].files[f.prefix.rsplit("/", 1)[-1]]
            seen = info.modified_at or 0.0
            location = locate(f.prefix)
        else:
            seen = d.newest if d is not None else 0.0
            location = locate(f"{f.prefix}/" if f.prefix else "")
        name = f.prefix.rsplit("/", 1)[-1] if f.prefix else location.rstrip("/").rsplit("/", 1)[-1]
        step = f.step if f.step is not None else _step_of(f.prefix) if f.prefix else step_from_name(name)
        refs.append(CheckpointRef(location, name, step, f.guarantee, f.committed, seen))
    refs.sort(key=lambda r: (r.step is None, r.step or 0, r.location))
    return refs


def wanted_texts(objects: Iterable[ObjectInfo]) -> tuple[str, ...]:
    """Keys whose small contents make ``discover`` exact: Megatron tracker files."""
    return tuple(sorted(o.key for o in objects if _parts(o.key)[-1:] == [MEGATRON_TRACKER]))


# --------------------------------------------------------------------------- adopted presence checks


def _inside(prefix: str, objects: Iterable[ObjectInfo]) -> tuple[dict[str, ObjectInfo], dict[str, ObjectInfo]]:
    """Objects inside ``prefix`` (keys made relative to it) and the siblings of ``prefix``."""
    inside: dict[str, ObjectInfo] = {}
    siblings: dict[str, ObjectInfo] = {}
    parent = _parent(prefix)
    for obj in objects:
        key = "/".join(_parts(obj.key))
        if not prefix:
            inside[key] = obj
        elif key == prefix or key.startswith(prefix + "/"):
            inside[key[len(prefix) + 1 :] if key != prefix else ""] = obj
        elif _parent(key) == parent:
            siblings[key.rsplit("/", 1)[-1]] = obj
    return inside, siblings


def _guess_prefix(ref: CheckpointRef, keys: Iterable[str]) -> str:
    """The ref's prefix among ``keys`` (root-relative) by the longest match with its location's end;
    "" (the objects are already relative to the checkpoint) when nothing matches."""
    location = ref.location.rstrip("/")
    best = ""
    for key in keys:
        parts = _parts(key)
        for i in range(len(parts), 0, -1):
            candidate = "/".join(parts[:i])
            if len(candidate) > len(best) and (location == candidate or location.endswith("/" + candidate)):
                best = candidate
                break
    return best


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
    prefix = "/".join(_parts(prefix))
    inside, siblings = _inside(prefix, objects)
    problems: list[ShardProblem] = []
    if not ref.committed:
        problems.append(ShardProblem(ref.name, "uncommitted", _UNCOMMITTED[ref.guarantee]))
    if ref.guarantee is Guarantee.MANIFEST:
        return tuple(problems)
    if not inside:
        return (*problems, ShardProblem(ref.name, "missing", "no objects under the checkpoint"))
    if ref.guarantee is Guarantee.DCP:
        problems += _check_dcp("", inside)
    elif ref.guarantee is Guarantee.MEGATRON:
        problems += _check_megatron(inside)
    else:
        problems += _check_nemo(ref, inside, siblings)
    return tuple(problems)


_UNCOMMITTED = {
    Guarantee.MANIFEST: f"shards without {MANIFEST_NAME}: torn, or still being written",
    Guarantee.DCP: f"no {DCP_METADATA}: the DCP writer had not finished",
    Guarantee.MEGATRON: f"newer than the iteration {MEGATRON_TRACKER} names",
    Guarantee.NEMO: f"NeMo's {NEMO_UNFINISHED} marker is still there",
}


def _check_dcp(where: str, files: Mapping[str, ObjectInfo]) -> list[ShardProblem]:
    """DCP: ``.metadata`` present and non-empty, at least one non-empty ``.distcp``, no empty
    ``.distcp`` and no leftover ``.metadata.tmp`` (a newer save overwriting this one).
    Does NOT catch: a shard named in ``.metadata`` but missing (that needs unpickling it), a
    truncated or bit-flipped shard, shards from two different saves mixed in one directory."""
    here = {k[len(where) :]: v for k, v in files.items() if k.startswith(where) and "/" not in k[len(where) :]}
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
    shards = {k: v for k, v in here.items() if k.endswith(DCP_SUFFIX)}
    if not any(v.size > 0 for v in shards.values()):
        problems.append(ShardProblem(where or ".", "missing", f"no non-empty {DCP_SUFFIX} shard"))
    problems += [ShardProblem(where + k, "size", "empty shard") for k, v in sorted(shards.items()) if v.size == 0]
    return problems


def _check_megatron(files: Mapping[str, ObjectInfo]) -> list[ShardProblem]:
    """Megatron: legacy layout — every ``mp_rank_*`` directory holds a non-empty model file and the
    rank numbers form a full grid from 0 (no hole in TP x PP x EP); torch_dist layout — the DCP
    checks. Does NOT catch: the highest ranks missing altogether (the grid looks complete), a
    truncated or bit-flipped ``.pt``, a missing ``distrib_optim.pt``."""
    ranks: dict[str, tuple[int, ...]] = {}
    for key in files:
        top = key.split("/", 1)[0]
        m = _MP_RANK.match(top)
        if m and "/" in key:
            ranks[top] = tuple(int(g) for g in m.groups() if g is not None)
    if not ranks:
        if any(k.endswith(DCP_SUFFIX) or k == DCP_METADATA for k in files):
            return _check_dcp("", files)
        return [ShardProblem(".", "missing", "neither mp_rank_* directories nor a torch_dist checkpoint")]
    problems = []
    for rank in sorted(ranks):
        models = [files.get(f"{rank}/{n}") for n in _MEGATRON_MODEL_FILES]
        present = [m for m in models if m is not None]
        if not present:
            problems.append(
                ShardProblem(f"{rank}/{_MEGATRON_MODEL_FILES[0]}", "missing", "no model file for this rank")
            )
        elif all(m.size == 0 for m in present):
            problems.append(ShardProblem(f"{rank}/{_MEGATRON_MODEL_FILES[0]}", "size", "empty model file"))
    problems += _grid_holes(ranks)
    return problems


def _grid_holes(ranks: Mapping[str, tuple[int, ...]]) -> list[ShardProblem]:
    dims = {len(r) for r in ranks.values()}
    if len(dims) != 1:
        return [ShardProblem("mp_rank_*", "missing", "rank directories of different parallel layouts mixed")]
    (n,) = dims
    extent = [max(r[i] for r in ranks.values()) + 1 for i in range(n)]
    have = set(ranks.values())
    holes = []
    expected = 1
    for e in extent:
        expected *= e
    if len(have) != expected:
        grid: list[tuple[int, ...]] = [()]
        for e in extent:
            grid = [g + (i,) for g in grid for i in range(e)]
        holes = [
            ShardProblem(
                "mp_rank_" + "_".join(f"{v:02d}" if j == 0 else f"{v:03d}" for j, v in enumerate(g)),
                "missing",
                "rank directory absent from an otherwise complete grid",
            )
            for g in grid
            if g not in have
        ]
    return holes


def _check_nemo(
    ref: CheckpointRef, inside: Mapping[str, ObjectInfo], siblings: Mapping[str, ObjectInfo]
) -> list[ShardProblem]:
    """NeMo: no ``-unfinished`` marker next to it (when its parent was listed), nothing empty, and
    the DCP checks on every directory inside holding DCP files. Does NOT catch: truncation or bit
    flips, a marker removed by hand, a save that died before creating its marker."""
    problems = []
    marker = _nemo_base(ref.name) + NEMO_UNFINISHED
    if marker in siblings and ref.committed:
        problems.append(ShardProblem(marker, "uncommitted", "NeMo's unfinished marker is present"))
    if "" in inside:  # a single-file checkpoint
        return problems + ([ShardProblem(ref.name, "size", "empty checkpoint file")] if inside[""].size == 0 else [])
    dcp_dirs = sorted(
        {
            k.rsplit("/", 1)[0] + "/" if "/" in k else ""
            for k in inside
            if k.endswith(DCP_SUFFIX) or k.rsplit("/", 1)[-1] == DCP_METADATA
        }
    )
    for where in dcp_dirs:
        problems += _check_dcp(where, inside)
    return problems
