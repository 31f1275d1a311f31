"""Mutation testing of the pure decision modules with cosmic-ray: how many changes to the code the
fast unit tests notice.

    .venv/bin/python bench/mutation.py [--all] [--seed N] [--workers 2] [--module NAME ...]

bench/mutation.toml names each scored module's files (optionally only some functions), the unit
tests that run against its mutants, and how many mutants a default run draws (uniformly, with
``--seed``); ``--all`` runs every mutant. bench/mutation_equivalents.toml lists mutants no test
can tell from the original, with why; mutants inside annotations (unevaluated under ``from
__future__ import annotations``) and ``is Enum.X`` made ``== Enum.X`` are equivalent by class.
Equivalent mutants are neither drawn nor counted (``equivalent`` in the JSON says how many).

cosmic-ray (``cosmic_ray.commands.init``) enumerates the mutants with its core operators and
``cosmic_ray.mutating.mutate_and_test`` applies one to a file on disk, runs the tests and puts the
file back. Since it writes the file, it works on private copies of ``supervisor/`` and ``tests/``
in a temporary folder (one per worker), never on the working tree. Before any mutant, each
module's tests must pass on the unmutated copy; each mutant gets 4× that time (a timeout counts
as killed, as in cosmic-ray).

Goal: score (killed / mutants run) >= 0.90 overall and >= 0.85 per module, in <= 20 minutes on
2 cores. Last line: one JSON object (``score``, ``mutants``, ``killed``, ``survived``,
``by_module``, ``equivalent``, ``wall_s``, ``seed``, ``sampled``).
"""

from __future__ import annotations

import argparse
import ast
import compileall
import json
import multiprocessing
import os
import py_compile
import random
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
import tomllib
from collections.abc import Iterable, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import cosmic_ray.plugins
from cosmic_ray.commands import init as cr_init
from cosmic_ray.mutating import mutate_and_test, mutate_code
from cosmic_ray.work_db import use_db
from cosmic_ray.work_item import MutationSpec, TestOutcome, WorkerOutcome

REPO = Path(__file__).resolve().parent.parent
CONFIG = REPO / "bench" / "mutation.toml"
EQUIVALENTS = REPO / "bench" / "mutation_equivalents.toml"
DEFAULT_SEED = 20261201
MIN_TIMEOUT_S = 20.0


@dataclass(frozen=True)
class Module:
    name: str
    files: tuple[str, ...]
    definitions: frozenset[str]
    tests: tuple[str, ...]
    sample: int


@dataclass(frozen=True)
class Equivalent:
    file: str
    line: str  # the mutated line's text, stripped
    operator: str
    why: str
    mutated: str | None = None  # the mutated line's text, where one operator changes a line in several ways


@dataclass(frozen=True)
class Outcome:
    module: str
    where: str  # file:line operator
    killed: bool
    diff: str


def load_modules(path: Path) -> list[Module]:
    doc = tomllib.loads(path.read_text())
    return [
        Module(
            name,
            tuple(m["files"]),
            frozenset(m.get("definitions", ())),
            tuple(m["tests"]),
            int(m.get("sample", 40)),
        )
        for name, m in doc["module"].items()
    ]


def load_equivalents(path: Path) -> list[Equivalent]:
    doc = tomllib.loads(path.read_text()) if path.exists() else {}
    return [
        Equivalent(e["file"], e["line"].strip(), e["operator"], e["why"], e.get("mutated"))
        for e in doc.get("equivalent", [])
    ]


# ---------------------------------------------------------------------------- copies and tests


def make_copy(dest: Path) -> Path:
    """A private copy of the package and its tests; bytecode checked by hash, so a mutant written
    in the same second as the original is never served from a stale .pyc."""
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", ".hypothesis", ".pytest_cache")
    shutil.copytree(REPO / "supervisor", dest / "supervisor", ignore=ignore)
    shutil.copytree(REPO / "tests", dest / "tests", ignore=ignore)
    shutil.copy2(REPO / "pyproject.toml", dest / "pyproject.toml")
    compileall.compile_dir(dest / "supervisor", quiet=1, invalidation_mode=py_compile.PycInvalidationMode.CHECKED_HASH)
    return dest


def test_argv(tests: Sequence[str]) -> list[str]:
    # --noconftest: the decision modules' unit tests need none of the Slurm fixtures, and skipping
    # tests/conftest.py (it imports the whole engine) saves ~40% of each mutant's run.
    return [
        sys.executable,
        "-m",
        "pytest",
        "-x",
        "-q",
        "-p",
        "no:cacheprovider",
        "--noconftest",
        "-m",
        "not slow",
        *tests,
    ]


def existing_tests(module: Module) -> tuple[str, ...]:
    return tuple(t for t in module.tests if (REPO / t).exists())


