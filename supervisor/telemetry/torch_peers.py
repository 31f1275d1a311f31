"""In-memory peer copies for a state with no replica (FSDP / ZeRO-3 alone, tensor or pipeline
shards): every ``every`` steps each rank snapshots its own shards into host memory and sends the
snapshot to its *buddy*, the same local rank on the next node (a ring across nodes); after a node
dies, the relaunched world (in-allocation: the survivors and a hot spare) takes every rank's shards
from memory — its own node's copy, or the buddy's over the network — instead of reading the storage
checkpoint (Gemini, SOSP '23; HyperPod's checkpointless training; DLRover's shard backups).

    peers = PeerCopies(state, every=5, per_node=ranks_per_node)   # after init_process_group
    step = peers.restore(state, newer_than=ssv.orders.step or 0) or ssv.resume(state)
    while step < total:
        ...step...; optimizer.step(); guard.completed(step)
        peers.boundary(step)                 # every `every` steps: snapshot + asynchronous send

**Where the copies are.** Files in host memory (``/dev/shm``, or ``SSV_PEER_DIR``), one folder a
node: ``rankR-stepS.bin`` (a rank's serialized local state: its DTensors' local shards, the values
every rank holds) — its own ranks' and its wards' — and ``stepS.manifest.json``, every rank's size
and SHA-256 for that generation. A file outlives the process that wrote it, not the node: a step
relaunched in the job finds its node's copies; a dead node's copies are at its buddy.

**Asynchronous, bounded.** The snapshot is taken on the training thread right after the update
(``torch.save`` of the local tensors into host memory: the one cost on the step's path; on a GPU a
copy to pinned memory); the checksum, the write and the exchange with the buddy and the ward run on
a thread over a process group of their own. When the previous generation's exchange is still going
at the next boundary, that boundary is skipped (its cost is not added to the step's).

**Complete, reported, verified.** Once its exchange is done, the thread agrees with every rank
(one small all-gather on the exchange's group) that each kept its copy and received its ward's;
the generation's manifest is then written on every node and rank 0 reports it, ``{"ssv": 1,
"event": "memory_checkpoint", "generation": S, "manifest": SHA}`` (docs/telemetry-jsonl.md; no
``step`` field: it is not a progress record). ``restore`` trusts a generation only when a manifest
of this world's size names every rank and every copy read or received matches its size and
checksum; otherwise it returns 0 and the trainer resumes from storage. A restore is reported the
same way (``"event": "memory_restored"``, with the step it was offered and its seconds): the
daemon writes it in the logbook and books the work it kept.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import os
import re
import sys
import threading
import time
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

import torch
import torch.distributed as dist

COPY = re.compile(r"rank(\d+)-step(\d+)\.bin")
MANIFEST = re.compile(r"step(\d+)\.manifest\.json")
KEEP = 2  # generations kept per node: the newest complete one, and the one being made


def default_folder() -> Path:
    """``BASE/ssv-peers-JOB-NODE``, BASE ``SSV_PEER_DIR`` or ``/dev/shm`` (host memory): one folder
    per job and node (the nodes of the tests' one-host Slurm share /dev/shm)."""
    base = Path(os.environ.get("SSV_PEER_DIR") or "/dev/shm")
    job, node = os.environ.get("SLURM_JOB_ID", "local"), os.environ.get("SLURMD_NODENAME", "node")
    return base / f"ssv-peers-{job}-{node}"


@dataclass(frozen=True)
class Restored:
    """What ``restore`` did: the generation's step (0: nothing restored), why, and how long."""

    step: int
    why: str
    seconds: float
    moved_bytes: int = 0


class PeerCopies:
    """This rank's side (module docstring). ``per_node``: ranks a node (``LOCAL_WORLD_SIZE``)."""

    def __init__(
        self,
        state: dict[str, Any],
        *,
        every: int,
        per_node: int | None = None,
        folder: Path | None = None,
        stream: TextIO | None = None,
    ) -> None:
        if every < 1:
            raise ValueError("every must be at least 1 step")
        self.state, self.every = state, every
        self.rank, self.world = dist.get_rank(), dist.get_world_size()
        self.per_node = per_node or int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
        if self.world % self.per_node or self.world == self.per_node:
            raise ValueError(
                f"peer copies need whole nodes and at least two ({self.world} ranks, {self.per_node} a node)"
            )
        self.buddy = (self.rank + self.per_node) % self.world
        self.ward = (self.rank - self.per_node) % self.world
        self.folder = folder or default_folder()
        self.folder.mkdir(parents=True, exist_ok=True)
        self.stream = stream
        self.group = dist.new_group(backend="gloo")  # the exchange's own: never mixed with the step's
        self.done = 0  # the newest generation every rank kept and received (verified)
        self.snapshot_s = 0.0  # the training thread's time in snapshots, all told
        self.snapshots: deque[float] = deque(maxlen=256)  # the newest snapshots' seconds each
        self.skipped = 0
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None

    # ------------------------------------------------------------------ making copies

    def boundary(self, step: int) -> None:
        """After ``step``'s update (no collective since ``optimizer.step()`` needed): every
        ``every`` steps, snapshot this rank's state and hand it to the exchange's thread."""
        if step % self.every:
            return
        if self._error is not None:
            print(f"ssv: peer copy failed: {type(self._error).__name__}: {self._error}", file=sys.stderr)
            self._error = None
        if self._thread is not None and self._thread.is_alive():
            self.skipped += 1  # the last exchange is still going: this boundary costs nothing
            return
        began = time.perf_counter()
        payload = serialize(self.state)
        self.snapshots.append(time.perf_counter() - began)
        self.snapshot_s += self.snapshots[-1]
        self._thread = threading.Thread(target=self._exchange, args=(step, payload), daemon=True)
        self._thread.start()

    def _exchange(self, step: int, payload: bytes) -> None:
        """Keep our copy, send it to the buddy, take the ward's (sizes first), keep it verified;
        then agree with every rank that the generation is complete."""
        try:
            digest = hashlib.sha256(payload).hexdigest()
            _write(self.folder / f"rank{self.rank}-step{step}.bin", payload)
            size = torch.tensor([len(payload)], dtype=torch.int64)
            theirs = torch.empty(1, dtype=torch.int64)
            _wait([dist.isend(size, self.buddy, group=self.group), dist.irecv(theirs, self.ward, group=self.group)])
            sent = torch.frombuffer(bytearray(payload + bytes.fromhex(digest)), dtype=torch.uint8)
            got = torch.empty(int(theirs.item()) + 32, dtype=torch.uint8)
            _wait([dist.isend(sent, self.buddy, group=self.group), dist.irecv(got, self.ward, group=self.group)])
            body, claimed = got[:-32].numpy().tobytes(), got[-32:].numpy().tobytes().hex()
            kept = hashlib.sha256(body).hexdigest() == claimed
            if kept:
                _write(self.folder / f"rank{self.ward}-step{step}.bin", body)
            self._agree(step, (step, len(payload), digest) if kept else (0, 0, ""))
        except BaseException as exc:  # noqa: BLE001 - the training thread reports it at the boundary
            self._error = exc

    def _agree(self, step: int, mine: tuple[int, int, str]) -> None:
        """One all-gather of each rank's (step, size, sha256) on the exchange's group: when every
        rank kept and received ``step``, its manifest goes on every node and rank 0 reports it."""
        every: list[Any] = [None] * self.world
        dist.all_gather_object(every, mine, group=self.group)
        if any(int(e[0]) != step for e in every):
            self._error = ValueError(f"generation {step} is incomplete: a copy arrived damaged or not at all")
            return
        doc = {"step": step, "world": self.world, "ranks": [{"size": e[1], "sha256": e[2]} for e in every]}
        body = json.dumps(doc, sort_keys=True).encode()
        _write(self.folder / f"step{step}.manifest.json", body)
        self.done = step
        self._prune(step)
        if self.rank == 0:
            self._say({"event": "memory_checkpoint", "generation": step, "manifest": hashlib.sha256(body).hexdigest()})

    def _say(self, event: dict[str, Any]) -> None:
        out = self.stream or sys.stdout
        out.write(json.dumps({"ssv": 1, **event}) + "\n")
        out.flush()

    def _prune(self, complete: int) -> None:
        """Copies and manifests older than the newest complete generation go (host memory is dear)."""
        for path in self.folder.iterdir():
            found = COPY.fullmatch(path.name) or MANIFEST.fullmatch(path.name)
            if found and int(found.groups()[-1]) < complete:
                path.unlink(missing_ok=True)

    def close(self, *, discard: bool = False) -> None:
        """Wait for the exchange in flight; with ``discard`` (the run is done) remove this rank's
        copies and its ward's, and the folder once nothing else is in it."""
        if self._thread is not None:
            self._thread.join()
        if not discard:
            return
        for path in self.folder.iterdir():
            found = COPY.fullmatch(path.name)
            if (found and int(found[1]) in (self.rank, self.ward)) or MANIFEST.fullmatch(path.name):
                path.unlink(missing_ok=True)
        with contextlib.suppress(OSError):
            self.folder.rmdir()

    # ------------------------------------------------------------------ restoring

    def restore(self, state: dict[str, Any], *, newer_than: int = 0) -> Restored:
        """Fill ``state`` (in place) from the newest generation every rank of this world can have
        from its node's memory or a peer's, if newer than step ``newer_than``; every copy checked
        against the generation's manifest first. Collective: every rank calls it."""
        began = time.perf_counter()
        every: list[Any] = [None] * self.world
        dist.all_gather_object(every, self._inventory())
        step, manifest = _choose(every, self.world, newer_than)
        if step == 0:
            return Restored(0, f"no complete generation in memory newer than step {newer_than}", 0.0)
        holder = {r: _holder(every, r, step) for r in range(self.world)}
        want = manifest["ranks"][self.rank]
        mine = self.folder / f"rank{self.rank}-step{step}.bin"
        body = self._fetch(step, holder, want, mine)
        moved = sum(int(manifest["ranks"][r]["size"]) for r, source in holder.items() if source != r)
        ok = hashlib.sha256(body).hexdigest() == want["sha256"] and len(body) == want["size"]
        agreed = torch.tensor([1 if ok else 0], dtype=torch.int32)
        dist.all_reduce(agreed, op=dist.ReduceOp.MIN)
        if not agreed.item():
            return Restored(0, f"a copy of step {step} does not match its manifest", time.perf_counter() - began)
        load_into(state, body)
        done = Restored(step, f"step {step} from memory", time.perf_counter() - began, moved)
        if self.rank == 0:
            digest = hashlib.sha256(json.dumps(manifest, sort_keys=True).encode()).hexdigest()  # as written
            self._say({"event": "memory_restored", "generation": step, "manifest": digest, "offered_step": newer_than,
                       "seconds": round(done.seconds, 4), "moved_bytes": moved})  # fmt: skip
        return done

    def _inventory(self) -> dict[str, Any]:
        """What this node's memory holds: copies by (rank, step), and the manifests."""
        copies, manifests = [], {}
        for path in sorted(self.folder.iterdir()):
            if found := COPY.fullmatch(path.name):
                copies.append((int(found[1]), int(found[2])))
            elif found := MANIFEST.fullmatch(path.name):
                manifests[int(found[1])] = json.loads(path.read_text())
        return {"copies": copies, "manifests": manifests}

    def _fetch(self, step: int, holder: dict[int, int], want: dict[str, Any], mine: Path) -> bytes:
        """This rank's bytes of ``step``: read here when its holder is this rank, received from the
        holder otherwise; and the copies this rank holds for others, sent (one tag per rank)."""
        work = []
        for rank, source in holder.items():
            if source == self.rank and rank != self.rank:
                data = (self.folder / f"rank{rank}-step{step}.bin").read_bytes()
                work.append(dist.isend(torch.frombuffer(bytearray(data), dtype=torch.uint8), rank, tag=rank))
        if holder[self.rank] == self.rank:
            body = mine.read_bytes()
        else:
            buf = torch.empty(int(want["size"]), dtype=torch.uint8)
            work.append(dist.irecv(buf, holder[self.rank], tag=self.rank))
        _wait(work)
        if holder[self.rank] != self.rank:
            body = buf.numpy().tobytes()
        _write(mine, body)  # this node holds it now: a relaunch in place finds it here
        return body


def _choose(every: list[dict[str, Any]], world: int, newer_than: int) -> tuple[int, dict[str, Any]]:
    """The newest step with a manifest of this world's size somewhere and a copy of every rank
    somewhere, newer than ``newer_than``; (0, {}) when none."""
    held: dict[int, set[int]] = {}
    for node in every:
        for rank, step in node["copies"]:
            held.setdefault(int(step), set()).add(int(rank))
    manifests = {int(s): m for node in every for s, m in node["manifests"].items()}
    for step in sorted(held, reverse=True):
        manifest = manifests.get(step)
        if step > newer_than and manifest and manifest.get("world") == world and held[step] == set(range(world)):
            return step, manifest
    return 0, {}


def _holder(every: list[dict[str, Any]], rank: int, step: int) -> int:
    """Which rank of this world sends ``rank``'s copy of ``step``: itself when its node has it,
    else the lowest rank whose node does."""
    having = [r for r, node in enumerate(every) if (rank, step) in {tuple(c) for c in node["copies"]}]
    return rank if rank in having else min(having)


def _wait(work: list[Any]) -> None:
    for w in work:
        w.wait()


def _write(path: Path, body: bytes) -> None:
    aside = path.with_name(f".{path.name}.tmp")
    aside.write_bytes(body)
    os.replace(aside, path)


def _leaves(value: Any, prefix: str = "") -> Iterator[tuple[str, Any, Any, Any]]:
    """(path, leaf, its container, its key) of every leaf of a nested dict/list state."""
    items = value.items() if isinstance(value, dict) else enumerate(value)
    for key, leaf in items:
        path = f"{prefix}/{key}"
        if isinstance(leaf, (dict, list)):
            yield from _leaves(leaf, path)
        else:
            yield path, leaf, value, key


def _local(leaf: Any) -> Any:
    return leaf.to_local() if hasattr(leaf, "to_local") else leaf


def serialize(state: dict[str, Any]) -> bytes:
    """This rank's local state as bytes: every leaf by its path, a DTensor as its local shard."""
    flat = {path: (_local(leaf).detach().clone() if isinstance(leaf, torch.Tensor) else leaf)
            for path, leaf, _, _ in _leaves(state)}  # fmt: skip
    out = io.BytesIO()
    torch.save(flat, out)
    return out.getvalue()


def load_into(state: dict[str, Any], body: bytes) -> None:
    """The bytes of ``serialize`` back into ``state`` (the same structure): tensors copied into
    the local shards in place, other values replaced."""
    flat = torch.load(io.BytesIO(body), weights_only=True)
    for path, leaf, container, key in list(_leaves(state)):
        if path not in flat:
            raise KeyError(f"the copy has no {path}")
        if isinstance(leaf, torch.Tensor):
            with torch.no_grad():
                _local(leaf).copy_(flat[path])
        else:
            container[key] = flat[path]
