"""What a node's validation checks before it may be used again, and its verdict. Pure.

A validation job (``agent/validate.py``, run in the node's maintenance reservation) measures three
things and reports them as ``ValidationFigures``:

* the node agent's one-shot check (NVML: XIDs, ECC, row remaps, GPU count): any fatal or degraded
  finding fails;
* a burn-in (DCGM diagnostics at a configured level where ``dcgmi`` exists; a CPU/memory stand-in
  here): its throughput must reach ``burn_min_share`` of the figure expected of a good node (the
  fleet's median for that burn, or the configured floor);
* a collective with a known-good peer (NCCL with GPUs, gloo here): its bandwidth must reach
  ``collective_min_share`` of the peers' median — a short diagnostic can pass while sustained
  collectives fail, the case users of other products ask a gate for.

A figure that could not be measured fails the validation with the reason why ("a validation that
cannot run leaves the node out"), except a collective without any peer when
``collective_required`` is off (a one-node partition), which the verdict names.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class ValidationSettings:
    burn_min_share: float = 0.8  # of a good node's burn throughput
    collective_min_share: float = 0.7  # of the peers' median collective bandwidth
    collective_required: bool = True
    timeout_s: float = 900.0  # the validation job's whole time limit (Slurm --time)
    burn_s: float = 60.0  # how long the burn-in runs
    dcgm_level: int = 2  # dcgmi diag -r LEVEL where dcgmi exists (1 quick, 2 medium, 3 long)

    def __post_init__(self) -> None:
        for name in ("burn_min_share", "collective_min_share"):
            if not 0 < getattr(self, name) <= 1:
                raise ValueError(f"validation {name} must be within (0, 1] (got {getattr(self, name)!r})")
        if self.dcgm_level not in (1, 2, 3, 4):
            raise ValueError(f"validation dcgm_level must be 1 to 4 (got {self.dcgm_level!r})")


@dataclass(frozen=True)
class ValidationFigures:
    """What one validation job measured on one node (None: not measured, ``errors`` says why)."""

    node: str
    oneshot: tuple[str, ...] = ()  # fatal or degraded findings of the one-shot check ("rule: reason")
    burn: float | None = None  # burn-in throughput (GFLOP/s on the CPU stand-in)
    burn_expected: float | None = None  # what a good node reaches
    dcgm: str | None = None  # dcgmi diag's overall result where it ran ("Pass", "Fail", ...)
    collective_gbps: float | None = None
    peers_gbps: float | None = None  # the known-good peers' median for the same collective
    elapsed_s: float = 0.0
    errors: Mapping[str, str] = field(default_factory=dict)  # figure -> why it was not measured

    def to_json(self) -> dict[str, Any]:
        return {
            "node": self.node,
            "oneshot": list(self.oneshot),
            "burn": self.burn,
            "burn_expected": self.burn_expected,
            "dcgm": self.dcgm,
            "collective_gbps": self.collective_gbps,
            "peers_gbps": self.peers_gbps,
            "elapsed_s": self.elapsed_s,
            "errors": dict(self.errors),
        }


@dataclass(frozen=True)
class ValidationVerdict:
    passed: bool
    reasons: tuple[str, ...]  # why it failed; for a pass, what was waived (empty: nothing)
    figures: ValidationFigures

    def summary(self) -> str:
        f = self.figures
        figures = f"burn {_fmt(f.burn)}/{_fmt(f.burn_expected)}, collective {_fmt(f.collective_gbps)}/{_fmt(f.peers_gbps)} GB/s"
        head = "passed" if self.passed else "failed"
        return f"validation {head} in {f.elapsed_s:.0f} s ({figures})" + (
            f": {'; '.join(self.reasons)}" if self.reasons else ""
        )


def judge(f: ValidationFigures, s: ValidationSettings) -> ValidationVerdict:
    """Pass only when every check passed; the reasons name each one that did not."""
    failed = [f"one-shot check: {finding}" for finding in f.oneshot]
    failed += _burn(f, s)
    if f.dcgm is not None and f.dcgm.lower() != "pass":
        failed.append(f"dcgmi diag -r {s.dcgm_level}: {f.dcgm}")
    collective, waived = _collective(f, s)
    failed += collective
    return ValidationVerdict(not failed, tuple(failed) if failed else waived, f)


def _burn(f: ValidationFigures, s: ValidationSettings) -> list[str]:
    if f.burn is None or f.burn_expected is None:
        return [f"burn-in not measured: {f.errors.get('burn', 'no figure')}"]
    if f.burn < s.burn_min_share * f.burn_expected:
        return [f"burn-in {f.burn:.3g} below {s.burn_min_share:.0%} of a good node's {f.burn_expected:.3g}"]
    return []


def _collective(f: ValidationFigures, s: ValidationSettings) -> tuple[list[str], tuple[str, ...]]:
    if f.collective_gbps is None or f.peers_gbps is None:
        why = f.errors.get("collective", "no figure")
        if s.collective_required:
            return [f"collective not measured: {why}"], ()
        return [], (f"collective waived (collective_required = false): {why}",)
    if f.collective_gbps < s.collective_min_share * f.peers_gbps:
        share = s.collective_min_share
        return [f"collective {f.collective_gbps:.3g} GB/s below {share:.0%} of the peers' {f.peers_gbps:.3g} GB/s"], ()
    return [], ()


def _fmt(value: float | None) -> str:
    return "-" if value is None else f"{value:.3g}"
