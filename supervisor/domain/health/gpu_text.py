"""Parsers of what GPUs say in text: ``nvidia-smi -q`` dumps and kernel ``NVRM: Xid`` lines.

They turn text into the same evidence the NVML reader produces (``GpuSample``, ``XidEvent``), so
the rules judge a dump, a kernel log and a live NVML read alike — and a hook can fall back on
``nvidia-smi`` or ``dmesg`` where NVML cannot be loaded. Pure: text in, values out.

``nvidia-smi -q`` is an indented tree of ``Key : value`` lines, four spaces a level, one
``GPU 00000000:07:00.0`` section per GPU. Layouts differ by driver and GPU generation (ECC as
SRAM/DRAM counts on Ampere and later, as single/double bit on Volta; "Clocks Event Reasons" or,
before 535, "Clocks Throttle Reasons"); "N/A" reads as not supported (None).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from msgspec.structs import replace

from supervisor.domain.health.node_report import GpuSample, XidEvent
from supervisor.domain.text_safety import printable

Tree = dict[str, "str | Tree"]

_CLOCK_BITS = {
    "Idle": 0x1,
    "Applications Clocks Setting": 0x2,
    "SW Power Cap": 0x4,
    "HW Slowdown": 0x8,
    "Sync Boost": 0x10,
    "SW Thermal Slowdown": 0x20,
    "HW Thermal Slowdown": 0x40,
    "HW Power Brake Slowdown": 0x80,
    "Display Clock Setting": 0x100,
}


@dataclass(frozen=True)
class SmiDump:
    driver: str
    attached: int | None  # "Attached GPUs"
    gpus: tuple[GpuSample, ...]
    problems: tuple[str, ...]  # what made the dump incomplete or unreadable


def _tree(lines: Iterable[str]) -> Tree:
    root: Tree = {}
    stack: list[tuple[int, Tree]] = [(-1, root)]
    for raw in lines:
        if not raw.strip() or raw.lstrip().startswith("="):
            continue
        indent = len(raw) - len(raw.lstrip(" "))
        key, sep, value = raw.strip().partition(":")
        if re.match(r"^GPU [0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:", raw.strip()):
            key, value, sep = raw.strip(), "", ""
        while stack[-1][0] >= indent:
            stack.pop()
        parent = stack[-1][1]
        key, value = key.strip(), value.strip()
        if sep and value:
            parent[key] = value
        else:
            child: Tree = {}
            parent[key] = child
            stack.append((indent, child))
    return root


def _get(tree: Tree | str | None, *path: str) -> str | Tree | None:
    node: Tree | str | None = tree
    for part in path:
        if not isinstance(node, dict):
            return None
        node = node.get(part)
    return node


def _num(value: object) -> int | None:
    if not isinstance(value, str):
        return None
    m = re.match(r"^\s*(-?\d+)", value)
    return int(m.group(1)) if m else None


def _float(value: object) -> float | None:
    if not isinstance(value, str):
        return None
    m = re.match(r"^\s*(-?\d+(?:\.\d+)?)", value)
    return float(m.group(1)) if m else None


def _yes(value: object) -> bool | None:
    if value in ("Yes", "Active"):
        return True
    if value in ("No", "Not Active"):
        return False
    return None


def _sum(values: Iterable[int | None]) -> int | None:
    found = [v for v in values if v is not None]
    return sum(found) if found else None


def _ecc(section: object, correctable: bool) -> int | None:
    """One of Volatile/Aggregate: Ampere+ SRAM/DRAM keys, or Volta's Single/Double Bit totals."""
    if not isinstance(section, dict):
        return None
    if "Single Bit" in section or "Double Bit" in section:
        return _num(_get(section, "Single Bit" if correctable else "Double Bit", "Total"))
    keys = [
        k
        for k in section
        if isinstance(section[k], str) and ("Correctable" in k if correctable else "Uncorrectable" in k)
    ]
    return _sum(_num(section[k]) for k in keys)


