"""The terminal logbook as on-call reads it: incidents first-class, routine events folded
(report.fold), one line each otherwise. ``logbook RUN --all`` prints every event instead.

Each incident opens with a line of its own (what happened, how long until the next attempt ran)
after a blank line, and its events are indented under it. Everything shown passes through
``printable``, as every terminal line does (cli.views.render)."""

from __future__ import annotations

from collections.abc import Iterable

from rich.text import Text

from supervisor.cli.views.render import event_text, ts
from supervisor.domain.records import Event
from supervisor.domain.text_safety import printable
from supervisor.report.fold import Entry, Fold, IncidentStart, Line, fold, folded_away

_INDENT = "  "


def folded_texts(events: Iterable[Event], *, evidence: bool = False, incidents: bool = True) -> list[Text]:
    """The folded logbook, one ``Text`` a line (blank lines around incidents), with a last line
    saying how many routine events were folded and how to see them. ``incidents=False`` (a
    filtered view: some of an incident's events may be left out) folds routine events only."""
    entries = fold(events)
    if not incidents:
        entries = [Line(x.event) if isinstance(x, Line) else x for x in entries if not isinstance(x, IncidentStart)]
    out: list[Text] = []
    in_incident = False
    for entry in entries:
        starts = isinstance(entry, IncidentStart)
        inside = isinstance(entry, Line) and entry.incident is not None
        if out and (starts or (in_incident and not inside)):
            out.append(Text(""))
        in_incident = starts or inside
        out.append(_entry_text(entry, evidence, indent=inside))
    hidden = folded_away(entries)
    if hidden:
        out += [Text(""), Text(f"({hidden:,} routine events folded; --all shows every line)", style="dim")]
    return out


def folded_lines(events: Iterable[Event], *, evidence: bool = False, incidents: bool = True) -> list[str]:
    """The folded logbook as plain lines (the demo's report, golden tests)."""
    return [t.plain for t in folded_texts(events, evidence=evidence, incidents=incidents)]


def _entry_text(entry: Entry, evidence: bool, *, indent: bool) -> Text:
    if isinstance(entry, IncidentStart):
        return _incident_text(entry)
    t = Text(_INDENT if indent else "")
    if isinstance(entry, Fold):
        return t.append_text(_fold_text(entry))
    return t.append_text(event_text(entry.event, evidence=evidence))


def _incident_text(head: IncidentStart) -> Text:
    where = f", attempt {head.attempt}" if head.attempt is not None else ""
    t = Text()
    t.append(f"INCIDENT {head.number}", style="bold red")
    t.append(f"  {ts(head.at)}{where}: {printable(head.title)}; {printable(head.outcome)}", style="bold")
    return t


def _fold_text(f: Fold) -> Text:
    first, last = f.first, f.last
    where = f"attempt {first.attempt}" if first.attempt is not None else "-"
    if last.attempt != first.attempt:
        where = f"attempts {first.attempt}–{last.attempt}"
    until = f" (until {ts(last.at)})" if last.at != first.at else ""
    t = Text()
    t.append(ts(first.at), style="dim")
    t.append(f"  {printable(first.run)}  {where:<10} ")
    t.append(f"{first.kind.value:<14}", style="dim")
    t.append(f" {f.summary()}{until}  ")
    t.append(f"[{printable(first.actor)}]", style="dim")
    return t
