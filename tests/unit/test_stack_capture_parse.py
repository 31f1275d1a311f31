"""The capture step's argv and the parser of its labelled output (adapters/slurm/stack_capture)."""

from __future__ import annotations

import json

from supervisor.adapters.slurm.stack_capture import CaptureSettings, capture_argv, parse_capture


def line(task: int, obj: dict[str, object], width: int = 1) -> bytes:
    return f"{task:>{width}}: ".encode() + json.dumps(obj).encode()


def proc(node: str, rank: int, name: str = "all_reduce") -> dict[str, object]:
    frames = [[name, "torch/distributed/distributed_c10d.py", 10]]
    return {"node": node, "rank": rank, "pid": 1000 + rank, "threads": [{"name": "MainThread", "main": True, "frames": frames}]}  # fmt: skip


def closing(node: str, error: str | None = None) -> dict[str, object]:
    return {"node": node, "closing": True, "processes": 1, "error": error}


def test_the_argv_is_one_overlapping_labelled_task_per_node():
    argv = capture_argv(CaptureSettings(deadline_s=25, agent=("py", "-m", "a"), py_spy="/opt/py-spy"), 42, ["n1", "n2"])
    assert argv[:11] == [
        "srun", "--job-name=ssv-stacks", "--jobid=42", "--overlap", "--nodes=2", "--ntasks=2",
        "--ntasks-per-node=1", "--nodelist=n[1-2]", "--label", "--kill-on-bad-exit=0", "--quiet",
    ]  # fmt: skip
    assert argv[11:] == ["py", "-m", "a", "--job", "42", "--timeout", "20", "--py-spy", "/opt/py-spy"]
    assert capture_argv(CaptureSettings(native=True), 1, ["n1"])[-1] == "--native"


def test_ranks_come_with_the_node_their_task_ran_on_whatever_the_task_order():
    # srun numbers tasks in its node order, which need not be the job's: the agent names its node
    out = b"\n".join(
        [line(1, proc("n1", 0)), line(0, proc("n2", 1)), line(1, closing("n1")), line(0, closing("n2")), b""]
    )
    cap = parse_capture(out, ["n1", "n2"], 1.5)
    assert [(d.rank, d.node) for d in cap.dumps] == [(0, "n1"), (1, "n2")]
    assert cap.missing == {} and cap.dropped == 0 and cap.took_s == 1.5


def test_padded_labels_and_a_node_that_never_closed():
    out = b"\n".join([line(3, proc("n4", 7), width=2), line(3, closing("n4"), width=2)])
    cap = parse_capture(out, ["n1", "n4"], 25.0, None)
    assert [d.rank for d in cap.dumps] == [7]
    assert cap.missing == {"n1": "no answer before the deadline"}
    failed = parse_capture(b"", ["n1"], 0.1, "srun: No such file or directory")
    assert failed.missing == {"n1": "srun: No such file or directory"} and failed.error


def test_a_node_that_says_why_it_has_no_stacks():
    out = line(0, closing("n1", "ptrace refused (kernel.yama.ptrace_scope 3): Permission denied"))
    cap = parse_capture(out, ["n1"], 0.3)
    assert cap.missing == {"n1": "ptrace refused (kernel.yama.ptrace_scope 3): Permission denied"}


def test_lines_for_other_nodes_twice_claimed_nodes_and_repeated_ranks_are_dropped():
    out = b"\n".join(
        [
            line(0, proc("n1", 0)),
            line(0, proc("n2", 1)),  # task 0 already spoke for n1
            line(1, proc("n1", 2)),  # n1 is task 0's
            line(2, proc("elsewhere", 3)),  # not a node of the job
            line(0, proc("n1", 0)),  # rank 0 again
            b"garbage without a label",
            line(0, closing("n1")),
        ]
    )
    cap = parse_capture(out, ["n1", "n2"], 1.0)
    assert [d.rank for d in cap.dumps] == [0] and cap.dropped == 5
    assert cap.missing == {"n2": "no answer before the deadline"}
