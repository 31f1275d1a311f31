"""Checkpoints in the tick: find new ones, verify them, alarm when none appear, choose where to resume.

Per run with a ``[checkpoints]`` section: the storage root is listed every ``scan_interval_s``;
each new checkpoint gets a metadata verification at once and, when the run asks for it, a full
verification after it (the store applies the bandwidth cap). Storage work runs on a small pool of
worker threads so a slow bucket never stalls the tick; results come back to the engine thread,
which alone writes the store. In ``inline`` mode (the simulator, unit tests) the work runs in the
tick, deterministically.

At every submission the engine asks ``resume_for``: the newest verified checkpoint, older verified
ones as fallbacks, and for the logbook the newer ones passed over and why. A committed checkpoint
not verified yet gets its metadata check there and then: a restart never waits for a scan, and
never resumes from a torn or unverified checkpoint.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from typing import Any

import structlog

from supervisor.domain.actions import CheckpointChecked, CheckpointSeen, Record
from supervisor.domain.checkpoints.manifest import (
    CheckpointRef,
    Level,
    Outcome,
    VerifyResult,
    effective_result,
    staleness,
)
from supervisor.domain.checkpoints.resume import ResumePlan
from supervisor.domain.checkpoints.signing import manifest_key, signed_json
from supervisor.domain.records import Event, EventKind, RunRecord
from supervisor.domain.run import CheckpointPolicy, RunSpec, RunState
from supervisor.engine.watch.resume import demote_failed_loads, plan_for
from supervisor.engine.watch.save_check import RECENT, SaveChecks, newest_verified, saves_at_end
from supervisor.ports import CheckpointStore, Clock, PortError, Store

log = structlog.get_logger("supervisor.checkpoints")

StoreFactory = Callable[[RunSpec], CheckpointStore]
ResumeWriter = Callable[[str, str], None]  # (path, JSON text): atomic write on a shared filesystem
Writer = Callable[[Sequence[Record]], None]  # the engine's executor applying records

_KIND = {
    Outcome.VERIFIED: EventKind.CHECKPOINT_VERIFIED,
    Outcome.CORRUPT: EventKind.CHECKPOINT_CORRUPT,
    Outcome.UNVERIFIABLE: EventKind.CHECKPOINT_UNVERIFIABLE,
}


@dataclass
class _RunState:
    store: CheckpointStore
    next_scan: float = 0.0
    listing: Future[list[CheckpointRef]] | None = None
    pending: list[tuple[CheckpointRef, Level, Future[VerifyResult]]] = field(default_factory=list)
    queued: set[tuple[str, Level]] = field(default_factory=set)
    retry: list[tuple[CheckpointRef, Level]] = field(default_factory=list)  # unverifiable: again next scan
    known: dict[str, CheckpointRef] = field(default_factory=dict)  # location -> as listed when stored


class CheckpointWatch:
    def __init__(
        self,
        factory: StoreFactory,
        clock: Clock,
        *,
        inline: bool = False,
        workers: int = 2,
        write_resume: ResumeWriter | None = None,
    ) -> None:
        self._factory = factory
        self._clock = clock
        self._pool = None if inline else ThreadPoolExecutor(workers, thread_name_prefix="ckpt-verify")
        self._write_resume = write_resume
        self._runs: dict[str, _RunState] = {}
        self._write: Writer = _no_writer

    def write_through(self, writer: Writer) -> None:
        """What the watch learns (checkpoints seen, verified, passed over; logbook lines) is written
        by the engine's executor, at once: the choice of a checkpoint reads it back."""
        self._write = writer

    def _emit(self, event: Event) -> None:
        self._write([event])

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)

    # ------------------------------------------------------------------ the tick

    def update(self, runs: Iterable[RunRecord], store: Store) -> None:
        now = self._clock.now()
        for run in runs:
            policy = run.spec.checkpoints
            if policy is None or run.state.terminal:
                continue
            st = self._state(run)
            self._collect(run, st, store)
            if st.listing is None and now >= st.next_scan:
                st.next_scan = now + policy.scan_interval_s
                st.listing = self._submit(st.store.discover)
                self._collect(run, st, store)
            self._alarm(run, policy, store, now)

    def _state(self, run: RunRecord) -> _RunState:
        st = self._runs.get(run.name)
        if st is None:
            st = self._runs[run.name] = _RunState(self._factory(run.spec))
        return st

    def _submit(self, fn: Callable[..., Any], *args: Any) -> Future[Any]:
        if self._pool is not None:
            return self._pool.submit(fn, *args)
        fut: Future[Any] = Future()
        try:
            fut.set_result(fn(*args))
        except BaseException as exc:  # noqa: BLE001 - handed back through the future, like a pool does
            fut.set_exception(exc)
        return fut

    def _collect(self, run: RunRecord, st: _RunState, store: Store) -> None:
        if st.listing is not None and st.listing.done():
            listing, st.listing = st.listing, None
            try:
                refs = listing.result()
            except Exception as exc:  # noqa: BLE001 - storage trouble, or a store bug: never the tick's end
                self._listing_failed(run, store, exc)
                refs = []
            for ref in refs:
                if self._seen(run, st, store, ref):
                    self._queue(run, st, ref, Level.METADATA)
            retry, st.retry = st.retry, []
            for ref, level in retry:
                self._queue(run, st, ref, level)
        while any(verifying.done() for _, _, verifying in st.pending):
            pending, st.pending = st.pending, []
            for ref, level, verifying in pending:
                if not verifying.done():
                    st.pending.append((ref, level, verifying))
                    continue
                st.queued.discard((ref.location, level))
                self._record(run, st, store, ref, _result_of(ref, level, verifying))  # may queue more

    def _seen(self, run: RunRecord, st: _RunState, store: Store, ref: CheckpointRef) -> bool:
        """Store a listed checkpoint unless this watch stored it unchanged already (a root holds
        hundreds of old checkpoints; each scan must cost only what is new)."""
        known = st.known.get(ref.location)
        if known is ref or (known is not None and (known.committed, known.seen_at) == (ref.committed, ref.seen_at)):
            return False  # the very ref stored last (a listing that keeps its refs) costs one lookup
        st.known[ref.location] = ref
        stored = store.checkpoint_state(run.name, ref.location)
        if stored is not None and stored[0] == ref.committed and stored[1] >= ref.seen_at:
            return False
        self._write([CheckpointSeen(run.name, ref, self._clock.now())])
        return True

    def _listing_failed(self, run: RunRecord, store: Store, exc: Exception) -> None:
        """Logged every time; written to the logbook once per kind of failure."""
        kind = type(exc).__name__
        log.warning("checkpoint_listing_failed", run=run.name, error=str(exc), error_type=kind)
        a = run.attempt
        self._emit(
            Event(
                run.name,
                EventKind.WARNING,
                f"cannot list the checkpoint root {run.spec.checkpoints.root if run.spec.checkpoints else ''}: "
                f"{kind}: {exc}; new checkpoints are not verified (and not resumed from) until it can",
                f"{run.name}:ckpt-listing:{kind}",
                self._clock.now(),
                a.seq if a else None,
                a.job_id if a else None,
                evidence={"error": str(exc), "error_type": kind},
            )
        )

    def _queue(self, run: RunRecord, st: _RunState, ref: CheckpointRef, level: Level) -> None:
        if (ref.location, level) in st.queued:
            return
        st.queued.add((ref.location, level))
        st.pending.append((ref, level, self._submit(st.store.verify, ref, level)))

    def _record(self, run: RunRecord, st: _RunState, store: Store, ref: CheckpointRef, result: VerifyResult) -> None:
        self._write([CheckpointChecked(run.name, result)])
        log.info(
            "checkpoint_checked",
            run=run.name,
            location=ref.location,
            level=result.level.value,
            outcome=result.outcome.value,
            reason=result.reason,
        )
        policy = run.spec.checkpoints
        if result.outcome is Outcome.VERIFIED and result.level is Level.METADATA and policy and policy.full_verify:
            self._queue(run, st, ref, Level.FULL)
        if result.outcome is Outcome.UNVERIFIABLE:
            st.retry.append((ref, result.level))  # storage trouble proves nothing: try again next scan
            if not ref.committed:
                return  # an upload in progress: normal, not worth a logbook line
        step = f"step {result.step}" if result.step is not None else ref.name
        weak = f" [{ref.guarantee.value}: weaker guarantee]" if ref.guarantee.weak else ""
        a = run.attempt
        self._emit(
            Event(
                run.name,
                _KIND[result.outcome],
                f"checkpoint {step} {result.outcome.value} ({result.level.value}){weak}: {result.reason}",
                f"{run.name}:ckpt:{ref.location}:{result.level.value}:{result.outcome.value}",
                self._clock.now(),
                a.seq if a else None,
                a.job_id if a else None,
                evidence=result.evidence(),
            )
        )

    def _alarm(self, run: RunRecord, policy: CheckpointPolicy, store: Store, now: float) -> None:
        if not policy.expected_interval_s:
            return
        if run.state is not RunState.RUNNING or run.attempt is None or run.attempt.started_at is None:
            return
        newest = newest_verified(store.checkpoints(run.name, RECENT))
        age = staleness(
            now, run.created_at, newest.seen_at if newest else None, policy.expected_interval_s, policy.alarm_intervals
        )
        if age is None:
            return
        a = run.attempt
        last = f"step {newest.step}" if newest else "none yet"
        self._emit(
            Event(
                run.name,
                EventKind.CHECKPOINT_STALE,
                f"no verified checkpoint for {age / 3600:.1f} h ({policy.alarm_intervals:g} × the expected "
                f"{policy.expected_interval_s:g} s interval); newest verified: {last}",
                f"{run.name}:ckpt-stale:{newest.location if newest else 'none'}",
                now,
                a.seq,
                a.job_id,
                evidence={
                    "age_s": round(age, 1),
                    "expected_interval_s": policy.expected_interval_s,
                    "newest_verified": newest.location if newest else None,
                },
            )
        )

    def verified_at(self, runs: Iterable[RunRecord], store: Store) -> dict[str, float]:
        """Per run with checkpoints: when its newest verified checkpoint was written."""
        out: dict[str, float] = {}
        for run in runs:
            if run.spec.checkpoints is None or run.state.terminal:
                continue
            newest = newest_verified(store.checkpoints(run.name, RECENT))
            if newest is not None:
                out[run.name] = newest.seen_at
        return out

    def saved_now(self, runs: Iterable[RunRecord], store: Store) -> SaveChecks:
        """Per run (those whose job just ended): its newest verified checkpoint, committed ones not
        verified yet checked now, and a newer save storage would not let be checked (engine.watch.save_check)."""
        return saves_at_end(runs, store, self.refresh)

    # ------------------------------------------------------------------ at submission

    def resume_for(self, run: RunRecord, store: Store) -> ResumePlan | None:
        """The resume plan for a new incarnation of ``run`` (None when it has no [checkpoints])."""
        policy = run.spec.checkpoints
        if policy is None:
            return None
        st = self._state(run)
        self._collect(run, st, store)
        self._verify_unchecked(run, st, store)
        self._write(demote_failed_loads(run, store, RECENT, self._clock.now()))
        plan = plan_for(run, store, RECENT, policy.resume_file)
        return self._write_resume_file(run, store, plan)

    def _write_resume_file(self, run: RunRecord, store: Store, plan: ResumePlan) -> ResumePlan:
        """The plan as handed over: without its file when the file could not be written (the job
        still gets the choice in its environment)."""
        path = plan.file
        if not path or self._write_resume is None:
            return plan
        try:
            # signed with the run's key, so that the job reads no file another account put there first
            key = manifest_key(store.run_token(run.name))
            self._write_resume(path, signed_json({"run": run.name, **plan.to_json()}, key))
        except OSError as exc:
            log.error("resume_file_unwritable", run=run.name, path=path, error=str(exc))
            a = run.attempt
            self._emit(
                Event(
                    run.name,
                    EventKind.WARNING,
                    f"could not write the resume file {path} ({exc.strerror or exc}); the job gets the checkpoint "
                    "in its environment only. Fix: name a regular file outside the supervisor's own folders, where "
                    "its user may write (under systemd, add the folder to ReadWritePaths in a drop-in)",
                    f"{run.name}:resume-file:{path}:{exc.errno}",
                    self._clock.now(),
                    a.seq if a else None,
                    a.job_id if a else None,
                    evidence={"path": path, "error": str(exc)},
                )
            )
            return replace(plan, file=None)
        return plan

    def refresh(self, run: RunRecord, store: Store) -> str | None:
        """List the run's root now and metadata-verify committed checkpoints newer than the newest
        verified one (before a rollback is planned, as before a submission). The listing's error,
        when the root could not be listed (what earlier scans found is checked all the same)."""
        if run.spec.checkpoints is None:
            return None
        st = self._state(run)
        self._collect(run, st, store)
        return self._verify_unchecked(run, st, store)

    def _verify_unchecked(self, run: RunRecord, st: _RunState, store: Store) -> str | None:
        """Metadata-verify, now and in this thread, committed checkpoints newer than the newest
        verified one that have no verdict yet (found by the last scan, or never scanned)."""
        listing_error = None
        try:
            for ref in st.store.discover():
                self._seen(run, st, store, ref)
        except Exception as exc:  # noqa: BLE001 - the choice falls back on what earlier scans verified
            self._listing_failed(run, store, exc)
            listing_error = f"{type(exc).__name__}: {exc}"
        rows = store.checkpoints(run.name, RECENT)
        newest = newest_verified(rows)
        for ref, meta, full, demoted in rows:
            if newest is not None and (ref.step or 0) <= (newest.step or 0):
                break
            eff = effective_result(meta, full)
            if not ref.committed or demoted or (eff is not None and eff.outcome is not Outcome.UNVERIFIABLE):
                continue
            self._record(run, st, store, ref, _safe_verify(st.store, ref, Level.METADATA))
        return listing_error


def _safe_verify(store: CheckpointStore, ref: CheckpointRef, level: Level) -> VerifyResult:
    try:
        return store.verify(ref, level)
    except PortError as exc:
        return VerifyResult(ref.location, ref.step, level, Outcome.UNVERIFIABLE, str(exc), ref.guarantee)


def _result_of(ref: CheckpointRef, level: Level, fut: Future[VerifyResult]) -> VerifyResult:
    try:
        return fut.result()
    except Exception as exc:  # noqa: BLE001 - a verifier bug or an unclassified storage error: not evidence of corruption
        log.error("checkpoint_verify_crashed", location=ref.location, error=str(exc), error_type=type(exc).__name__)
        return VerifyResult(
            ref.location,
            ref.step,
            level,
            Outcome.UNVERIFIABLE,
            f"verification failed: {type(exc).__name__}: {exc}",
            ref.guarantee,
        )


def _no_writer(records: Sequence[Record]) -> None:
    raise RuntimeError("CheckpointWatch writes through the engine's executor: call write_through() first")