def _clocks(section: object) -> int | None:
    if not isinstance(section, dict):
        return None
    mask, known = 0, False
    for key, value in _flatten(section):
        bit = _CLOCK_BITS.get(key)
        if bit is not None and _yes(value) is not None:
            known = True
            mask |= bit if _yes(value) else 0
    return mask if known else None


def _flatten(tree: Mapping[str, object]) -> Iterable[tuple[str, object]]:
    for key, value in tree.items():
        yield key, value
        if isinstance(value, dict):
            yield from _flatten(value)


def _recovery(section: object) -> int | None:
    if not isinstance(section, dict):
        return None
    if _yes(section.get("Reset Required")):
        return 1  # NVML_GPU_RECOVERY_ACTION_GPU_RESET
    if _yes(section.get("Drain and Reset Recommended")):
        return 4  # NVML_GPU_RECOVERY_ACTION_DRAIN_AND_RESET
    known = any(_yes(section.get(k)) is not None for k in ("Reset Required", "Drain and Reset Recommended"))
    return 0 if known else None


def _gpu(index: int, bus: str, g: Tree) -> GpuSample:
    retired = _get(g, "Retired Pages")
    remap = _get(g, "Remapped Rows")
    power = _get(g, "GPU Power Readings") or _get(g, "Power Readings")
    return GpuSample(
        i=index,
        bus=bus,
        uuid=str(_get(g, "GPU UUID") or ""),
        name=str(_get(g, "Product Name") or ""),
        ecc_cor_vol=_ecc(_get(g, "ECC Errors", "Volatile"), True),
        ecc_unc_vol=_ecc(_get(g, "ECC Errors", "Volatile"), False),
        ecc_cor_agg=_ecc(_get(g, "ECC Errors", "Aggregate"), True),
        ecc_unc_agg=_ecc(_get(g, "ECC Errors", "Aggregate"), False),
        retired_sbe=_num(_get(retired, "Single Bit ECC")),
        retired_dbe=_num(_get(retired, "Double Bit ECC")),
        retired_pending=_yes(_get(retired, "Pending Page Blacklist") or _get(retired, "Pending")),
        remap_cor=_num(_get(remap, "Correctable Error")),
        remap_unc=_num(_get(remap, "Uncorrectable Error")),
        remap_pending=_yes(_get(remap, "Pending")),
        remap_failed=_yes(_get(remap, "Remapping Failure Occurred")),
        clocks=_clocks(_get(g, "Clocks Event Reasons") or _get(g, "Clocks Throttle Reasons")),
        temp_c=_num(_get(g, "Temperature", "GPU Current Temp")),
        power_w=_float(_get(power, "Power Draw")),
        sm_mhz=_num(_get(g, "Clocks", "SM")),
        util=_num(_get(g, "Utilization", "Gpu")),
        mem_util=_num(_get(g, "Utilization", "Memory")),
        recovery=_recovery(_get(g, "GPU Reset Status")),
    )


def parse_smi_query(text: str) -> SmiDump:
    """Parse ``nvidia-smi -q``. Never raises: what could not be read is listed in ``problems``."""
    tree = _tree(text.splitlines())
    problems: list[str] = []
    driver = _get(tree, "Driver Version")
    attached = _num(_get(tree, "Attached GPUs"))
    sections = [(k, v) for k, v in tree.items() if k.startswith("GPU ") and isinstance(v, dict)]
    gpus = []
    for index, (key, section) in enumerate(sections):
        gpus.append(_gpu(index, key[4:].strip(), section))
        unknown = [k for k, _ in _flatten(section) if k.startswith("Invalid")]
        if unknown:
            problems.append(f"GPU {key[4:].strip()}: unrecognised fields {', '.join(unknown[:3])}")
        if "ECC Errors" not in section and "Temperature" not in section:
            problems.append(f"GPU {key[4:].strip()}: section cut short (no ECC errors, no temperature)")
    if driver is None:
        problems.append("no 'Driver Version' line: not nvidia-smi -q output")
    if attached is not None and attached != len(gpus):
        problems.append(f"'Attached GPUs' says {attached}, the dump has {len(gpus)} GPU sections")
    return SmiDump(str(driver or ""), attached, tuple(gpus), tuple(problems))


