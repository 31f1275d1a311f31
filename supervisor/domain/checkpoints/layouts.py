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

Adopted layouts are weak (see ``Guarantee.weak``): ``check_adopted`` (domain.checkpoints.adopted) checks presence only.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from functools import cached_property

from supervisor.domain.checkpoints.checks import step_from_name
from supervisor.domain.checkpoints.manifest import (
    MANIFEST_NAME,
    CheckpointRef,
    Guarantee,
    ObjectInfo,
)

MEGATRON_TRACKER = "latest_checkpointed_iteration.txt"
DCP_METADATA = ".metadata"
DCP_SUFFIX = ".distcp"
NEMO_UNFINISHED = "-unfinished"

_MEGATRON_ITER = re.compile(r"^iter_(\d+)$")
MP_RANK = re.compile(r"^mp_rank_(\d+)(?:_(\d+))?(?:_(\d+))?$")
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

    def count_in(self, obj: ObjectInfo) -> None:
        """Account for ``obj``, somewhere in this subtree."""
        self.count += 1
        if obj.modified_at is None:
            self.all_timed = False
        else:
            self.newest = max(self.newest, obj.modified_at)

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


def key_parts(key: str) -> list[str]:
    """A key's non-empty path segments ("a//b/" and "a/b" are the same name)."""
    return [p for p in key.split("/") if p]


def _join(prefix: str, name: str) -> str:
    return f"{prefix}/{name}" if prefix else name


def key_parent(prefix: str) -> str:
    """The prefix one level up ("" above a top-level name)."""
    return prefix.rsplit("/", 1)[0] if "/" in prefix else ""


def _tree(objects: Iterable[ObjectInfo]) -> dict[str, _Dir]:
    tree: dict[str, _Dir] = {"": _Dir("")}
    for obj in objects:
        parts = key_parts(obj.key)
        if parts:
            _add(tree, parts, obj)
    return tree


def _add(tree: dict[str, _Dir], parts: list[str], obj: ObjectInfo) -> None:
    """File ``obj`` (its key split into ``parts``) under its directory, creating the directories above it."""
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
        d.count_in(obj)


# --------------------------------------------------------------------------- discovery


@dataclass(frozen=True)
class _Found:
    prefix: str
    guarantee: Guarantee
    committed: bool
    step: int | None
    is_file: bool = False


def nemo_base(name: str) -> str:
    """The marker stem NeMo derives from a checkpoint path: without .nemo, .ckpt and -EMA."""
    for suffix in (".nemo", ".ckpt", "-EMA"):
        name = name.removesuffix(suffix)
    return name


def _nemo_step(name: str) -> int | None:
    m = _NEMO_STEP.search(name)
    return int(m.group(1)) if m else step_from_name(nemo_base(name))


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
        if m and _megatron_shaped(d):
            return _Found(d.prefix, Guarantee.MEGATRON, False, int(m.group(1)))
        return None
    step = int(m.group(1)) if m else None
    said = _tracker_iteration(texts.get(_join(parent.prefix, MEGATRON_TRACKER)))
    return _Found(d.prefix, Guarantee.MEGATRON, _megatron_committed(d, step, tracker, said, siblings), step)


def _megatron_shaped(d: _Dir) -> bool:
    """Legacy ``mp_rank_*`` directories, or a torch_dist checkpoint with Megatron's own files."""
    return any(MP_RANK.match(n) for n in d.dirs) or bool(_is_dcp(d) and _MEGATRON_DIST_FILES & d.files.keys())


def _megatron_committed(
    d: _Dir, step: int | None, tracker: ObjectInfo, said: int | str | None, siblings: Iterable[int]
) -> bool:
    """Whether the tracker (its text ``said``, else its time) shows iteration ``d`` saved by every rank."""
    if said == "release":
        return d.name == "release" or _older_than(d, tracker)
    if isinstance(said, int):
        return step is not None and step <= said
    if d.all_timed and tracker.modified_at is not None:
        return _older_than(d, tracker)
    # no times and no tracker text: the newest iteration may be the one being written
    return step is not None and step < max(siblings, default=step)


