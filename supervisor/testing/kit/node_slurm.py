"""A stateful fake of the guard's ``NodeSlurm`` (guard/slurm_node_jobs.py): the jobs on each node,
each node's state, the maintenance reservations and reboots, and every call in order. It answers as
the real one does where that matters (a RESUME of a node in service and a duplicate reservation
name are Slurm's errors); the real one runs in tests/slurm/test_guard_slurm.py and
test_guard_remedies_slurm.py. ``read_delay_s`` holds each read of a node's jobs that long: a slow
Slurm widens the window between a decision's reads and its writes, where two guards could race."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field

from supervisor.domain.cluster import JobInfo, JobState, NodeChange
from supervisor.ports import PermanentError


@dataclass
class FakeNodeSlurm:
    jobs: dict[int, JobInfo] = field(default_factory=dict)
    states: dict[str, str] = field(default_factory=dict)  # node -> "DRAIN", "DOWN", "RESUME" (in service)
    reservations: dict[str, tuple[str, str, int]] = field(default_factory=dict)  # name -> (node, user, minutes)
    reboots: list[tuple[str, str]] = field(default_factory=list)  # (node, reason)
    calls: list[str] = field(default_factory=list)
    read_delay_s: float = 0.0
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def run(self, job_id: int, uid: int, *nodes: str) -> None:
        self.jobs[job_id] = JobInfo(job_id=job_id, name="j", state=JobState.RUNNING, nodes=nodes, user_id=uid)

    def jobs_on(self, node: str) -> tuple[JobInfo, ...]:
        time.sleep(self.read_delay_s)
        return tuple(j for j in self.jobs.values() if node in j.nodes)

    def set_node_state(self, node: str, change: NodeChange, reason: str) -> None:
        with self._lock:
            self.calls.append(f"{change.value} {node}")
            if change is NodeChange.RESUME and self.states.get(node, "RESUME") == "RESUME":
                raise PermanentError("scontrol exited 1: slurm_update error: Invalid node state specified")
            self.states[node] = change.value

    def reserve(self, name: str, node: str, user: str, minutes: int) -> None:
        with self._lock:
            self.calls.append(f"reserve {name}")
            if name in self.reservations:
                raise PermanentError("scontrol exited 1: Error creating the reservation: Duplicate reservation name")
            self.reservations[name] = (node, user, minutes)

    def unreserve(self, name: str) -> None:
        with self._lock:
            self.calls.append(f"unreserve {name}")
            self.reservations.pop(name, None)

    def reboot(self, node: str, reason: str) -> None:
        with self._lock:
            self.calls.append(f"reboot {node}")
            self.reboots.append((node, reason))
            self.states[node] = "RESUME"  # nextstate=RESUME, into the reservation