def baseline(copy: Path, module: Module, tests: Sequence[str]) -> float:
    """Seconds the module's tests take on the unmutated copy, run the way every mutant's are (a
    cosmic-ray no-op mutant): exits unless they pass there, or when the copy would import the
    package from anywhere but itself."""
    where = subprocess.run(
        [sys.executable, "-c", "import supervisor; print(supervisor.__file__)"],
        cwd=copy,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    if not where.startswith(str(copy)):
        sys.exit(f"the copy imports supervisor from {where}, not from {copy}")
    noop = MutationSpec(Path(module.files[0]), "core/NoOp", 0, (1, 0), (1, 1))
    start = time.monotonic()
    os.chdir(copy)
    try:
        result = mutate_and_test([noop], shlex.join(test_argv(tests)), 600.0)
    finally:
        os.chdir(REPO)
    if result.test_outcome is not TestOutcome.SURVIVED:
        sys.exit(
            f"{module.name}: tests fail without any mutation ({' '.join(tests)}):\n{(result.output or '')[-3000:]}"
        )
    return time.monotonic() - start


# ---------------------------------------------------------------------------- mutants


def mutants_of(module: Module, copy: Path, session: Path) -> list[MutationSpec]:
    """Every mutant of the module's files (paths relative to a copy), in a stable order."""
    with use_db(str(session)) as db:
        cr_init([Path(f) for f in module.files], db, {})
        specs = [m for item in db.work_items for m in item.mutations]
    if module.definitions:
        specs = [m for m in specs if m.definition_name in module.definitions]
    return sorted(specs, key=lambda m: (str(m.module_path), m.start_pos, m.operator_name, m.occurrence))


Span = tuple[tuple[int, int], tuple[int, int]]


def annotation_spans(source: str) -> list[Span]:
    """Where a module's annotations are, when ``from __future__ import annotations`` keeps them
    unevaluated (PEP 563): no behaviour depends on them, so no mutant inside one can be killed.
    (Found with ``ast`` to classify cosmic-ray's mutants; nothing is mutated here.)"""
    tree = ast.parse(source)
    future = any(
        isinstance(n, ast.ImportFrom) and n.module == "__future__" and any(a.name == "annotations" for a in n.names)
        for n in tree.body
    )
    if not future:
        return []
    found: list[ast.expr] = []
    for n in ast.walk(tree):
        if isinstance(n, ast.arg) and n.annotation is not None:
            found.append(n.annotation)
        elif isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef) and n.returns is not None:
            found.append(n.returns)
        elif isinstance(n, ast.AnnAssign):
            found.append(n.annotation)
    return [((a.lineno, a.col_offset), (a.end_lineno or a.lineno, a.end_col_offset or 0)) for a in found]


def in_annotation(spec: MutationSpec, spans: Sequence[Span]) -> bool:
    return any(start <= tuple(spec.start_pos) < end for start, end in spans)


IDENTITY_TO_EQUALITY = ("core/ReplaceComparisonOperator_Is_Eq", "core/ReplaceComparisonOperator_IsNot_NotEq")
ENUM_MEMBER = re.compile(r"\s*[A-Z]\w*\.[A-Z][A-Z0-9_]*\b")


def enum_identity(spec: MutationSpec, line: str) -> bool:
    """``x is Enum.MEMBER`` made ``x == Enum.MEMBER`` (or ``is not`` made ``!=``): members are
    singletons, so identity and equality agree for every value the typed code can hold."""
    return spec.operator_name in IDENTITY_TO_EQUALITY and ENUM_MEMBER.match(line[spec.end_pos[1] :]) is not None


def raw_line(copy: Path, spec: MutationSpec) -> str:
    return (copy / spec.module_path).read_text().splitlines()[spec.start_pos[0] - 1]


def line_of(copy: Path, spec: MutationSpec) -> str:
    return raw_line(copy, spec).strip()


def equivalent(copy: Path, spec: MutationSpec, known: Iterable[Equivalent]) -> Equivalent | None:
    text = line_of(copy, spec)
    for e in known:
        same = e.file == str(spec.module_path) and e.operator == spec.operator_name and e.line == text
        if same and (e.mutated is None or mutated_line(copy, spec) == e.mutated.strip()):
            return e
    return None


def mutated_line(copy: Path, spec: MutationSpec) -> str:
    """The mutant's version of its line (cosmic-ray applies it to the source text, not the file)."""
    operator = cosmic_ray.plugins.get_operator(spec.operator_name)(**spec.operator_args)
    code = mutate_code((copy / spec.module_path).read_text(), operator, spec.occurrence) or ""
    lines = code.splitlines()
    return lines[spec.start_pos[0] - 1].strip() if len(lines) >= spec.start_pos[0] else ""


def _claim_copy(copies: multiprocessing.Queue[str]) -> None:
    os.chdir(copies.get())  # each worker mutates its own copy: paths in the specs are relative


