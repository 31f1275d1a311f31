"""The GPUs as NVML sees them, through pynvml (the ``nvidia-ml-py`` package).

``NvmlReader`` reads everything the GPU-health rules look at into ``GpuSample`` values and waits
on an NVML event set for XID events. It never raises for an NVML error once opened: a field the
GPU does not support is None, a field NVML failed to read gets its error in ``errors``, a GPU
that is lost is reported ``lost`` — the error becomes part of the report. ``open`` raises
``NvmlUnavailable`` (with NVML's reason) when the library or the driver cannot be used at all.

pynvml keeps one library per process; ``library_path`` (optional) loads a specific
``libnvidia-ml.so.1`` first, and pynvml's own load then finds it by its soname.
"""

from __future__ import annotations

import ctypes
import time
from collections.abc import Callable
from typing import Any, TypeVar

import pynvml

from supervisor.domain.health.node_report import GpuSample, XidEvent

T = TypeVar("T")

_ABSENT = frozenset({pynvml.NVML_ERROR_NOT_SUPPORTED, pynvml.NVML_ERROR_FUNCTION_NOT_FOUND})
_ECC = (("ecc_cor_vol", 0, 0), ("ecc_unc_vol", 1, 0), ("ecc_cor_agg", 0, 1), ("ecc_unc_agg", 1, 1))


class NvmlUnavailable(Exception):
    """NVML cannot be used on this node (no library, no driver, init failed)."""


class _Lost(Exception):
    pass


def _error_text(exc: pynvml.NVMLError) -> str:
    try:
        return str(exc)
    except Exception:  # noqa: BLE001 - str() of an NVMLError calls into the library
        return f"NVML error {getattr(exc, 'value', '?')}"


class _Fields:
    """One GPU's reads: each call is tolerant; errors are collected by field name."""

    def __init__(self) -> None:
        self.errors: dict[str, str] = {}

    def read(self, name: str, fn: Callable[..., T], *args: Any) -> T | None:
        try:
            return fn(*args)
        except pynvml.NVMLError as exc:
            if exc.value in _ABSENT:
                return None
            if exc.value == pynvml.NVML_ERROR_GPU_IS_LOST:
                raise _Lost from None
            self.errors[name] = _error_text(exc)
            return None


