"""A stand-in NVML library for tests and benchmarks: scripted GPUs behind the real pynvml.

``build_standin(dest)`` compiles ``tests/nvml_standin/nvml_standin.c`` with gcc into
``dest/libnvidia-ml.so.1`` (soname ``libnvidia-ml.so.1``). ``NvmlStandin`` writes the state file
the library re-reads on every call (atomically) and gives the environment a process needs to use
it: ``LD_LIBRARY_PATH`` (pynvml loads ``libnvidia-ml.so.1`` by name) and ``NVML_STANDIN_STATE``.
In this process, ``activate()`` loads the library by its path first; pynvml's own load then finds
it by soname. A test scripts GPUs (``gpu(3, remap_pending=1)``), failures
(``fail(3, "nvmlDeviceGetRemappedRows", NOT_SUPPORTED)``), wedged calls (``delay``) and XID
events (``xid(3, 79)``).
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

SOURCE = Path(__file__).resolve().parents[3] / "tests" / "nvml_standin" / "nvml_standin.c"
LIBRARY_NAME = "libnvidia-ml.so.1"

NOT_SUPPORTED = 3
TIMEOUT = 10
GPU_IS_LOST = 15
DRIVER_NOT_LOADED = 9
UNKNOWN = 999

_HEALTHY = {"temp": 35, "power_mw": 70000, "sm_mhz": 1980, "util_gpu": 0, "util_mem": 0, "nvlinks": 18, "recovery": 0}


class StandinBuildError(RuntimeError):
    pass


def build_standin(dest: Path, source: Path = SOURCE) -> Path:
    """Compile the stand-in into ``dest`` (once per source version); return the library's path."""
    if not source.is_file():
        raise StandinBuildError(f"stand-in source {source} not found: run from a checkout of the repository")
    gcc = shutil.which("gcc") or shutil.which("cc")
    if gcc is None:
        raise StandinBuildError("no C compiler (gcc) on PATH: install gcc (Debian: apt-get install gcc)")
    digest = hashlib.sha256(source.read_bytes()).hexdigest()[:16]
    out_dir = dest / f"nvml-standin-{digest}"
    lib = out_dir / LIBRARY_NAME
    if lib.exists():
        return lib
    out_dir.mkdir(parents=True, exist_ok=True)
    tmp = out_dir / f".{LIBRARY_NAME}.{os.getpid()}"
    argv = [
        gcc,
        "-std=c11",
        "-O1",
        "-Wall",
        "-Wextra",
        "-Wno-format-truncation",
        "-fPIC",
        "-shared",
        "-fvisibility=hidden",
        f"-Wl,-soname,{LIBRARY_NAME}",
        "-o",
        str(tmp),
        str(source),
        "-lpthread",
    ]
    result = subprocess.run(argv, capture_output=True, text=True, check=False)  # noqa: S603 - fixed argv
    if result.returncode != 0:
        raise StandinBuildError(f"gcc failed ({result.returncode}): {result.stderr.strip()[-2000:]}")
    tmp.replace(lib)
    return lib


@dataclass
class StandinGpu:
    uuid: str
    bus: str
    name: str = "NVIDIA H100 80GB HBM3"
    values: dict[str, int] = field(default_factory=lambda: dict(_HEALTHY))


class NvmlStandin:
    """One scripted node: its GPUs, failures and XID events, written to ``state_path``."""

    def __init__(self, library: Path, state_path: Path, gpus: int = 8, driver: str = "550.54.15") -> None:
        self.library = library
        self.state_path = state_path
        self.driver = driver
        self.gpus = [
            StandinGpu(uuid=f"GPU-5a1d0000-0000-4000-8000-{i:012d}", bus=f"00000000:{0x19 + 0x20 * i:02X}:00.0")
            for i in range(gpus)
        ]
        self.fails: list[tuple[str, str, int]] = []
        self.delays: list[tuple[str, str, int]] = []
        self.xids: list[tuple[int, int, int]] = []
        self.write()

    @property
    def env(self) -> dict[str, str]:
        """What a child process needs in its environment to load this stand-in through pynvml."""
        return {"LD_LIBRARY_PATH": str(self.library.parent), "NVML_STANDIN_STATE": str(self.state_path)}

    def activate(self) -> None:
        """Point this process's pynvml at the stand-in (load it by path; pynvml finds it by soname)."""
        os.environ["NVML_STANDIN_STATE"] = str(self.state_path)
        ctypes.CDLL(str(self.library))

    # ------------------------------------------------------------------ scripting
    def gpu(self, index: int, **values: int) -> None:
        """Set counters of GPU ``index`` (keys as in the C source: remap_pending=1, lost=1 ...)."""
        self.gpus[index].values.update(values)
        self.write()

    def fail(self, gpu: int | None, function: str, code: int) -> None:
        """Make ``function`` return ``code`` for ``gpu`` (None: every GPU and node-wide calls)."""
        self.fails.append(("*" if gpu is None else str(gpu), function, code))
        self.write()

    def delay(self, gpu: int | None, function: str, ms: int) -> None:
        self.delays.append(("*" if gpu is None else str(gpu), function, ms))
        self.write()

    def clear_failures(self) -> None:
        self.fails.clear()
        self.delays.clear()
        self.write()

    def xid(self, gpu: int, code: int) -> None:
        """Raise XID ``code`` on ``gpu``: delivered to event sets registered before now."""
        self.xids.append((len(self.xids) + 1, gpu, code))
        self.write()

    def write(self) -> None:
        lines = [f"driver {self.driver}"]
        for i, g in enumerate(self.gpus):
            values = " ".join(f"{k}={v}" for k, v in sorted(g.values.items()))
            lines += [f"gpu {i} uuid={g.uuid} bus={g.bus} {values}", f"name {i} {g.name}"]
        lines += [f"fail {g} {fn} {code}" for g, fn, code in self.fails]
        lines += [f"delay {g} {fn} {ms}" for g, fn, ms in self.delays]
        lines += [f"xid {seq} {gpu} {code}" for seq, gpu, code in self.xids]
        tmp = self.state_path.with_name(self.state_path.name + ".tmp")
        tmp.write_text("\n".join(lines) + "\n")
        tmp.replace(self.state_path)
