"""The validation a node runs before the supervisor lets a run use it again (domain/health/validation.py
says what passes). The validation job runs it in the node's maintenance reservation, one task on
the node under validation (rank 0) and one on each of two known-good peers (ranks 1 and 2):

1. the one-shot check (``oneshot.check_once``: NVML, bounded, never hangs);
2. a burn-in: ``dcgmi diag -r LEVEL`` where ``dcgmi`` exists, and a CPU/memory stand-in everywhere
   (float64 matrix products for ``burn_s`` seconds, GFLOP/s); rank 0's figure is compared with the
   peer's, measured alongside on the same work;
3. a collective with a known-good peer: ``all_reduce`` of ``collective_mb`` MB over
   torch.distributed (NCCL with GPUs, gloo here) between rank 0 and rank 1, bus bandwidth in GB/s,
   compared with the same collective between the two good peers (ranks 1 and 2), measured right
   after on the same fabric; or, in a job of two tasks, with ``--peers-gbps`` (the fleet's figure
   for a good pair, handed in by the daemon). Without either there is nothing to compare with, and
   ``errors`` says so.

Every step has its own time bound; a step that fails says why in ``errors`` (the verdict then
fails on it). Rank 0 prints one JSON object: ``ValidationFigures.to_json()``.

``python -P -m supervisor.agent.validate --node NODE --burn-s 20 --collective-mb 64`` under ``srun
-N3 --ntasks-per-node=1``: the task on NODE (``SLURMD_NODENAME``) is the node under validation,
wherever Slurm ranked it, the others its good peers. The rendezvous comes from
``MASTER_ADDR``/``MASTER_PORT`` (or srun's ``SLURM_LAUNCH_NODE_IPADDR``, the batch host that runs
the first task), ``RANK``/``WORLD_SIZE`` (or ``SLURM_PROCID``/``SLURM_NTASKS``).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass

from supervisor.agent.oneshot import check_once, node_name
from supervisor.domain.health.findings import Severity
from supervisor.domain.health.validation import ValidationFigures

BURN_SIZE = 256  # matrix side: small enough for any node's cache-starved CPU, big enough to be compute-bound
DCGM_TIMEOUT_S = {1: 120.0, 2: 600.0, 3: 1800.0, 4: 3600.0}


@dataclass(frozen=True)
class Options:
    burn_s: float = 20.0
    collective_mb: int = 64
    collective_rounds: int = 5
    peers_gbps: float | None = None
    dcgm_level: int = 2
    oneshot_timeout_s: float = 10.0
    rendezvous_timeout_s: float = 180.0  # tasks start together, but torch imports slowly on a busy node
    node: str = ""  # the node under validation (SLURMD_NODENAME); empty: rank 0's


def oneshot_findings(timeout_s: float) -> tuple[tuple[str, ...], str | None]:
    """Fatal and degraded findings of the one-shot check ("rule: reason"), and why none were read."""
    result = check_once(timeout_s, source="validation")
    bad = tuple(f"{f.rule}: {f.reason}" for f in result.findings if f.severity in (Severity.FATAL, Severity.DEGRADED))
    return bad, result.error if result.report is None and not bad else None


def burn(seconds: float) -> float:
    """GFLOP/s of float64 matrix products for ``seconds`` (the CPU/memory stand-in for a GPU burn)."""
    import numpy as np

    rng = np.random.default_rng(0)
    a, b = rng.random((BURN_SIZE, BURN_SIZE)), rng.random((BURN_SIZE, BURN_SIZE))
    flops, start = 0.0, time.perf_counter()
    while (elapsed := time.perf_counter() - start) < seconds:
        a = (a @ b) / BURN_SIZE  # scaled: the values stay finite however long it runs
        flops += 2.0 * BURN_SIZE**3
    return flops / max(elapsed, 1e-9) / 1e9


def dcgm(level: int) -> tuple[str | None, str | None]:
    """dcgmi diag's overall result ("Pass", "Fail", ...), or None and why it did not run."""
    program = shutil.which("dcgmi")
    if program is None:
        return None, None  # no DCGM on this node: the CPU stand-in alone
    try:
        done = subprocess.run(  # noqa: S603 - fixed argv
            [program, "diag", "-r", str(level), "-j"], capture_output=True, timeout=DCGM_TIMEOUT_S[level], check=False
        )
    except subprocess.TimeoutExpired:
        return "Fail", f"dcgmi diag -r {level} did not finish within {DCGM_TIMEOUT_S[level]:.0f} s"
    return _dcgm_result(done.stdout), None


def _dcgm_result(stdout: bytes) -> str:
    try:
        report = json.loads(stdout)
    except ValueError:
        return "Fail (unreadable dcgmi output)"
    text = json.dumps(report).lower()
    return "Fail" if '"fail"' in text else "Pass"