class NvmlReader:
    def __init__(self, library_path: str | None = None) -> None:
        self.library_path = library_path
        self.driver = ""
        self._handles: list[Any] = []
        self._ids: list[tuple[str, str]] = []  # (uuid, bus) per index, read at open
        self._by_address: dict[int, int] = {}
        self._events: Any = None
        self.errors: list[str] = []  # what open could not set up (events), reported with samples
        self._open = False

    # ------------------------------------------------------------------ life
    def open(self) -> None:
        if self.library_path:
            try:
                ctypes.CDLL(self.library_path)
            except OSError as exc:
                raise NvmlUnavailable(f"cannot load {self.library_path}: {exc}") from None
        try:
            pynvml.nvmlInit()
        except pynvml.NVMLError as exc:
            raise NvmlUnavailable(f"NVML init failed: {_error_text(exc)}") from None
        self._open = True
        try:
            self.driver = _text(pynvml.nvmlSystemGetDriverVersion())
            count = pynvml.nvmlDeviceGetCount()
        except pynvml.NVMLError as exc:
            self.close()
            raise NvmlUnavailable(f"NVML cannot count GPUs: {_error_text(exc)}") from None
        for index in range(count):
            self._add_handle(index)
        self._register_events()

    def _add_handle(self, index: int) -> None:
        try:
            handle = pynvml.nvmlDeviceGetHandleByIndex(index)
        except pynvml.NVMLError as exc:
            self._handles.append(None)
            self._ids.append(("", ""))
            self.errors.append(f"gpu {index}: no handle: {_error_text(exc)}")
            return
        fields = _Fields()
        try:
            uuid = _text(fields.read("uuid", pynvml.nvmlDeviceGetUUID, handle) or "")
            pci = fields.read("bus", pynvml.nvmlDeviceGetPciInfo, handle)
            bus = _text(pci.busId) if pci is not None else ""
        except _Lost:
            uuid, bus = "", ""
        self._handles.append(handle)
        self._ids.append((uuid, bus))
        self._by_address[ctypes.addressof(handle.contents)] = index

    def _register_events(self) -> None:
        try:
            self._events = pynvml.nvmlEventSetCreate()
        except pynvml.NVMLError as exc:
            self.errors.append(f"no XID events: {_error_text(exc)}")
            return
        for index, handle in enumerate(self._handles):
            if handle is None:
                continue
            try:
                pynvml.nvmlDeviceRegisterEvents(handle, pynvml.nvmlEventTypeXidCriticalError, self._events)
            except pynvml.NVMLError as exc:
                self.errors.append(f"gpu {index}: no XID events: {_error_text(exc)}")

    def close(self) -> None:
        if self._events is not None:
            try:
                pynvml.nvmlEventSetFree(self._events)
            except pynvml.NVMLError:
                pass
            self._events = None
        if self._open:
            self._open = False
            try:
                pynvml.nvmlShutdown()
            except pynvml.NVMLError:
                pass

    @property
    def gpu_count(self) -> int:
        return len(self._handles)

    # ------------------------------------------------------------------ reads
    def sample(self) -> list[GpuSample]:
        return [self._sample(i, h) for i, h in enumerate(self._handles)]

    def _sample(self, index: int, handle: Any) -> GpuSample:
        uuid, bus = self._ids[index]
        if handle is None:
            return GpuSample(i=index, uuid=uuid, bus=bus, errors={"handle": "no handle"})
        f = _Fields()
        values: dict[str, Any] = {}
        try:
            values["name"] = _text(f.read("name", pynvml.nvmlDeviceGetName, handle) or "")
            for name, error_type, counter in _ECC:
                values[name] = f.read(name, pynvml.nvmlDeviceGetTotalEccErrors, handle, error_type, counter)
            values.update(self._memory_health(f, handle))
            values["clocks"] = self._clocks(f, handle)
            values["temp_c"] = f.read("temp_c", pynvml.nvmlDeviceGetTemperature, handle, pynvml.NVML_TEMPERATURE_GPU)
            power_mw = f.read("power_w", pynvml.nvmlDeviceGetPowerUsage, handle)
            values["power_w"] = None if power_mw is None else power_mw / 1000.0
            values["sm_mhz"] = f.read("sm_mhz", pynvml.nvmlDeviceGetClockInfo, handle, pynvml.NVML_CLOCK_SM)
            util = f.read("util", pynvml.nvmlDeviceGetUtilizationRates, handle)
            if util is not None:
                values["util"], values["mem_util"] = int(util.gpu), int(util.memory)
            values.update(self._nvlink(f, handle))
            values["recovery"] = self._recovery(f, handle)
        except _Lost:
            return GpuSample(i=index, uuid=uuid, bus=bus, lost=True, errors={"gpu": "GPU is lost"})
        return GpuSample(i=index, uuid=uuid, bus=bus, errors=f.errors, **values)

    @staticmethod
    def _memory_health(f: _Fields, handle: Any) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for name, cause in (("retired_sbe", 0), ("retired_dbe", 1)):
            pages = f.read(name, pynvml.nvmlDeviceGetRetiredPages_v2, handle, cause)
            out[name] = None if pages is None else len(pages)
        pending = f.read("retired_pending", pynvml.nvmlDeviceGetRetiredPagesPendingStatus, handle)
        out["retired_pending"] = None if pending is None else bool(pending)
        rows = f.read("remap", pynvml.nvmlDeviceGetRemappedRows, handle)
        if rows is not None:
            out["remap_cor"], out["remap_unc"] = int(rows[0]), int(rows[1])
            out["remap_pending"], out["remap_failed"] = bool(rows[2]), bool(rows[3])
        return out

    @staticmethod
    def _clocks(f: _Fields, handle: Any) -> int | None:
        try:
            return int(pynvml.nvmlDeviceGetCurrentClocksEventReasons(handle))
        except pynvml.NVMLError as exc:
            if exc.value != pynvml.NVML_ERROR_FUNCTION_NOT_FOUND:  # older drivers: the throttle name
                return f.read("clocks", _raise, exc)
        return f.read("clocks", pynvml.nvmlDeviceGetCurrentClocksThrottleReasons, handle)

    @staticmethod
    def _nvlink(f: _Fields, handle: Any) -> dict[str, int]:
        totals = {"nvlink_replay": 0, "nvlink_recovery": 0, "nvlink_crc": 0}
        links = 0
        for link in range(pynvml.NVML_NVLINK_MAX_LINKS):
            try:
                active = pynvml.nvmlDeviceGetNvLinkState(handle, link)
            except pynvml.NVMLError as exc:
                if exc.value == pynvml.NVML_ERROR_GPU_IS_LOST:
                    raise _Lost from None
                break  # NOT_SUPPORTED (no NVLink) or INVALID_ARGUMENT (past the last link)
            links += 1
            if not active:
                continue
            for key, counter in (
                ("nvlink_replay", pynvml.NVML_NVLINK_ERROR_DL_REPLAY),
                ("nvlink_recovery", pynvml.NVML_NVLINK_ERROR_DL_RECOVERY),
                ("nvlink_crc", pynvml.NVML_NVLINK_ERROR_DL_CRC_FLIT),
                ("nvlink_crc", pynvml.NVML_NVLINK_ERROR_DL_CRC_DATA),
            ):
                value = f.read(key, pynvml.nvmlDeviceGetNvLinkErrorCounter, handle, link, counter)
                totals[key] += int(value or 0)
        return totals if links else {}

    @staticmethod
    def _recovery(f: _Fields, handle: Any) -> int | None:
        values = f.read(
            "recovery", pynvml.nvmlDeviceGetFieldValues, handle, [pynvml.NVML_FI_DEV_GET_GPU_RECOVERY_ACTION]
        )
        if values is None:
            return None
        value = values[0]
        if value.nvmlReturn == pynvml.NVML_SUCCESS:
            return int(value.value.uiVal)
        if value.nvmlReturn == pynvml.NVML_ERROR_GPU_IS_LOST:
            raise _Lost
        return None

    # ------------------------------------------------------------------ events
    def wait_xids(self, timeout_s: float, clock: Callable[[], float] = time.time) -> list[XidEvent]:
        """XID events that arrive within ``timeout_s`` (all that are queued once one arrives)."""
        if self._events is None:
            return []
        found: list[XidEvent] = []
        wait_ms = max(0, int(timeout_s * 1000))
        while True:
            try:
                data = pynvml.nvmlEventSetWait_v2(self._events, wait_ms)
            except pynvml.NVMLError as exc:
                if exc.value != pynvml.NVML_ERROR_TIMEOUT and not found:
                    self.errors.append(f"XID event wait: {_error_text(exc)}")
                    del self.errors[:-8]
                return found
            if data.eventType & pynvml.nvmlEventTypeXidCriticalError:
                index = self._by_address.get(ctypes.addressof(data.device.contents), -1) if data.device else -1
                uuid, bus = self._ids[index] if index >= 0 else ("", "")
                found.append(XidEvent(gpu=index, xid=int(data.eventData), at=clock(), uuid=uuid, bus=bus))
            wait_ms = 0


def _raise(exc: Exception) -> None:
    raise exc


def _text(value: str | bytes) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)
