"""Property-based fuzzing of the two config loaders a person (or an attacker) hands the supervisor:
the run spec (``load_run_file``) and the daemon config (``load_daemon_config``). Whatever the file
holds — valid TOML of every shape, with the real section and key names and hostile values, or
arbitrary text and bytes — loading ends within a second with a loaded config or a ``ConfigError``;
nothing else escapes (issue 17, "Must show": 0 crashes, 0 hangs). Deterministic (derandomized), so
CI sees the same examples on every run."""

from __future__ import annotations

import json
import math
import signal
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import date, datetime, time
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import BaseModel

from supervisor.config import ConfigError, DaemonConfig, RunFile, load_daemon_config, load_run_file

FUZZ = settings(
    max_examples=250,
    deadline=None,  # the alarm below bounds each example instead (a hang fails it, slowness alone does not)
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
HANG_S = 5


@contextmanager
def no_hang(seconds: int = HANG_S) -> Iterator[None]:
    def expired(signum: int, frame: object) -> None:
        raise TimeoutError(f"loading took over {seconds} s")

    previous = signal.signal(signal.SIGALRM, expired)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


# ------------------------------------------------------------------ a small TOML writer


def toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf") if math.isinf(value) else repr(value)
    if isinstance(value, int):
        return str(value)
    if isinstance(value, str):
        return json.dumps(value, ensure_ascii=False)
    if isinstance(value, (datetime, date, time)):
        return value.isoformat()
    if isinstance(value, list):
        return "[" + ", ".join(toml_value(v) for v in value) + "]"
    return "{ " + ", ".join(f"{json.dumps(k, ensure_ascii=False)} = {toml_value(v)}" for k, v in value.items()) + " }"


def toml_document(sections: dict[str, Any]) -> str:
    lines: list[str] = []
    for name, body in sections.items():
        if not isinstance(body, dict):
            lines.insert(0, f"{json.dumps(name, ensure_ascii=False)} = {toml_value(body)}")
            continue
        lines.append(f"[{json.dumps(name, ensure_ascii=False)}]")
        lines += [f"{json.dumps(k, ensure_ascii=False)} = {toml_value(v)}" for k, v in body.items()]
    return "\n".join(lines) + "\n"


# ------------------------------------------------------------------ what the files hold


def schema(model: type[BaseModel]) -> dict[str, list[str]]:
    """Each section of a file model and its keys."""
    out: dict[str, list[str]] = {}
    for name, field in model.model_fields.items():
        annotation = field.annotation
        inner = [a for a in getattr(annotation, "__args__", (annotation,)) if isinstance(a, type)]
        section = next((a for a in inner if issubclass(a, BaseModel)), None)
        out[name] = list(section.model_fields) if section is not None else []
    return out


HOSTILE_TEXT = st.sampled_from(
    [
        "",
        " ",
        ".",
        "..",
        "/",
        "~",
        "t.sh",
        "/dev/null",
        "/proc/self/fd/0",
        "/var/lib/slurm-supervisor/supervisor.db",
        "/etc/slurm-supervisor/hook.token",
        "%j%N%%%",
        "-vxgpu-[001-002]",
        "--wait",
        "--",
        "-",
        "gpu-[",
        "gpu-[1-99999999]",
        "s3://",
        "s3:///x",
        "http://x",
        "named",
        "partition-idle",
        "requeue",
        "resubmit",
        "\x00",
        "\x1b]0;x\x07",
        "a" * 5000,
        "PATH",
        "LD_PRELOAD",
    ]
)
LEAVES = st.one_of(
    HOSTILE_TEXT,
    st.text(max_size=40),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.sampled_from([0, 1, -1, 2**63 - 1, 2**63, -(2**63) - 1]),
    st.floats(allow_nan=True, allow_infinity=True),
    st.booleans(),
    st.datetimes(),
    st.dates(),
)
VALUES = st.recursive(
    LEAVES,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4), st.dictionaries(st.one_of(HOSTILE_TEXT, st.text(max_size=8)), inner, max_size=3)
    ),
    max_leaves=8,
)


