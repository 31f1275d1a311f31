"""``SimCluster``: the ``Scheduler`` port on a virtual clock, with Slurm 22.05's semantics.

Mirrors what /work/shared/SLURM-NOTES.md measured: a crashed node gets NOT_RESPONDING after
``slurmd_timeout`` and goes DOWN ("Not responding") after ``down_after``, its jobs requeued
(restart_count+1) at that moment; an admin DOWN requeues at once; a requeued job cannot start
again for ``cred_expire`` seconds; finished jobs vanish after ``min_job_age``. Fault injection
(``crash_node``, ``freeze_node``, ``restore_node``, ``fail_prolog``) and a call log make it a
test bed; ``incarnation_log`` tells which copies of a job really executed when. It is also the
Accounting port (``job_records``, as sacct: slurmdbd keeps the jobs squeue forgot).

Error choices follow slurmctld: requeue of a pending job or of a job submitted without
``requeue`` is refused, exclusion changes only on pending jobs, RESUME only on DOWN/DRAIN nodes.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from types import MappingProxyType

from supervisor.domain.cluster import ClusterSnapshot, JobInfo, JobState, NodeChange, NodeInfo, SubmitRequest
from supervisor.ports import PermanentError, PermissionDenied, PortError, TransientError
from supervisor.sim.clock import VirtualClock
from supervisor.sim.slurm.records import Incarnation, SimJob, SimNode
from supervisor.sim.slurm.state import ClusterState, IncarnationListener

Call = tuple[object, ...]


def node_names(count: int, prefix: str = "n") -> tuple[str, ...]:
    """``count`` names like n001..n016 (at least three digits, 1-based)."""
    width = max(3, len(str(count)))
    return tuple(f"{prefix}{i:0{width}d}" for i in range(1, count + 1))


class SimCluster:
    """A simulated Slurm cluster of whole-node (exclusive) jobs in one partition."""

    def __init__(
        self,
        clock: VirtualClock,
        nodes: Sequence[str] | int,
        partition: str = "main",
        *,
        slurmd_timeout: float = 10.0,
        down_after: float = 20.0,
        cred_expire: float = 10.0,
        min_job_age: float = 300.0,
        node_rights: bool = True,
        prefix: str = "n",
        first_job_id: int = 1000,
        queue_wait: Callable[[], float] | None = None,
        accrue_always: bool = True,
    ) -> None:
        names = node_names(nodes, prefix) if isinstance(nodes, int) else tuple(nodes)
        if len(set(names)) != len(names) or not names:
            raise ValueError("node names must be unique and not empty")
        if down_after < slurmd_timeout:
            raise ValueError("down_after must not be shorter than slurmd_timeout")
        self.clock = clock
        self.partition = partition
        self.node_rights = node_rights
        self._state = ClusterState(
            clock,
            names,
            partition,
            slurmd_timeout=slurmd_timeout,
            down_after=down_after,
            cred_expire=cred_expire,
            min_job_age=min_job_age,
            first_job_id=first_job_id,
            queue_wait=queue_wait,
            accrue_always=accrue_always,
        )
        self._controller_down = False
        self._nodes_cache: Mapping[str, NodeInfo] | None = None
        self._nodes_seen = -1
        #: Every port call, accepted or not: (method, *args), e.g. ("requeue", 1000, False).
        self.calls: list[Call] = []
        #: The subset of ``calls`` that raised a PortError.
        self.failed_calls: list[Call] = []
        self._archive: dict[int, SimJob] = {}  # every job submitted: what slurmdbd keeps
        self._slurmdbd_down = False

    # -- Scheduler port -------------------------------------------------------------------------

    def snapshot(self, include_nodes: bool | Collection[str] = True) -> ClusterSnapshot:
        with self._call("snapshot", include_nodes):
            snap = self.inspect()
            return snap if include_nodes else ClusterSnapshot(snap.taken_at, snap.jobs, {})

    def test_submit(self, request: SubmitRequest) -> None:
        """Like ``sbatch --test-only``: refuse what ``submit`` would refuse, submit nothing."""
        with self._call("test_submit", request):
            self._check_submit(request)

    def submit(self, request: SubmitRequest) -> int:
        with self._call("submit", request):
            self._check_submit(request)
            job = self._state.submit(request)
            self._archive[job.job_id] = job
            self._state.schedule()
            return job.job_id

    def requeue(self, job_id: int, *, hold: bool = False) -> None:
        with self._call("requeue", job_id, hold):
            job = self._job(job_id)
            if not job.requeueable:
                raise PermanentError(f"job {job_id}: Requested operation is presently disabled")
            if job.state is JobState.PENDING:
                raise PermanentError(f"job {job_id}: Job is pending execution")
            self._state.requeue(job, hold=hold)
            self._state.schedule()

    def hold(self, job_id: int) -> None:
        with self._call("hold", job_id):
            self._state.set_held(self._unfinished(job_id), True)

    def release(self, job_id: int) -> None:
        with self._call("release", job_id):
            self._state.set_held(self._unfinished(job_id), False)
            self._state.schedule()

    def cancel(self, job_id: int) -> None:
        with self._call("cancel", job_id):
            job = self._state.jobs.get(job_id)
            if job is None or job.state.finished:
                return  # like scancel: an unknown, purged or finished job is not an error
            signal = 15 if job.state is JobState.RUNNING else None
            self._state.finish(job, JobState.CANCELLED, term_signal=signal)
            self._state.schedule()

    def set_excluded(self, job_id: int, nodes: Sequence[str]) -> None:
        excluded = self._in_node_order(nodes)
        with self._call("set_excluded", job_id, excluded):
            job = self._job(job_id)
            if job.state is not JobState.PENDING:
                raise PermanentError(f"job {job_id}: Job is no longer pending execution")
            self._check_names(excluded)
            job.excluded = excluded
            self._state.schedule()

    def set_node_state(self, node: str, change: NodeChange, reason: str) -> None:
        with self._call("set_node_state", node, change, reason):
            if not self.node_rights:
                raise PermissionDenied(f"update node {node}: Access/permission denied")
            target = self._node(node)
            if change is NodeChange.RESUME:
                if not (target.down or target.drain):
                    raise PermanentError(f"node {node}: Invalid node state specified")
                self._state.resume(target)
            elif not reason.strip():
                raise PermanentError(f"node {node}: a reason is required to {change.value}")
            elif change is NodeChange.DRAIN:
                self._state.drain(target, reason)
            else:
                self._state.set_down(target, reason)
            self._state.schedule()

    # -- fault injection and test hooks ---------------------------------------------------------

    def crash_node(self, name: str) -> None:
        """The node dies (slurmd and processes): NOT_RESPONDING, then DOWN and jobs requeued."""
        self._state.crash(self._node(name))

    def freeze_node(self, name: str) -> None:
        """slurmd hangs but the job processes keep running (a stale copy survives a requeue)."""
        self._state.freeze(self._node(name))

    def restore_node(self, name: str) -> None:
        """slurmd is back: stale copies are killed, a node DOWN for "Not responding" is IDLE."""
        self._state.restore(self._node(name))

    def fail_prolog(self, name: str, fails: bool = True) -> None:
        """While set, a job starting on the node is requeued held and the node drained."""
        self._node(name).prolog_fails = fails

    def finish_job(self, job_id: int, exit_code: int = 0) -> None:
        """The running job's batch script exits now with ``exit_code`` (COMPLETED or FAILED).

        Like a real exit, Slurm only hears of it when the batch node's slurmd is up.
        """
        job = self._job(job_id)
        if job.state is not JobState.RUNNING or job.execution is None:
            raise ValueError(f"job {job_id} is not running ({job.state})")
        self._state.script_exit(job, job.execution, exit_code)

    def time_out(self, job_id: int) -> None:
        """The running job reaches its time limit now: Slurm ends it TIMEOUT (no exit code)."""
        job = self._job(job_id)
        if job.state is not JobState.RUNNING or job.execution is None:
            raise ValueError(f"job {job_id} is not running ({job.state})")
        self._state.finish(job, JobState.TIMEOUT, reason="TimeLimit", everywhere=True)
        self._state.schedule()

    def begin_preemption(self, job_id: int) -> None:
        """A higher-priority job wants the running job's nodes: its PreemptTime is set, its GraceTime
        runs (Slurm's SIGTERM to the steps); ``preempt`` ends it."""
        job = self._running(job_id)
        job.preempt_time = self.clock.now()

    def preempt(self, job_id: int, exit_code: int | None = None, *, requeue: bool = False) -> None:
        """A higher-priority job takes the running job's nodes now, after its GraceTime: Slurm ends
        it PREEMPTED (PreemptMode=CANCEL), with the trainer's ``exit_code`` when it exited within
        the grace time, or requeues a requeueable job (``requeue``: PreemptMode=REQUEUE)."""
        job = self._running(job_id)
        if requeue and job.requeueable:
            self._state.requeue(job)
        else:
            self._state.finish(job, JobState.PREEMPTED, exit_code=exit_code, reason="Preempted", everywhere=True)
        self._state.schedule()

    def _running(self, job_id: int) -> SimJob:
        job = self._job(job_id)
        if job.state is not JobState.RUNNING or job.execution is None:
            raise ValueError(f"job {job_id} is not running ({job.state})")
        return job

    def job_request(self, job_id: int) -> SubmitRequest:
        """What the job was submitted with (its environment reaches the simulated trainer)."""
        return self._job(job_id).request

    def health_check_drain(self, name: str, reason: str) -> None:
        """Slurm's HealthCheckProgram (NHC) found the node bad: DRAIN it (its job keeps running)."""
        node = self._node(name)
        if not node.drain:
            self._state.drain(node, reason)

    def repair_node(self, name: str) -> None:
        """The node is repaired and back: slurmd up, and an operator resumes it if it is DOWN or
        drained (whoever did that)."""
        node = self._node(name)
        if not node.slurmd_up:
            self._state.restore(node)
        if node.down or node.drain:
            self._state.resume(node)
        self._state.schedule()

    # -- Accounting port (sacct: slurmdbd keeps the jobs squeue forgets after min_job_age) -------

    def job_records(self, job_ids: Iterable[int]) -> dict[int, JobInfo]:
        """Every job ever submitted here, purged or not, as its latest state; TransientError while
        ``slurmdbd_down`` (the controller's state does not matter: sacct asks slurmdbd)."""
        ids = tuple(sorted(set(job_ids)))
        call: Call = ("job_records", ids)
        self.calls.append(call)
        if self._slurmdbd_down:
            self.failed_calls.append(call)
            raise TransientError("sacct: Problem talking to the database: Connection refused")
        return {j: self._archive[j].info() for j in ids if j in self._archive}

    def slurmdbd_down(self, down: bool = True) -> None:
        self._slurmdbd_down = down

    def controller_down(self, down: bool = True) -> None:
        """While down, every port call raises TransientError (the cluster itself carries on)."""
        self._controller_down = down

    @property
    def controller_is_down(self) -> bool:
        return self._controller_down

    def on_incarnation(self, listener: IncarnationListener) -> None:
        """Call ``listener(kind, incarnation)`` with kind "start" or "end" as copies run/stop."""
        self._state.listeners.append(listener)

    # -- inspection (not port calls: not logged, work while the controller is down) -------------

    def inspect(self) -> ClusterSnapshot:
        state = self._state
        return ClusterSnapshot(
            taken_at=self.clock.now(),
            jobs={job_id: job.info() for job_id, job in state.jobs.items()},
            nodes=self._node_map(),
        )

    def _node_map(self) -> Mapping[str, NodeInfo]:
        """All nodes' info, rebuilt only when a node changed (read-only: shared between snapshots)."""
        if self._nodes_seen != SimNode.changes or self._nodes_cache is None:
            self._nodes_cache = MappingProxyType({name: node.info() for name, node in self._state.nodes.items()})
            self._nodes_seen = SimNode.changes
        return self._nodes_cache

    def dead_slurmds(self, names: Iterable[str]) -> set[str]:
        """Of ``names``, the nodes whose slurmd refuses a connection: crashed. A frozen (hung)
        slurmd's port still accepts — the kernel completes the handshake — so, like the real TCP
        probe, it is not among them; Slurm's NOT_RESPONDING or the agents' heartbeats catch it."""
        nodes = self._state.nodes
        return {name for name in names if name in nodes and not nodes[name].slurmd_up and not nodes[name].frozen}

    def job_info(self, job_id: int) -> JobInfo:
        return self._job(job_id).info()

    def node_info(self, name: str) -> NodeInfo:
        return self._node(name).info()

    def slurmd_status(self, name: str) -> tuple[bool, bool]:
        """The truth a direct probe of the node's slurmd would see: (slurmd up, node frozen)."""
        node = self._node(name)
        return node.slurmd_up, node.frozen

    @property
    def node_names(self) -> tuple[str, ...]:
        return tuple(self._state.nodes)

    @property
    def incarnation_log(self) -> list[Incarnation]:
        """Every launched copy, in launch order, with ``end`` None while any process still runs."""
        return [exe.freeze() for exe in self._state.executions]

    @property
    def incarnations(self) -> dict[str, frozenset[tuple[int, int]]]:
        """Per node, the (job_id, restart_count) copies whose processes execute there now."""
        return {
            name: frozenset(exe.key for exe in node.procs) for name, node in self._state.nodes.items() if node.procs
        }

    def executing(self, job_id: int) -> frozenset[int]:
        """The restart counts of ``job_id`` that have processes running somewhere right now."""
        return frozenset(
            exe.restart_count for exe in self._state.executions if exe.job_id == job_id and exe.end is None
        )

    def overlapping_incarnations(self) -> list[tuple[Incarnation, Incarnation]]:
        """Pairs of copies of the same job that executed at the same time (should be none)."""
        by_job: dict[int, list[Incarnation]] = {}
        for inc in self.incarnation_log:
            by_job.setdefault(inc.job_id, []).append(inc)
        pairs: list[tuple[Incarnation, Incarnation]] = []
        for runs in by_job.values():
            for i, first in enumerate(runs):
                pairs.extend((first, later) for later in runs[i + 1 :] if first.overlaps(later))
        return pairs

    def count_calls(self, method: str, *, include_failed: bool = False) -> int:
        """How many ``method`` port calls were made (by default only the accepted ones)."""
        total = sum(1 for call in self.calls if call[0] == method)
        if include_failed:
            return total
        return total - sum(1 for call in self.failed_calls if call[0] == method)

    # -- helpers --------------------------------------------------------------------------------

    @contextmanager
    def _call(self, method: str, *args: object) -> Iterator[None]:
        call: Call = (method, *args)
        self.calls.append(call)
        try:
            if self._controller_down:
                raise TransientError("Unable to contact slurm controller (connect failure)")
            yield
        except PortError:
            self.failed_calls.append(call)
            raise

    def _job(self, job_id: int) -> SimJob:
        job = self._state.jobs.get(job_id)
        if job is None:
            raise PermanentError(f"job {job_id}: Invalid job id specified")
        return job

    def _unfinished(self, job_id: int) -> SimJob:
        job = self._job(job_id)
        if job.state.finished:
            raise PermanentError(f"job {job_id}: Job/step already completing or completed")
        return job

    def _node(self, name: str) -> SimNode:
        node = self._state.nodes.get(name)
        if node is None:
            raise PermanentError(f"node {name}: Invalid node name specified")
        return node

    def _in_node_order(self, names: Sequence[str]) -> tuple[str, ...]:
        """Slurm reports node lists as hostlists: in the partition's node order."""
        order = {name: i for i, name in enumerate(self._state.nodes)}
        return tuple(sorted(set(names), key=lambda n: order.get(n, len(order))))

    def _check_names(self, names: Sequence[str]) -> None:
        for name in names:
            self._node(name)

    def _check_submit(self, request: SubmitRequest) -> None:
        members = self._state.partitions.get(request.partition)
        if members is None:
            raise PermanentError(f"invalid partition specified: {request.partition}")
        if not 1 <= request.nodes <= len(members):
            raise PermanentError("Requested node configuration is not available")
        self._check_names(request.exclude)
        self._check_fits(request.partition, request.nodes, request.exclude)

    def _check_fits(self, partition: str, nodes: int, exclude: Sequence[str]) -> None:
        """sbatch refuses a job that its partition could never hold once the excluded nodes are
        taken out, whatever the nodes' state (Slurm 22.05; ``scontrol update ExcNodeList`` accepts
        such a list and leaves the job pending: the supervisor never sends one)."""
        members = {n.name for n in self._state.partitions.get(partition, ())}
        if len(members - set(exclude)) < nodes:
            raise PermanentError("Requested node configuration is not available")