def _older_than(d: _Dir, tracker: ObjectInfo) -> bool:
    """Every object of ``d`` was written no later than the tracker was (the tracker follows a save)."""
    return d.all_timed and tracker.modified_at is not None and d.newest <= tracker.modified_at


def _strong(d: _Dir, tree: Mapping[str, _Dir], texts: Mapping[str, str]) -> _Found | None:
    """The layout ``d`` itself is a checkpoint of, by content (not by name alone)."""
    if MANIFEST_NAME in d.files:
        return _Found(d.prefix, Guarantee.MANIFEST, True, None)
    if d.prefix:
        parent = tree[key_parent(d.prefix)]
        found = _megatron(d, parent, texts, parent.iterations)
        if found is not None:
            return found
        base = nemo_base(d.name)
        if _NEMO_STEP.search(d.name) or base in parent.unfinished:
            return _Found(d.prefix, Guarantee.NEMO, base not in parent.unfinished, _nemo_step(d.name))
    if _is_dcp(d):
        return _Found(d.prefix, Guarantee.DCP, DCP_METADATA in d.files, None)
    return None


def _step_of(prefix: str) -> int | None:
    """The step a checkpoint's own name, or failing that its nearest ancestor's, carries."""
    parts = key_parts(prefix)
    for name in reversed(parts):
        if _STEP_NAMED.match(name) or _NEMO_STEP.search(name):
            return _nemo_step(name) if _NEMO_STEP.search(name) else step_from_name(name)
    return step_from_name(parts[-1]) if parts else None


def _nemo_files(d: _Dir) -> list[_Found]:
    markers = d.unfinished
    return [
        _Found(_join(d.prefix, n), Guarantee.NEMO, nemo_base(n) not in markers, _nemo_step(n), is_file=True)
        for n in sorted(d.files)
        if n.endswith(".ckpt") and not n.endswith("-EMA.ckpt")
    ]


def _find(tree: Mapping[str, _Dir], texts: Mapping[str, str]) -> list[_Found]:
    strong = {p: f for p, d in tree.items() if (f := _strong(d, tree, texts)) is not None}
    below = _ancestors(strong)
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


def _ancestors(prefixes: Iterable[str]) -> set[str]:
    """Every directory with one of ``prefixes`` strictly inside it."""
    above: set[str] = set()
    for p in prefixes:
        while p:
            p = key_parent(p)
            above.add(p)
    return above


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
    refs = [_ref(tree, f, locate) for f in _find(tree, texts or {})]
    refs.sort(key=lambda r: (r.step is None, r.step or 0, r.location))
    return refs


def _ref(tree: Mapping[str, _Dir], f: _Found, locate: Locate) -> CheckpointRef:
    if f.is_file:
        info = tree[key_parent(f.prefix)].files[f.prefix.rsplit("/", 1)[-1]]
        seen = info.modified_at or 0.0
        location = locate(f.prefix)
    else:
        d = tree.get(f.prefix)
        seen = d.newest if d is not None else 0.0
        location = locate(f"{f.prefix}/" if f.prefix else "")
    name = f.prefix.rsplit("/", 1)[-1] if f.prefix else location.rstrip("/").rsplit("/", 1)[-1]
    step = f.step if f.step is not None else _step_of(f.prefix) if f.prefix else step_from_name(name)
    return CheckpointRef(location, name, step, f.guarantee, f.committed, seen)


def wanted_texts(objects: Iterable[ObjectInfo]) -> tuple[str, ...]:
    """Keys whose small contents make ``discover`` exact: Megatron tracker files."""
    return tuple(sorted(o.key for o in objects if key_parts(o.key)[-1:] == [MEGATRON_TRACKER]))
