"""Save on failure for replicated shards (HSDP: FSDP2 ``fully_shard`` over a 2-D device mesh
``("replicate", "shard")``): when a node of one replica group dies, another replica group still
holds every shard; ONE surviving rank per shard writes it, without any collective, and the last
writer merges the parts into one ``torch.distributed.checkpoint`` checkpoint and commits it with
the supervisor's manifest — the daemon verifies it like any checkpoint, and a fresh world of the
same layout resumes from it with ``Supervision.resume`` (docs/trainer-integration.md).

    mesh = init_device_mesh("cpu", (nodes, ranks_per_node), mesh_dim_names=("replicate", "shard"))
    ...fully_shard(model, mesh=mesh)...
    with ShardedSaveOnFailure(ssv, state, shard=mesh.get_local_rank("shard"),
                              shards=mesh.size(mesh.mesh_dim_names.index("shard"))) as guard:
        ...the loop of torch_survivors' docstring: guard.completed(step) after optimizer.step()...

What is written, in ``ROOT/step_NNNNNN/`` (the name the first writer picked, written in the world's
name claim so that every writer uses it):

* ``shard-K/`` — shard K's part: ``dcp.save(state, no_dist=True)`` of the writer's own state (its
  DTensors' local shards, and the replicated values every rank holds);
* ``.metadata`` — DCP's metadata of the whole, merged from the parts' (each chunk once, its storage
  entry pointing into its part), written by the writer that finds every part complete and wins the
  commit claim, which then commits the manifest (every file, the parts included).

**One step.** Every writer writes the step it completed last (``torch_survivors``: the state is that
of the last ``completed(step)``). In HSDP the survivors of one replica group fail at the same
collective (the replicas' all-reduce of a step's gradients, or the telemetry after it), so they hold
the same step; a writer whose step differs from the one in the name claim writes nothing, and the
checkpoint, lacking its shard, is never committed: the run resumes from the periodic save before.

**Which ranks hold which shard.** ``shard``: this rank's index along the mesh's shard dimension;
``shards``: that dimension's size. Ranks with the same index hold the same shard (replicas of it).
A shard none of whose holders survived (a run without replicas: FSDP alone, tensor or pipeline
parallel) leaves the checkpoint uncommitted: for that state, peer copies (``torch_peers``).

Directory roots (a parallel filesystem) only, for now: the claims and the merge read and create
files there. Claims are create-if-absent files at the root, named for this world (``claim_name``).
"""

from __future__ import annotations

import json
import os
import pickle
import time
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.filesystem import FileSystemReader
from torch.distributed.checkpoint.metadata import Metadata, MetadataIndex, TensorStorageMetadata

from supervisor.telemetry.torch import Supervision
from supervisor.telemetry.torch_survivors import CLAIM_KEY, FailureSave, SaveOnFailure, _names, claim_name

PART = "shard-{}"
DCP_METADATA = ".metadata"


@dataclass(frozen=True)
class NameClaim:
    """What the first writer of this world decided: the checkpoint's name and the step it holds."""

    name: str
    step: int