def documents(model: type[BaseModel]) -> st.SearchStrategy[dict[str, Any]]:
    """Files with the model's real sections and keys (and some made up), holding hostile values."""
    shape = schema(model)
    section_names = st.one_of(st.sampled_from(sorted(shape)), st.text(min_size=1, max_size=8))

    def section(name: str) -> st.SearchStrategy[Any]:
        keys = st.one_of(st.sampled_from(shape.get(name) or ["x"]), st.text(min_size=1, max_size=8))
        return st.one_of(st.dictionaries(keys, VALUES, max_size=8), VALUES)

    return st.dictionaries(section_names, st.just(None), max_size=5).flatmap(
        lambda names: st.fixed_dictionaries({n: section(n) for n in names})
    )


def a_run_spec() -> st.SearchStrategy[dict[str, Any]]:
    """Mostly loadable run specs, so validation goes past the first missing key."""
    base = {"name": st.just("r1"), "script": st.just("t.sh"), "partition": st.just("gpu"), "nodes": st.just(2)}
    run = st.fixed_dictionaries(base, optional=dict.fromkeys(set(schema(RunFile)["run"]) - set(base), VALUES))
    return st.tuples(run, documents(RunFile)).map(lambda pair: {**pair[1], "run": pair[0]})


# ------------------------------------------------------------------ the properties


@pytest.fixture(scope="module")
def folder() -> Iterator[Path]:
    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "t.sh").write_text("#!/bin/sh\n#SBATCH --time=1:00:00\nsrun true\n")
        yield Path(tmp)


def load(loader: Any, folder: Path, data: bytes) -> None:
    path = folder / "fuzzed.toml"
    path.write_bytes(data)
    with no_hang():
        try:
            loaded = loader(path)
        except ConfigError as error:
            assert str(error).strip(), "a ConfigError without a message"
            return
    if isinstance(loaded, RunFile):
        loaded.to_run_spec()


@FUZZ
@given(doc=a_run_spec())
def test_run_specs_of_every_shape_load_or_raise_a_config_error(folder, doc):
    load(load_run_file, folder, toml_document(doc).encode())


@FUZZ
@given(doc=documents(RunFile))
def test_run_specs_with_any_sections_load_or_raise_a_config_error(folder, doc):
    load(load_run_file, folder, toml_document(doc).encode())


@FUZZ
@given(doc=documents(DaemonConfig))
def test_daemon_configs_of_every_shape_load_or_raise_a_config_error(folder, doc):
    load(load_daemon_config, folder, toml_document(doc).encode())


@settings(FUZZ, max_examples=150)
@given(data=st.one_of(st.binary(max_size=300), st.text(max_size=300).map(str.encode)))
def test_arbitrary_bytes_never_crash_either_loader(folder, data):
    load(load_run_file, folder, data)
    load(load_daemon_config, folder, data)


def test_the_fuzzer_reaches_valid_files(folder):
    """The strategies are not all noise: a plain document of theirs loads."""
    doc = {"run": {"name": "r1", "script": "t.sh", "partition": "gpu", "nodes": 2, "env": {"A": "a,b"}}}
    (folder / "ok.toml").write_text(toml_document(doc))
    assert load_run_file(folder / "ok.toml").run.env == {"A": "a,b"}


@pytest.mark.parametrize("key", ["workdir", "script", "output"])
@pytest.mark.parametrize("path", ["x" * 300, "/".join(["y" * 200] * 25)])
def test_a_path_longer_than_the_system_takes_is_a_config_error(folder, key, path):
    """A name over NAME_MAX (255) or a path over PATH_MAX (4096) made the folder checks raise
    ENAMETOOLONG out of the loader (found by the fuzzer above)."""
    run = {"name": "r1", "script": "t.sh", "partition": "gpu", "nodes": 2, key: path}
    data = toml_document({"run": run}).encode()
    (folder / "long.toml").write_bytes(data)
    with pytest.raises(ConfigError, match="longer than"):
        load_run_file(folder / "long.toml")
