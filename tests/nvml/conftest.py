"""The stand-in NVML library, built with gcc by the harness, behind the real pynvml."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from supervisor.testing.kit.nvml_standin import NvmlStandin, StandinBuildError, build_standin


def _ci() -> bool:
    return os.environ.get("CI", "").strip().lower() == "true"


@pytest.fixture(scope="session")
def standin_library(tmp_path_factory: pytest.TempPathFactory) -> Path:
    try:
        return build_standin(tmp_path_factory.mktemp("nvml-lib"))
    except StandinBuildError as exc:
        if _ci():
            pytest.fail(f"the NVML stand-in is required under CI=true but cannot be built: {exc}", pytrace=False)
        pytest.skip(f"the NVML stand-in cannot be built: {exc}")


@pytest.fixture
def standin(standin_library: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[NvmlStandin]:
    """An 8-GPU node whose NVML this process's pynvml reads."""
    node = NvmlStandin(standin_library, tmp_path / "nvml-state")
    monkeypatch.setenv("NVML_STANDIN_STATE", str(node.state_path))
    node.activate()
    yield node