class ShardedSaveOnFailure(SaveOnFailure):
    """``SaveOnFailure`` for a state sharded over ``shards`` ranks and replicated over the others
    (module docstring). Everything else — the SIGTERM hold, the watchdog, the deadline — is the
    base class's."""

    def __init__(self, ssv: Supervision, state: dict[str, Any], *, shard: int, shards: int, **kwargs: Any) -> None:
        if ssv.root.startswith("s3://"):
            raise ValueError("sharded save on failure writes to a directory root only (not s3:// yet)")
        if not 0 <= shard < shards:
            raise ValueError(f"shard {shard} is not one of 0..{shards - 1}")
        super().__init__(ssv, state, **kwargs)
        self.shard, self.shards = shard, shards

    def save_now(self, reason: str) -> FailureSave:
        self._arm_watchdog()
        began = time.monotonic()
        step = self.step
        if step <= 0:
            return FailureSave(step, None, False, f"{reason}; no step completed, nothing to save", 0.0)
        saved = self.ssv.last_saved
        if saved is not None and saved[0] == step:
            return FailureSave(step, saved[1], False, f"{reason}; step {step} was saved already", 0.0)
        claimed, how = self._claim_shard(step)
        if not claimed:
            return FailureSave(step, None, False, f"{reason}; {how}", time.monotonic() - began)
        agreed = self._agree(step)
        if agreed.step != step:
            why = f"{reason}; shard {self.shard} is at step {step}, the others' writers at {agreed.step}: not written"
            return FailureSave(step, None, False, why, time.monotonic() - began)
        location, committed = self._write_part(agreed)
        did = "saved and committed" if committed else "saved"
        why = f"{reason}; {did} step {step}, shard {self.shard} of {self.shards} ({how})"
        return FailureSave(step, location, True, why, time.monotonic() - began)

    # ------------------------------------------------------------------ claims

    def _claim_shard(self, step: int) -> tuple[bool, str]:
        """Whether this rank writes its shard: the storage alone decides (a create-if-absent file
        at the root, one per shard); the c10d store's counter is evidence only (it has no
        authentication: a count bumped by a stranger must not silence the save)."""
        try:
            store = self.store if self.store is not None else _default_store()
            store.set_timeout(timedelta(seconds=self.claim_timeout_s))
            first = int(store.add(f"{CLAIM_KEY}/shard{self.shard}", 1)) == 1
            how = "first on the store" if first else "not first on the store"
        except (RuntimeError, ValueError) as exc:  # DistStoreError / DistNetworkError are RuntimeErrors
            how = f"store unreachable ({type(exc).__name__})"
        body = json.dumps({"rank": self.ssv.rank, "shard": self.shard, "step": step}).encode()
        if not create_once(self._root / f"{claim_name()}-shard{self.shard}", body):
            return False, f"{how}; another survivor claimed shard {self.shard} on the storage"
        return True, f"{how}; claimed on the storage"

    def _agree(self, step: int) -> NameClaim:
        """The checkpoint's name, the same for every writer: the first free one when this rank is
        the first to ask, else the one the first wrote (with its step)."""
        path = self._root / f"{claim_name()}-name"
        name = next((n for n in _names(self.ssv, step) if not self.ssv._taken(n)), None)
        if name is None:
            raise RuntimeError(f"{self.ssv.root}: every name for step {step} is taken")
        create_once(path, json.dumps({"name": name, "step": step}).encode())
        doc = json.loads(path.read_text())
        return NameClaim(str(doc["name"]), int(doc["step"]))

    # ------------------------------------------------------------------ the write

    def _write_part(self, agreed: NameClaim) -> tuple[str, bool]:
        """This shard's part, then, when every part is there and the commit claim is ours, the
        merged metadata and the manifest. (location, whether this rank committed)."""
        folder = self._root / agreed.name
        dcp.save(self.state, checkpoint_id=str(folder / PART.format(self.shard)), no_dist=True)
        location = str(folder)
        parts = [folder / PART.format(k) for k in range(self.shards)]
        if not all((p / DCP_METADATA).is_file() for p in parts):
            return location, False  # a slower writer finishes it
        if not create_once(self._root / f"{claim_name()}-commit", b"{}"):
            return location, False
        write_metadata(folder, merge_parts(parts))
        self.ssv.commit(self.ssv.root, agreed.name, agreed.step)
        self.ssv.last_saved = (agreed.step, location)
        return location, True

    @property
    def _root(self) -> Path:
        return Path(self.ssv.root)


def _default_store() -> Any:
    import torch.distributed as dist

    return dist.distributed_c10d._get_default_store()


def create_once(path: Path, body: bytes) -> bool:
    """Create ``path`` holding ``body`` unless it exists; whoever reads it sees the whole body (it
    is written aside, then linked: ``link`` fails when the name exists)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    aside = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    aside.write_bytes(body)
    try:
        os.link(aside, path)
    except FileExistsError:
        return False
    finally:
        aside.unlink(missing_ok=True)
    return True


def merge_parts(parts: list[Path]) -> Metadata:
    """One DCP metadata from the parts' (each a no-dist save in a subfolder): every tensor chunk
    once (the first part that has it), its storage entry's path made relative to the whole; the
    first part's entry for values every rank holds (bytes, unsharded tensors)."""
    merged = Metadata(state_dict_metadata={}, planner_data={}, storage_data={})
    stored: set[tuple[str, tuple[int, ...] | None]] = set()
    for part in parts:
        md = FileSystemReader(str(part)).read_metadata()
        merged.version = md.version
        merged.planner_data.update(md.planner_data or {})
        for fqn, meta in md.state_dict_metadata.items():
            have = merged.state_dict_metadata.setdefault(fqn, meta)
            if have is not meta and isinstance(meta, TensorStorageMetadata) and isinstance(have, TensorStorageMetadata):
                known = {tuple(c.offsets) for c in have.chunks}
                have.chunks.extend(c for c in meta.chunks if tuple(c.offsets) not in known)
        for index, info in md.storage_data.items():
            key = _chunk_key(index)
            if key not in stored:
                stored.add(key)
                info.relative_path = f"{part.name}/{info.relative_path}"
                merged.storage_data[index] = info
    return merged


def _chunk_key(index: MetadataIndex) -> tuple[str, tuple[int, ...] | None]:
    return index.fqn, tuple(index.offset) if index.offset is not None else None


def write_metadata(folder: Path, metadata: Metadata) -> None:
    """DCP's ``.metadata`` (a pickle, as FileSystemWriter writes it), written aside then renamed."""
    aside = folder / f"{DCP_METADATA}.tmp"
    with aside.open("wb") as f:
        pickle.dump(metadata, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(aside, folder / DCP_METADATA)