def _run_one(module: str, spec: MutationSpec, tests: tuple[str, ...], timeout: float) -> Outcome:
    result = mutate_and_test([spec], shlex.join(test_argv(tests)), timeout)
    where = f"{spec.module_path}:{spec.start_pos[0]} {spec.operator_name}"
    if result.worker_outcome is WorkerOutcome.NO_TEST:
        return Outcome(module, where, True, "(no mutation possible)")
    survived = result.test_outcome is TestOutcome.SURVIVED
    changed = [ln for ln in (result.diff or "").splitlines() if ln[:1] in "+-" and ln[:3] not in ("+++", "---")]
    return Outcome(module, where, not survived, " | ".join(changed))


# ---------------------------------------------------------------------------- report


def score(outcomes: Sequence[Outcome]) -> float | None:
    return round(sum(o.killed for o in outcomes) / len(outcomes), 3) if outcomes else None


def report(modules: Sequence[Module], outcomes: Sequence[Outcome], equiv: dict[str, int]) -> dict[str, float | None]:
    print(f"\n{'module':<12}{'mutants':>9}{'killed':>8}{'survived':>10}{'equivalent':>12}{'score':>8}")
    by_module: dict[str, float | None] = {}
    for m in modules:
        mine = [o for o in outcomes if o.module == m.name]
        by_module[m.name] = score(mine)
        killed = sum(o.killed for o in mine)
        shown = f"{by_module[m.name]:.3f}" if by_module[m.name] is not None else "-"
        print(f"{m.name:<12}{len(mine):>9}{killed:>8}{len(mine) - killed:>10}{equiv.get(m.name, 0):>12}{shown:>8}")
    survivors = [o for o in outcomes if not o.killed]
    if survivors:
        print("\nsurvivors:")
        for o in sorted(survivors, key=lambda o: o.where):
            print(f"  [{o.module}] {o.where}: {o.diff[:200]}")
    return by_module


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--all", action="store_true", help="every mutant, not a sample")
    ap.add_argument("--seed", type=int, default=DEFAULT_SEED)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--module", action="append", help="only this module (repeatable)")
    ap.add_argument("--config", type=Path, default=CONFIG)
    ap.add_argument("--equivalents", type=Path, default=EQUIVALENTS)
    args = ap.parse_args(argv)
    start = time.monotonic()
    modules = [m for m in load_modules(args.config) if not args.module or m.name in args.module]
    known = load_equivalents(args.equivalents)
    rng = random.Random(args.seed)
    with tempfile.TemporaryDirectory(prefix="mutation-") as tmp:
        copies = [make_copy(Path(tmp) / f"w{i}") for i in range(args.workers)]
        jobs: list[tuple[str, MutationSpec, tuple[str, ...], float]] = []
        equiv: dict[str, int] = {}
        for m in modules:
            tests = existing_tests(m)
            if not tests:
                sys.exit(f"{m.name}: none of its tests exist ({', '.join(m.tests)})")
            took = baseline(copies[0], m, tests)
            os.chdir(copies[0])
            specs = mutants_of(m, copies[0], Path(tmp) / f"{m.name}.sqlite")
            os.chdir(REPO)
            spans = {f: annotation_spans((copies[0] / f).read_text()) for f in m.files}
            live = [
                s
                for s in specs
                if not in_annotation(s, spans[str(s.module_path)])
                and not enum_identity(s, raw_line(copies[0], s))
                and equivalent(copies[0], s, known) is None
            ]
            equiv[m.name] = len(specs) - len(live)
            drawn = live if args.all or len(live) <= m.sample else rng.sample(live, m.sample)
            print(f"{m.name}: {len(specs)} mutants, {equiv[m.name]} equivalent, {len(drawn)} drawn; tests {took:.1f} s")
            jobs += [(m.name, s, tests, max(MIN_TIMEOUT_S, 4 * took)) for s in drawn]
        outcomes = run_all(jobs, copies)
    by_module = report(modules, outcomes, equiv)
    killed = sum(o.killed for o in outcomes)
    figures = {
        "score": score(outcomes),
        "mutants": len(outcomes),
        "killed": killed,
        "survived": len(outcomes) - killed,
        "by_module": by_module,
        "equivalent": sum(equiv.values()),
        "sampled": not args.all,
        "seed": args.seed,
        "wall_s": round(time.monotonic() - start, 1),
    }
    print(json.dumps(figures))
    return 0


def run_all(jobs: Sequence[tuple[str, MutationSpec, tuple[str, ...], float]], copies: Sequence[Path]) -> list[Outcome]:
    ctx = multiprocessing.get_context("fork")
    queue: multiprocessing.Queue[str] = ctx.Queue()
    for c in copies:
        queue.put(str(c))
    outcomes: list[Outcome] = []
    with ProcessPoolExecutor(len(copies), mp_context=ctx, initializer=_claim_copy, initargs=(queue,)) as pool:
        futures = [pool.submit(_run_one, *job) for job in jobs]
        for i, f in enumerate(futures, 1):
            outcomes.append(f.result())
            if i % 25 == 0 or i == len(futures):
                print(f"  {i}/{len(futures)} mutants run", flush=True)
    return outcomes


if __name__ == "__main__":
    sys.exit(main())
