"""What the local API does: each request, checked against the rules (``access``) for the caller the
kernel named, then carried out on the daemon's store. Every human action is signed with the
caller's passwd name and UID; the daemon acts on what was recorded on its next tick."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any, Protocol, TypeVar

import msgspec
import structlog

from supervisor.api import wire
from supervisor.api.access import Caller, Decision, Instance, may_act_on_instance, may_act_on_run, may_submit
from supervisor.api.identity import user_name
from supervisor.config import ConfigError, check_partition, load_run_spec
from supervisor.domain.actions import Submit
from supervisor.domain.cluster import ClusterSnapshot, SubmitRequest
from supervisor.domain.records import Event, EventKind, RunRecord
from supervisor.domain.run import RunSpec
from supervisor.engine.act.intents import submit_request
from supervisor.engine.act.register import register_run
from supervisor.ports import Clock, NotLeading, PermanentError, PortError, Store

log = structlog.get_logger("supervisor.api")
T = TypeVar("T")


class SlurmCheck(Protocol):
    """What a submit asks Slurm before the run is registered: its partitions, and whether it would
    accept the job (``sbatch --test-only``, as the instance's account)."""

    def snapshot(self, include_nodes: bool = True) -> ClusterSnapshot: ...

    def test_submit(self, request: SubmitRequest) -> None: ...


class Refusal(Exception):
    def __init__(self, kind: wire.Failure, message: str) -> None:
        super().__init__(message)
        self.kind = kind


class Operations:
    """The handler the API server calls with each caller and request line."""

    def __init__(self, store: Store, clock: Clock, instance: Instance, slurm: SlurmCheck | None) -> None:
        self._store = store
        self._clock = clock
        self._inst = instance
        self._slurm = slurm
        self._lock = threading.Lock()  # one store connection, many API threads

    @property
    def instance(self) -> Instance:
        """Who this daemon is (the API server keeps connection slots for its account and group)."""
        return self._inst

    def answer(self, caller: Caller, line: bytes) -> bytes:
        try:
            request = wire.decode_request(line)
        except (msgspec.ValidationError, msgspec.DecodeError) as exc:
            return wire.failure(wire.Failure.INVALID, f"not a request this daemon knows: {exc}")
        try:
            if isinstance(request, wire.Submit):
                return wire.answer(self._submit(caller, request))
            with self._lock:
                return wire.answer(self._dispatch(caller, request))
        except Refusal as exc:
            return wire.failure(exc.kind, str(exc))
        except NotLeading:  # a standby's connection: the change is the leader's to make
            return wire.failure(wire.Failure.REFUSED, self._where_to_go())
        except PortError as exc:
            return wire.failure(wire.Failure.REFUSED, str(exc))
        except Exception as exc:  # noqa: BLE001 - one failed request must not end the API
            log.exception("api_request_failed", op=type(request).__name__, caller=caller.name)
            return wire.failure(wire.Failure.INTERNAL, f"the daemon failed ({type(exc).__name__}); its log says why")

    def _where_to_go(self) -> str:
        try:
            lease = self._store.lease()
        except PortError:  # the store went away too: the refusal still says why
            lease = None
        who = f"{lease.holder} at {lease.address}, epoch {lease.epoch}" if lease is not None else "another daemon"
        return (
            f"this daemon stands by and changes nothing: {who} leads the instance; "
            "run the command on that login node (reads are answered here too)"
        )

    def _dispatch(self, caller: Caller, request: wire.Request) -> Any:
        match request:
            case wire.Whoami():
                return {"uid": caller.uid, "name": caller.name, "instance": self._inst.name}
            case wire.Leader():  # who leads and where: what a job is told anyway, to any caller
                return self._store.lease()
            case wire.Runs():
                return [r for r in self._store.runs() if self._check_run(caller, r, "read").allowed]
            case wire.GetRun(run=name):
                record = self._store.get_run(name)
                return None if record is None else self._allow(self._check_run(caller, record, "read"), record)
            case wire.Attempts(run=name):
                return self._store.attempts(self._run(caller, name, "read").name)
            case wire.Progress(run=name):
                return self._store.progress(self._run(caller, name, "read").name)
            case wire.Events():
                return self._events(caller, request)
            case wire.Nodes() | wire.Faults() | wire.Clears():
                return self._instance_read(caller, request)
            case wire.Cancel(run=name):
                return self._cancel(caller, name)
            case wire.Note(run=name, text=text):
                return self._note(caller, name, text)
            case wire.ClearQuarantine(node=node, note=note):
                return self._clear(caller, node, note)
        raise Refusal(wire.Failure.INVALID, f"unhandled request {type(request).__name__}")

    # ------------------------------------------------------------------ the rules

    def _check_run(self, caller: Caller, record: RunRecord, verb: str) -> Decision:
        owner = record.owner_uid
        return may_act_on_run(caller, self._inst, record.name, (owner, user_name(owner)) if owner else None, verb)

    def _run(self, caller: Caller, name: str, verb: str) -> RunRecord:
        record = self._store.get_run(name)
        if record is None:
            raise Refusal(wire.Failure.UNKNOWN_RUN, f"unknown run {name!r}; `slurm-supervisor status` lists the runs")
        return self._allow(self._check_run(caller, record, verb), record)

    @staticmethod
    def _allow(decision: Decision, value: T) -> T:
        if not decision.allowed:
            raise Refusal(wire.Failure.DENIED, decision.rule)
        return value

    # ------------------------------------------------------------------ reads

    def _events(self, caller: Caller, request: wire.Events) -> list[Event]:
        if request.run is not None:
            self._run(caller, request.run, "read")
            events = self._store.events(request.run)
        else:
            runs = self._store.runs()
            visible = {r.name for r in runs if self._check_run(caller, r, "read").allowed}
            if not visible:  # rights first: a caller who may read no run costs no logbook read
                return []
            everything = self._store.events()
            events = everything if len(visible) == len(runs) else [e for e in everything if e.run in visible]
        return events[request.offset : request.offset + request.limit]

    def _instance_read(self, caller: Caller, request: wire.Nodes | wire.Faults | wire.Clears) -> Any:
        """What the instance keeps about nodes: the account, its group and the admin group may read it."""
        self._allow(may_act_on_instance(caller, self._inst, "read the node records"), None)
        if isinstance(request, wire.Faults):
            return self._store.node_faults(request.since)
        return self._store.verdicts() if isinstance(request, wire.Nodes) else self._store.quarantine_clears()

    # ------------------------------------------------------------------ actions, signed

    def _cancel(self, caller: Caller, name: str) -> str:
        self._run(caller, name, "cancel")
        now = self._clock.now()
        with self._store.transaction():
            self._store.request_cancel(name, now)
            self._sign(caller, name, "cancel requested", f"{name}:cancel:{now:.6f}:{caller.uid}", now)
        return f"cancel of run {name} requested by {caller.name}; the daemon cancels its job on its next tick"

    def _note(self, caller: Caller, name: str, text: str) -> str:
        record = self._run(caller, name, "add a note to")
        if not text.strip():
            raise Refusal(
                wire.Failure.REFUSED, 'the note is empty; write what happened, e.g. "replaced GPU 3 on gpu-117"'
            )
        now = self._clock.now()
        self._sign(caller, name, text.strip(), f"{name}:note:{now:.6f}:{caller.uid}", now, record)
        return caller.name

    def _sign(self, caller: Caller, run: str, text: str, key: str, now: float, record: RunRecord | None = None) -> None:
        a = record.attempt if record is not None else None
        self._store.record_event(
            Event(
                run,
                EventKind.NOTE,
                text,
                key,
                now,
                a.seq if a else None,
                a.job_id if a else None,
                actor=caller.name,
                evidence={"uid": caller.uid},
            )
        )

    def _clear(self, caller: Caller, node: str, note: str) -> str:
        self._allow(may_act_on_instance(caller, self._inst, f"clear the quarantine of {node}"), None)
        if not note.strip():
            raise Refusal(
                wire.Failure.REFUSED, "say why the node may return, e.g. --note 'GPU 3 replaced, ticket 1234'"
            )
        self._store.clear_quarantine(node, self._clock.now(), caller.name, note.strip())
        return caller.name

    def _submit(self, caller: Caller, request: wire.Submit) -> str:
        self._allow(may_submit(caller, self._inst), None)
        spec = self._checked_spec(request.spec, request.slurm_check)  # outside the lock: Slurm may be slow
        now = self._clock.now()
        with self._lock:
            register_run(
                self._store,
                spec,
                now,
                actor=caller.name,
                message=f"run registered by {caller.name}: {spec.nodes} nodes on {spec.partition}, "
                f"up to {spec.max_restarts} restarts",
                owner_uid=caller.uid,
                evidence={"spec": request.spec, "uid": caller.uid},
            )
        return spec.name

    def _checked_spec(self, path: str, slurm_check: bool) -> RunSpec:
        """The run spec, loaded as the instance's account (its jobs read the same files), and unless
        told not to, its partition and job checked against Slurm's answer for that account."""
        if not Path(path).is_absolute():
            raise Refusal(wire.Failure.INVALID, f"the spec path must be absolute, not {path!r}")
        try:
            spec = load_run_spec(path)
            if slurm_check and self._slurm is not None:
                snap = self._slurm.snapshot()
                check_partition(spec, {p for n in snap.nodes.values() for p in n.partitions})
                self._would_accept(spec)
        except ConfigError as exc:
            raise Refusal(wire.Failure.REFUSED, str(exc)) from None
        except PortError as exc:
            raise Refusal(
                wire.Failure.REFUSED,
                f"could not ask Slurm about partition {spec.partition!r}: {exc}. "
                "Fix: check that slurmctld is up, or pass --no-slurm-check",
            ) from None
        return spec

    def _would_accept(self, spec: RunSpec) -> None:
        """``sbatch --test-only`` with the job the daemon would submit: what Slurm refuses (a GRES the
        cluster lacks, too many nodes, a limit) is refused here, in Slurm's words, not retried later."""
        assert self._slurm is not None
        request = submit_request(
            spec, Submit(spec.name, (), restart=False, reason="check"), "slurm-supervisor:check", 0
        )
        try:
            self._slurm.test_submit(request)
        except PermanentError as exc:
            raise Refusal(
                wire.Failure.REFUSED,
                f"run {spec.name}: Slurm would refuse its job: {exc}. Fix: change the spec's [run] (partition, "
                "nodes, sbatch_args) or ask the cluster's admins; --no-slurm-check skips this check",
            ) from None