def collective(group: object, size_mb: int, rounds: int) -> float:
    """Bus bandwidth (GB/s) of all_reduce between a pair (``group``), the median of ``rounds``."""
    import torch
    import torch.distributed as dist

    gpu = torch.cuda.is_available() and dist.get_backend(group) == "nccl"  # type: ignore[arg-type]
    device = torch.device("cuda", 0) if gpu else torch.device("cpu")
    tensor = torch.ones(size_mb * (1 << 20) // 4, dtype=torch.float32, device=device)
    dist.all_reduce(tensor, group=group)  # warm-up: connections made
    times = []
    for _ in range(rounds):
        start = time.perf_counter()
        dist.all_reduce(tensor, group=group)
        if gpu:
            torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    seconds = sorted(times)[len(times) // 2]
    return tensor.numel() * 4 * 2 * (2 - 1) / 2 / seconds / 1e9  # nccl-tests' bus bandwidth for 2 ranks


def pair_bandwidths(rank: int, order: list[int], options: Options) -> tuple[float, float | None]:
    """(the node with peer 1, peer 1 with peer 2) all_reduce bandwidth, each pair in turn; ``order``:
    the ranks as node, peer 1, peer 2. Every rank gets both (gathered); the second is None in a
    world of two."""
    import torch.distributed as dist

    pairs = [order[0:2]] + ([order[1:3]] if len(order) >= 3 else [])
    groups = [dist.new_group(pair) for pair in pairs]  # every rank makes every group
    mine = [0.0, 0.0]
    for i, (pair, group) in enumerate(zip(pairs, groups, strict=True)):
        if rank in pair:
            gbps = collective(group, options.collective_mb, options.collective_rounds)
            mine[i] = gbps if rank == pair[0] else mine[i]
        dist.barrier()
    gathered: list[list[float]] = [[0.0, 0.0]] * len(order)
    dist.all_gather_object(gathered, mine)
    return gathered[order[0]][0], (gathered[order[1]][1] if len(order) >= 3 else None)


def rendezvous(env: Mapping[str, str]) -> tuple[int, int, dict[str, str]]:
    """(rank, world size, the env:// variables) from torchrun's or Slurm's variables."""
    rank = int(env.get("RANK") or env.get("SLURM_PROCID") or 0)
    world = int(env.get("WORLD_SIZE") or env.get("SLURM_NTASKS") or 1)
    # the batch host runs the job's first task; srun names its address (a node name may not resolve)
    addr = (
        env.get("MASTER_ADDR") or env.get("SLURM_LAUNCH_NODE_IPADDR") or _first_node(env.get("SLURM_JOB_NODELIST", ""))
    )
    port = env.get("MASTER_PORT") or str(29400 + int(env.get("SLURM_JOB_ID", "0")) % 1000)
    return (
        rank,
        world,
        {"MASTER_ADDR": addr or "127.0.0.1", "MASTER_PORT": port, "RANK": str(rank), "WORLD_SIZE": str(world)},
    )


def _first_node(nodelist: str) -> str:
    if not nodelist:
        return ""
    import hostlist

    return str(hostlist.expand_hostlist(nodelist)[0])


def validate(options: Options, env: Mapping[str, str]) -> ValidationFigures | None:
    """Run every check; the task on the node under validation (``options.node``, else rank 0)
    returns the figures, the peers None."""
    import torch.distributed as dist

    started = time.monotonic()
    rank, world, rdzv = rendezvous(env)
    os.environ.update(rdzv)
    if world < 2:
        return _alone(options, started)
    from datetime import timedelta

    dist.init_process_group("gloo", timeout=timedelta(seconds=options.rendezvous_timeout_s))
    try:
        names: list[str] = [""] * world
        dist.all_gather_object(names, node_name())
        mine_is = names.index(options.node) if options.node in names else 0  # the rank on the node
        order = [mine_is, *(r for r in range(world) if r != mine_is)]
        checks = _node_checks(options) if rank == mine_is else None
        burns = [0.0] * world
        dist.all_gather_object(burns, burn(options.burn_s))
        gbps, good_pair = pair_bandwidths(rank, order, options)
    finally:
        dist.destroy_process_group()
    if checks is None:
        return None
    findings, dcgm_result, errors = checks
    expected = sorted(burns[r] for r in order[1:])[(world - 1) // 2]  # the peers' median on the same work
    peers = good_pair if good_pair is not None else options.peers_gbps
    if peers is None:
        errors["collective"] = "nothing to compare with: two tasks and no --peers-gbps"
    mine = burns[mine_is]
    return ValidationFigures(
        names[mine_is], findings, mine, expected, dcgm_result, gbps, peers, _since(started), errors
    )


def _node_checks(options: Options) -> tuple[tuple[str, ...], str | None, dict[str, str]]:
    """The one-shot check and dcgmi, on the node under validation only."""
    errors: dict[str, str] = {}
    findings, why = oneshot_findings(options.oneshot_timeout_s)
    if why:
        errors["oneshot"] = why
    dcgm_result, why = dcgm(options.dcgm_level)
    if why:
        errors["dcgm"] = why
    return findings, dcgm_result, errors


def _alone(options: Options, started: float) -> ValidationFigures:
    findings, dcgm_result, errors = _node_checks(options)
    errors["collective"] = "no known-good peer in the validation job (world size 1)"
    mine = burn(options.burn_s)
    return ValidationFigures(node_name(), findings, mine, None, dcgm_result, None, None, _since(started), errors)


def _since(started: float) -> float:
    return round(time.monotonic() - started, 3)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="supervisor.agent.validate", description=__doc__.split("\n\n")[0])
    parser.add_argument("--burn-s", type=float, default=Options.burn_s)
    parser.add_argument("--collective-mb", type=int, default=Options.collective_mb)
    parser.add_argument("--peers-gbps", type=float, default=None, help="a good pair's all_reduce bus bandwidth")
    parser.add_argument("--dcgm-level", type=int, choices=(1, 2, 3, 4), default=Options.dcgm_level)
    parser.add_argument("--node", default="", help="the node under validation (default: rank 0's)")
    args = parser.parse_args(argv)
    options = Options(
        args.burn_s, args.collective_mb, peers_gbps=args.peers_gbps, dcgm_level=args.dcgm_level, node=args.node
    )
    figures = validate(options, os.environ)
    if figures is not None:
        sys.stdout.write(json.dumps(figures.to_json(), sort_keys=True) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