# "NVRM: Xid (PCI:0000:9b:00): 119, pid=..., name=..., message" — older drivers omit pid/name.
_XID = re.compile(r"NVRM: Xid \((?:PCI:)?([0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2})[^)]*\): (\d+),\s*(.*)$")
_PID_NAME = re.compile(r"^(?:pid=(?:'<unknown>'|\d+),\s*)?(?:name=(?:<unknown>|[^,]*),\s*)?")
_OFF_BUS = re.compile(r"NVRM: (?:The NVIDIA )?GPU ([0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2})")


def pci_key(text: str) -> tuple[int, int, int] | None:
    """(domain, bus, device) of "0000:9b:00", "PCI:0000:9b:00" or "00000000:9B:00.0"."""
    m = re.search(r"([0-9A-Fa-f]{4,8}):([0-9A-Fa-f]{2}):([0-9A-Fa-f]{2})", text)
    return (int(m.group(1), 16), int(m.group(2), 16), int(m.group(3), 16)) if m else None


def parse_xid_lines(lines: Iterable[str], gpus: Iterable[GpuSample] = ()) -> list[XidEvent]:
    """XID events from kernel log lines (dmesg, dmesg -T, /dev/kmsg, syslog, journal); other lines
    are skipped. A GPU found "fallen off the bus" without an Xid line counts as XID 79. The GPU
    index is filled in from ``gpus`` (matched by PCI address), else -1 with the address in ``bus``."""
    by_pci = {pci_key(g.bus): g.i for g in gpus if g.bus}
    events: list[XidEvent] = []
    pending_off_bus: str | None = None
    for line in lines:
        m = _XID.search(line)
        if m:
            bus, xid, rest = m.group(1), int(m.group(2)), _PID_NAME.sub("", m.group(3)).strip()
            text = printable(rest, 1024)  # a log line's words, no control character: the ingest refuses those
            events.append(XidEvent(gpu=by_pci.get(pci_key(bus), -1), xid=xid, at=0.0, bus=bus, text=text))
            continue
        off = _OFF_BUS.search(line)
        if off and "fallen off the bus" in line:
            events.append(_off_bus(off.group(1), by_pci))
        elif off:
            pending_off_bus = off.group(1)
        elif pending_off_bus and "fallen off the bus" in line:
            events.append(_off_bus(pending_off_bus, by_pci))
            pending_off_bus = None
    return _dedupe_off_bus(events)


def _off_bus(bus: str, by_pci: Mapping[tuple[int, int, int] | None, int]) -> XidEvent:
    return XidEvent(gpu=by_pci.get(pci_key(bus), -1), xid=79, at=0.0, bus=bus, text="GPU has fallen off the bus")


def _dedupe_off_bus(events: list[XidEvent]) -> list[XidEvent]:
    """ "GPU 0000:a1:00.0: GPU has fallen off the bus." follows the Xid 79 line itself: count once."""
    out: list[XidEvent] = []
    for e in events:
        if e.xid == 79 and out and out[-1].xid == 79 and pci_key(out[-1].bus) == pci_key(e.bus):
            continue
        out.append(e)
    return out


def with_xids(gpus: Iterable[GpuSample], events: Iterable[XidEvent]) -> list[XidEvent]:
    """``events`` with their GPU index filled in from ``gpus`` where it was unknown."""
    by_pci = {pci_key(g.bus): g.i for g in gpus if g.bus}
    return [replace(e, gpu=by_pci.get(pci_key(e.bus), -1)) if e.gpu < 0 and e.bus else e for e in events]
