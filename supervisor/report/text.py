"""How one logbook event reads in the chronicle: times, durations, evidence and decisions in words.

Pure wording, no grouping: the chronicle (report.chronicle) decides which events make an incident,
this module says what each of them means. One zone (UTC), no clock read.

Records quote node agents, job logs and Slurm: ``safe_event`` and ``safe_attempt`` make what they
say plain Markdown text (``text_safety.markdown``: no HTML, link, image, heading, table cell or
control character; a note keeps its lines) before any of it is worded — the values a hang puts in a
code span (the log's path, its last line) are made safe for inside one instead.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import replace
from datetime import UTC, datetime
from typing import Any

from supervisor.domain.records import AttemptRecord, Event, EventKind
from supervisor.domain.text_safety import markdown, markdown_block, markdown_code

_SLURM_KEYS = ("slurm_state", "slurm_flags", "slurm_reason")
_CODE_KEYS = ("log", "last_lines")  # a hang's evidence shown in code spans


def safe_event(e: Event) -> Event:
    """The event with its words (message, actor, evidence's strings) as plain Markdown text."""
    message = markdown_block(e.message) if e.kind is EventKind.NOTE else markdown(e.message)
    hang = is_hang(e.evidence)
    evidence = {
        markdown(k): _safe(v, markdown_code if hang and k in _CODE_KEYS else markdown) for k, v in e.evidence.items()
    }
    return replace(e, message=message, actor=markdown(e.actor), evidence=evidence)


def safe_attempt(a: AttemptRecord) -> AttemptRecord:
    """The attempt with Slurm's words (its end state and reason) as plain Markdown text."""
    return replace(
        a,
        end_state=markdown(a.end_state) if a.end_state else a.end_state,
        end_reason=markdown(a.end_reason) if a.end_reason else a.end_reason,
    )


def _safe(value: Any, text: Any) -> Any:
    if isinstance(value, str):
        return text(value)
    if isinstance(value, list | tuple):
        return [_safe(v, text) for v in value]
    if isinstance(value, Mapping):
        return {markdown(str(k)): _safe(v, text) for k, v in value.items()}
    return value


def stamp(t: float) -> str:
    """Seconds since the epoch as ``YYYY-MM-DD HH:MM:SS UTC``."""
    return datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def heading_stamp(t: float) -> str:
    """The minute-resolution time of a heading: ``YYYY-MM-DD HH:MM UTC``."""
    return datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%d %H:%M UTC")


def seconds(s: float) -> str:
    """A duration as a person writes it: ``4.7 s``, ``45 s``, ``1 min 50 s``, ``2 h 38 min 56 s``,
    ``3 h`` (parts that are zero left out), ``2 d 1 h`` past two days."""
    s = max(0.0, s)
    if s < 60:
        return f"{s:.0f} s" if abs(s - round(s)) < 0.05 else f"{s:.1f} s"
    whole = int(round(s))
    d, rest = divmod(whole, 86400) if whole >= 2 * 86400 else (0, whole)
    h, rest = divmod(rest, 3600)
    m, sec = divmod(rest, 60)
    return " ".join(f"{n:,} {unit}" for n, unit in ((d, "d"), (h, "h"), (m, "min"), (sec, "s")) if n)


def attempt_words(attempt: int | None) -> str:
    """`` attempt N`` for a heading, or nothing when the event belongs to no attempt."""
    return f" attempt {attempt}" if attempt is not None else ""


def strip_label(e: Event) -> str:
    """The message without the ``attempt N (job J, restart R): `` prefix the heading already says."""
    msg = e.message
    if msg.startswith("attempt ") and "): " in msg:
        head, _, rest = msg.partition("): ")
        if "(job " in head:
            return rest
    return msg


def nodes(names: Iterable[Any]) -> str:
    """Node names sorted and joined with commas."""
    return ", ".join(sorted(str(n) for n in names))


def quote(s: Any) -> str:
    """``s`` in double quotes (double quotes inside it become single ones)."""
    return '"' + str(s).replace('"', "'") + '"'


def pairs(ev: Mapping[str, Any]) -> str:
    """Evidence as ``key value`` pairs sorted by key; lists and mappings spelled out."""
    return ", ".join(f"{k} {_value(ev[k])}" for k in sorted(ev))


def _value(v: Any) -> Any:
    if isinstance(v, list | tuple):
        return ", ".join(map(str, v)) or "none"
    if isinstance(v, Mapping):
        return ", ".join(f"{a}: {b}" for a, b in sorted(v.items(), key=lambda p: str(p[0]))) or "none"
    return v


def is_hang(ev: Mapping[str, Any]) -> bool:
    """Whether a fault's evidence is the progress watch's (a hang) rather than a node's or a job's."""
    return "last_step" in ev or "silent_s" in ev


def subject(f: Event) -> str:
    """What a fault's evidence is about, in parentheses: the node, or ``(hang)``."""
    if f.evidence.get("node"):
        return f" ({f.evidence['node']})"
    if is_hang(f.evidence):
        return " (hang)"
    return ""


def evidence(f: Event) -> str:
    """A fault's evidence as one sentence: what was observed, then every other value on record."""
    ev = dict(f.evidence)
    if ev.get("node"):
        return _node_evidence(f, ev)
    if is_hang(ev):
        return _hang_evidence(ev)
    return (strip_label(f) + (f"; {pairs(ev)}" if ev else "")) + "."


def _node_evidence(f: Event, ev: dict[str, Any]) -> str:
    observed = ev.pop("observed", None) or strip_label(f)
    probe = ev.pop("probe", None)
    ev.pop("node")
    parts = [f"observed: {observed}"]
    if probe and probe != observed:
        parts.append(f"probe: {probe}")
    elif probe:
        parts[0] += " (the probe's finding)"
    if any(k in ev for k in _SLURM_KEYS):
        parts.append(_slurm_view(ev))
    detection = ev.pop("detection_s", None)
    if isinstance(detection, int | float) and not isinstance(detection, bool):
        parts.append(f"known {detection:g} s after its first sign")
    elif detection is not None:
        ev["detection_s"] = detection  # not a number: shown as it is
    if ev:
        parts.append(pairs(ev))
    return "; ".join(parts) + "."


def _slurm_view(ev: dict[str, Any]) -> str:
    flags = ev.pop("slurm_flags", None) or []
    reason = ev.pop("slurm_reason", None)
    return (
        f"Slurm showed the node {ev.pop('slurm_state', None) or 'unknown'}, flags "
        f"{','.join(map(str, flags)) or 'none'}, reason {quote(reason) if reason else 'none'}"
    )


def _hang_evidence(ev: dict[str, Any]) -> str:
    parts = [str(ev.pop("reason", None) or "no training progress"), ", ".join(_hang_numbers(ev))]
    if ev.get("nodes"):
        parts.append(f"on {nodes(ev.pop('nodes'))}")
    if ev.get("log"):
        parts.append(
            f"log `{ev.pop('log')}`"
            + (f" ({ev.pop('records_read')} records read)" if ev.get("records_read") is not None else "")
        )
    last = ev.pop("last_lines", None) or []
    ev.pop("records_read", None)
    stacks = ev.pop("stacks", None)
    text = "; ".join(p for p in parts if p)
    if last:
        text += "; last line: `" + str(last[-1]).replace("`", "'") + "`"
    if isinstance(stacks, Mapping):
        text += "; " + _stacks_view(stacks)
    if ev:
        text += "; " + pairs(ev)
    return text + "."


def _stacks_view(stacks: Mapping[str, Any]) -> str:
    """The capture before the cancel (issue 35): its time, where each group of ranks waits (one
    frame each), and the file that keeps every rank's stack (``slurm-supervisor stacks RUN``)."""
    took = stacks.get("capture_s")
    text = f"stacks captured in {seconds(float(took))}" if isinstance(took, int | float) else "stacks"
    groups = [g for g in stacks.get("groups") or () if isinstance(g, Mapping)][:4]
    if groups:
        shown = [f"{g.get('place')} ({g.get('what')}) ×{g.get('rank_count')}" + (f" at {g['stack'][0]}" if g.get("stack") else "") for g in groups]  # fmt: skip
        text += ": " + ", ".join(shown)
    if stacks.get("file"):
        text += f", kept in {stacks['file']}"
    return text


def _hang_numbers(ev: dict[str, Any]) -> list[str]:
    numbers = []
    if "last_step" in ev:
        numbers.append(f"last step {ev.pop('last_step')}")
    if "silent_s" in ev:
        numbers.append(f"silent for {seconds(float(ev.pop('silent_s')))}")
    if ev.get("threshold_s") is not None:
        numbers.append(f"threshold {seconds(float(ev.pop('threshold_s')))}")
    if ev.get("step_interval_s") is not None:
        numbers.append(f"usual step interval {seconds(float(ev.pop('step_interval_s')))}")
    return numbers


def decision(e: Event) -> str:
    """What the supervisor did, as the incident's decision line."""
    ev = e.evidence
    if e.kind is EventKind.RESTARTED and "exclude" in ev:
        text = f"restarted as attempt {e.attempt} (job {e.job_id})"
        excl = ev.get("exclude") or []
        text += f", excluding {nodes(excl)}" if excl else ", excluding nothing"
        if ev.get("reason"):
            text += f" ({ev['reason']})"
        return text
    msg = strip_label(e)
    reason = ev.get("reason")
    if e.kind is EventKind.NODE_DRAINED and isinstance(reason, str) and msg.endswith(f": {reason}"):
        return f"{msg[: -len(reason) - 2]}, reason {quote(reason)}"
    return msg


def fault_cause(f: Event) -> str | None:
    """What went wrong, in a few words, for a fault that is not about one node (None for a node's)."""
    ev = f.evidence
    if ev.get("node"):
        return None
    if is_hang(ev) or f.key.endswith(":hang"):
        step = ev.get("last_step")
        return f"hang at step {step}" if step is not None else "hang (no training progress)"
    if ev.get("state"):
        code = ev.get("exit_code")
        return f"job ended {ev['state']}" + (f" with exit code {code}" if code else "")
    return strip_label(f)
