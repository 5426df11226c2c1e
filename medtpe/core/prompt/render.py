"""Data-to-text: one subject's MEDS events as a readable, compressible record.

Format (deterministic):

    Age: 52 years
    (1,204 earlier events omitted)
    [static]
    Gender: F
    [2180-03-23 11:51]
    Hematocrit (Blood): 32.7 %
    Urine Color: Yellow
    [13:05]
    Heart Rate: 80 bpm (x2)

- chronological, one line per event, events grouped under their timestamp; the date is written
  when it changes (and on the first group shown), otherwise only the time;
- within one timestamp (and among static events) lines are ordered by code, then by line, so the
  text does not depend on the input order of events that share a time (a MEDS ETL's order, or
  none at all for FHIR resources of different types);
- a code is shown by its description from the codes metadata, else by a readable form of the
  code itself (`LAB//220045//bpm` -> `Lab 220045`); a unit comes from the description's trailing
  `[unit]` or from `LAB//<id>//<unit>` codes and is written after the value;
- exact duplicates at one timestamp (same code, value and text) are shown once with `(xN)`;
- only static events and events up to and including the prediction time are used (MEDS's
  convention; `inclusive=False`: strictly before it);
- with a budget, the newest events are kept: static events first, then timed events from the
  newest backwards. The budget is counted in ORIGINAL (base tokenizer) tokens and the returned
  count is exact;
- with a `window_start` (the stable window, `medtpe.core.prompt.windowing`), timed events before it
  are left out, the omission line says only that earlier events were omitted
  (`OMITTED_BEFORE_WINDOW`: a count would depend on how much history the client sent, so a bounded
  history would change the prompt's first line on every re-score), and the age is given at the
  window start.

How (issue 12, the text is byte-for-byte what the per-event renderer wrote): the events are
columns; with a budget only the newest timestamps that can matter are turned into lines (a window
doubled from the newest end until its lines alone exceed the budget), every distinct line and
header is encoded once per process (`medtpe.core.prompt.piece_tokens`), `fit_to_budget` picks the
events kept from per-line token counts, and the record's ids are the concatenation of its lines' ids
whenever the tokenizer allows it (else the text is encoded once).
"""

from __future__ import annotations

import math
import re
import threading
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime

import meds
import numpy as np

from medtpe.core.meds.events import SubjectEvents, time_keys
from medtpe.core.prompt.piece_tokens import PieceTokens, TokenEncoder, piece_tokens
from medtpe.core.prompt.windowing import window_events

__all__ = [
    "RENDER_VERSION",
    "STATIC_HEADER",
    "BudgetTooSmallError",
    "RenderedRecord",
    "TokenEncoder",
    "describe_code",
    "event_line",
    "fit_to_budget",
    "format_value",
    "render_record",
]

RENDER_VERSION = 1
"""The version of the text this module writes: bumped whenever the same events and code
descriptions would render differently. An artefact's manifest records the version its training
text was rendered with (`medtpe.core.tokenizer.artefact_manifest.Rendering`); a service on another
reports it."""
STATIC_HEADER = "[static]"
_SPECIAL_CODES = {meds.birth_code: "Birth", meds.death_code: "Death"}
_ACRONYMS = {"ICU", "ED", "DRG", "HCPCS", "ICD", "BMI", "MEDS", "ICD9", "ICD10"}
_UNIT_IN_DESCRIPTION = re.compile(r"^(.*\S)\s+\[([^\[\]]+)\]$")
_FIRST_WINDOW_EVENTS = 256
"""Fewest newest events turned into lines first (else an eighth of the budget); the window then
grows by the events its lines still need at the tokens per event seen so far."""
_LINE_CACHE_SIZE = 100_000
"""Distinct (code, value, text) lines remembered per descriptions mapping before a reset."""
_MAPPINGS_KEPT = 8


class BudgetTooSmallError(ValueError):
    """The token budget cannot hold even an empty record."""


@dataclass(frozen=True)
class RenderedRecord:
    """A rendered record; `n_tokens` is its exact original-token count when an encoder was given,
    and `ids` its original-tokenizer ids (the text encoded as plain text)."""

    text: str
    n_tokens: int | None
    n_events_total: int
    n_events_kept: int
    ids: list[int] | None = None


def describe_code(code: str, descriptions: Mapping[str, str]) -> tuple[str, str | None]:
    """(label, unit) for a code: its metadata description, else a readable form of the code."""
    parts = code.split("//")
    unit = None
    if len(parts) >= 3 and parts[1].isdigit() and parts[-1].strip() not in ("", "UNK"):
        unit = parts[-1].strip()
    description = descriptions.get(code)
    if description:
        match = _UNIT_IN_DESCRIPTION.match(description)
        if match:
            return match.group(1), unit or match.group(2)
        return description, unit
    if code in _SPECIAL_CODES:
        return _SPECIAL_CODES[code], None
    head = _humanise_head(parts[0])
    rest = [
        _humanise_segment(p)
        for p in parts[1 : len(parts) - (1 if len(parts) >= 3 and parts[1].isdigit() else 0)]
    ]
    rest = [p for p in rest if p]
    if not rest:
        return head, unit
    if len(rest) == 1 and rest[0].isdigit():
        return f"{head} {rest[0]}", unit
    return f"{head}: {' / '.join(rest)}", unit


def _humanise_head(head: str) -> str:
    if any(c.islower() for c in head):
        return head.strip()
    words = [w for w in head.split("_") if w]
    if not words:
        return head
    shown = [w if w in _ACRONYMS else w.lower() for w in words]
    if shown[0] not in _ACRONYMS:
        shown[0] = shown[0].capitalize()
    return " ".join(shown)


def _humanise_segment(segment: str) -> str:
    segment = segment.strip()
    if segment == "UNK":
        return ""
    if segment.isupper() and (len(segment) > 5 or " " in segment):
        return segment.lower()
    return segment


def format_value(value: float) -> str:
    """Short, deterministic number: integers without decimals, else 6 significant digits."""
    if value == int(value) and abs(value) < 1e15:
        return str(int(value))
    return f"{value:.6g}"


def event_line(label: str, unit: str | None, value: float, text: str | None) -> str:
    """One event's line: its label, then its value (with the unit) and its text where present
    (NaN: no value)."""
    shown = []
    if not np.isnan(value):
        shown.append(format_value(value) + (f" {unit}" if unit else ""))
    if text:
        shown.append(text.replace("\n", " ").strip())
    return f"{label}: {' '.join(shown)}" if shown else label


class _LineMaker:
    """Event lines of one descriptions mapping, each distinct (code, value, text) made once."""

    def __init__(self, descriptions: Mapping[str, str]) -> None:
        self.descriptions = descriptions
        self.labels: dict[str, tuple[str, str | None]] = {}
        self.lines: dict[tuple[str, float | None, str | None], str] = {}

    def event_lines(self, events: SubjectEvents, lo: int, hi: int) -> list[str]:
        """Lines of events `lo..hi-1`, in order (each distinct event made once per process)."""
        values = events.numeric_values[lo:hi]
        keys = list(
            zip(
                events.codes[lo:hi],
                np.where(np.isnan(values), None, values).tolist(),  # NaN: no value
                events.text_values[lo:hi],
                strict=True,
            )
        )
        lines = list(map(self.lines.get, keys))
        for i, line in enumerate(lines):
            if line is None:
                lines[i] = self._make(*keys[i])
        return lines

    def _make(self, code: str, value: float | None, text: str | None) -> str:
        label = self.labels.get(code)
        if label is None:
            label = self.labels[code] = describe_code(code, self.descriptions)
        line = event_line(*label, math.nan if value is None else value, text)
        if len(self.lines) >= _LINE_CACHE_SIZE:
            self.lines.clear()
        self.lines[(code, value, text)] = line
        return line


_MAKERS: dict[int, _LineMaker] = {}
_MAKERS_LOCK = threading.Lock()


def _line_maker(descriptions: Mapping[str, str]) -> _LineMaker:
    """The process-wide `_LineMaker` of a descriptions mapping (treated as read-only)."""
    with _MAKERS_LOCK:
        maker = _MAKERS.get(id(descriptions))
        if maker is None or maker.descriptions is not descriptions:
            if len(_MAKERS) >= _MAPPINGS_KEPT:
                _MAKERS.pop(next(iter(_MAKERS)))
            maker = _MAKERS[id(descriptions)] = _LineMaker(descriptions)
        return maker


def _age_line(events: SubjectEvents, prediction_time: datetime) -> str | None:
    """`Age: N years` from the first timed birth event, if any."""
    codes, start = events.codes, 0
    while True:
        try:
            i = codes.index(meds.birth_code, start)
        except ValueError:
            return None
        if not np.isnat(events.times[i]):
            break
        start = i + 1
    days = (np.datetime64(prediction_time, "us") - events.times[i]) / np.timedelta64(1, "D")
    return f"Age: {int(days // 365.25)} years"


@dataclass
class _Lines:
    """Record lines before any budget: statics, then timed lines with their group index."""

    statics: list[tuple[str, int]]  # (line, number of events it stands for)
    timed: list[tuple[str, int]]
    line_group: np.ndarray  # group index of each timed line
    full_headers: list[str]  # "[YYYY-MM-DD HH:MM]" per group
    natural_headers: list[str]  # full when the date changes, else "[HH:MM]"


def _stamp(time: np.datetime64) -> str:
    return str(time.astype("datetime64[s]"))  # YYYY-MM-DDTHH:MM:SS


def _timed_lines(events: SubjectEvents, lo: int, hi: int, maker: _LineMaker) -> _Lines:
    """Lines of the timed events `lo..hi-1` (`lo` starts a timestamp group); the first group's
    natural header looks at the event before `lo` when it is timed."""
    keys = time_keys(events.times)[lo:hi]
    starts = np.flatnonzero(np.concatenate([[True], keys[1:] != keys[:-1]])) if hi > lo else []
    bounds = [*map(int, starts), hi - lo]
    stamps = np.datetime_as_string(events.times[lo:hi][starts].astype("datetime64[s]"))
    previous_date = _stamp(events.times[lo - 1])[:10] if lo > events.n_static else None
    full_headers, natural_headers = [], []
    for stamp in stamps.tolist():
        date, clock = stamp[:10], stamp[11:16] if stamp.endswith(":00") else stamp[11:19]
        full_headers.append(f"[{date} {clock}]")
        natural_headers.append(full_headers[-1] if date != previous_date else f"[{clock}]")
        previous_date = date
    lines = maker.event_lines(events, lo, hi)
    codes = events.codes[lo:hi]
    timed: list[tuple[str, int]] = []
    line_group: list[int] = []
    for g in range(len(bounds) - 1):
        group = _instant_lines(codes[bounds[g] : bounds[g + 1]], lines[bounds[g] : bounds[g + 1]])
        timed.extend(group.items())
        line_group.extend([g] * len(group))
    return _Lines([], timed, np.array(line_group, dtype=np.int64), full_headers, natural_headers)


def _instant_lines(codes: Sequence[str], lines: list[str]) -> Counter[str]:
    """The distinct lines of the events of one instant with their counts, ordered by code, then
    line: the input order of events that share a time never shows (FHIR carries none)."""
    if len(lines) > 1:
        lines = [line for _, line in sorted(zip(codes, lines, strict=True))]
    return Counter(lines)  # insertion-ordered


def _static_lines(events: SubjectEvents, maker: _LineMaker) -> list[tuple[str, int]]:
    n_static = events.n_static
    lines = maker.event_lines(events, 0, n_static)
    return list(_instant_lines(events.codes[:n_static], lines).items())


def _window(
    events: SubjectEvents, maker: _LineMaker, pieces: PieceTokens | None, budget: int | None
) -> _Lines:
    """Statics and the timed lines of the newest timestamps whose lines alone exceed `budget`
    tokens (all of them without a budget): no older line can be kept, each costs a token."""
    n_static, n = events.n_static, len(events)
    keys = time_keys(events.times)
    chunks: list[_Lines] = []
    hi, line_tokens = n, 0
    size = max(_FIRST_WINDOW_EVENTS, (budget or 0) // 8)
    while hi > n_static:
        lo = n_static if budget is None else max(n_static, hi - size)
        lo = int(np.searchsorted(keys, keys[lo], side="left"))  # start of that timestamp group
        chunk = _timed_lines(events, lo, hi, maker)
        chunks.append(chunk)
        hi = lo
        if budget is None or pieces is None:
            continue
        line_tokens += sum(pieces.counts([line + "\n" for line in _shown_all(chunk.timed)]))
        if line_tokens > budget:
            break
        # the next chunk: the events still needed at the rate seen so far, a quarter more
        per_event = max(line_tokens, 1) / (n - hi)
        size = max(_FIRST_WINDOW_EVENTS // 2, math.ceil(1.25 * (budget - line_tokens) / per_event))
    chunks.reverse()
    offsets = np.cumsum([0] + [len(c.full_headers) for c in chunks])
    return _Lines(
        statics=_static_lines(events, maker),
        timed=[line for c in chunks for line in c.timed],
        line_group=np.concatenate(
            [np.zeros(0, dtype=np.int64)]
            + [c.line_group + offset for c, offset in zip(chunks, offsets, strict=False)]
        ),
        full_headers=[h for c in chunks for h in c.full_headers],
        natural_headers=[h for c in chunks for h in c.natural_headers],
    )


def _shown(line: str, count: int) -> str:
    return f"{line} (x{count})" if count > 1 else line


def _shown_all(items: list[tuple[str, int]]) -> list[str]:
    return [_shown(line, count) for line, count in items]


def _assemble(
    lines: _Lines, n_static: int, start: int, preamble: list[str], timed: list[str]
) -> list[str]:
    """Lines of the text keeping the first `n_static` static lines and the timed lines from
    `start` on (`timed`: every timed line as shown); the text is these joined by newlines."""
    out = list(preamble)
    if n_static:
        out.append(STATIC_HEADER)
        out.extend(_shown_all(lines.statics[:n_static]))
    previous_group = -1
    for j in range(start, len(lines.timed)):
        g = int(lines.line_group[j])
        if g != previous_group:
            out.append(lines.full_headers[g] if previous_group == -1 else lines.natural_headers[g])
            previous_group = g
        out.append(timed[j])
    return out


def _encoded(out: list[str], encoder: TokenEncoder, pieces: PieceTokens) -> tuple[str, list[int]]:
    """The text of these lines and its ids: joined from the lines' ids when the tokenizer allows,
    else the text encoded once."""
    text = "\n".join(out)
    ids = pieces.join(out)
    return text, ids if ids is not None else encoder.encode_batch([text])[0]


def render_record(
    events: SubjectEvents,
    descriptions: Mapping[str, str],
    prediction_time: datetime | None = None,
    encoder: TokenEncoder | None = None,
    max_tokens: int | None = None,
    inclusive: bool = True,
    *,
    window_start: datetime | None = None,
) -> RenderedRecord:
    """Render `events` (static + up to and including `prediction_time`, strictly before it
    with `inclusive=False`) as text.

    With `max_tokens` (needs `encoder`, the ORIGINAL tokenizer) the newest events that fit are
    kept and the returned `n_tokens` is the exact count of the returned text. With an encoder,
    `ids` are the text's ids. With `window_start`, only events from it on are shown (the omission
    line counts the others).
    """
    if prediction_time is not None:
        events = events.before(prediction_time, inclusive=inclusive)
    if max_tokens is not None and encoder is None:
        raise ValueError("a token budget needs the original tokenizer (encoder)")
    counted = window_start is None
    age_at = window_start or prediction_time
    age = _age_line(events, age_at) if age_at is not None else None
    n_total = len(events)
    if window_start is not None:
        events = window_events(events, window_start)
    pieces = piece_tokens(encoder) if encoder is not None else None
    lines = _window(events, _line_maker(descriptions), pieces, max_tokens)
    if max_tokens is None or encoder is None or pieces is None:
        preamble = [age] if age else []
        if len(events) < n_total:
            preamble.append(_omitted_line(n_total - len(events), counted))
        out = _assemble(lines, len(lines.statics), 0, preamble, _shown_all(lines.timed))
        if encoder is None or pieces is None:
            return RenderedRecord("\n".join(out), None, n_total, len(events))
        text, ids = _encoded(out, encoder, pieces)
        return RenderedRecord(text, len(ids), n_total, len(events), ids)
    return fit_to_budget(lines, age, n_total, encoder, pieces, max_tokens, counted)


OMITTED_BEFORE_WINDOW = "(earlier events omitted)"
"""The omission line of a stable window: the same whatever history the request holds."""


def _omitted_line(n: int, counted: bool = True) -> str:
    return f"({n:,} earlier events omitted)" if counted else OMITTED_BEFORE_WINDOW


def fit_to_budget(
    lines: _Lines,
    age: str | None,
    n_total: int,
    encoder: TokenEncoder,
    pieces: PieceTokens,
    budget: int,
    counted: bool = True,
) -> RenderedRecord:
    """Keep the newest lines whose text fits `budget` original tokens: every static line first,
    then timed lines from the newest backwards (see the module docstring). Costs come from
    per-line token counts; the final count is exact (the text's own ids). `counted`: the
    omission line gives the number of events left out (else `OMITTED_BEFORE_WINDOW`)."""
    timed = _shown_all(lines.timed)
    head = [line + "\n" for line in _shown_all(lines.statics)]
    head += [line + "\n" for line in timed]
    head += [h + "\n" for h in lines.full_headers] + [h + "\n" for h in lines.natural_headers]
    head += [STATIC_HEADER + "\n", (age or "") + "\n", _omitted_line(n_total, counted) + "\n"]
    counts = np.array(pieces.counts(head), dtype=np.int64)
    n_s, n_t, n_g = len(lines.statics), len(lines.timed), len(lines.full_headers)
    static_tok = counts[:n_s]
    line_tok = counts[n_s : n_s + n_t]
    full_tok = counts[n_s + n_t : n_s + n_t + n_g]
    natural_tok = counts[n_s + n_t + n_g : n_s + n_t + 2 * n_g]
    static_header_tok, age_tok, omitted_tok = counts[-3:]
    fixed = (age_tok if age else 0) + omitted_tok  # the omission line is an upper bound
    # cost of keeping timed lines start.. (start = n_t keeps none)
    suffix_lines = np.append(np.cumsum(line_tok[::-1])[::-1], 0)
    suffix_headers = np.append(np.cumsum(natural_tok[::-1])[::-1], 0)
    timed_cost = np.zeros(n_t + 1, dtype=np.int64)
    if n_t:
        g = lines.line_group
        timed_cost[:n_t] = suffix_lines[:n_t] + full_tok[g] + suffix_headers[g + 1]
    static_cum = np.cumsum(np.concatenate([[0], static_tok])) + np.where(
        np.arange(n_s + 1) > 0, static_header_tok, 0
    )

    target = budget
    while True:
        n_static = int(np.searchsorted(static_cum, target - fixed, side="right")) - 1
        if n_static < 0:
            raise BudgetTooSmallError(f"a budget of {budget} tokens cannot hold an empty record")
        over = np.flatnonzero(fixed + static_cum[n_static] + timed_cost > target)
        start = int(over[-1]) + 1 if over.size else 0
        if n_static < n_s:
            start = n_t  # static events come first: no timed event unless every static one fits
        kept_timed = sum(count for _, count in lines.timed[start:])
        kept = sum(count for _, count in lines.statics[:n_static]) + kept_timed
        preamble = [age] if age else []
        if kept < n_total:
            preamble.append(_omitted_line(n_total - kept, counted))
        out = _assemble(lines, n_static, start, preamble, timed)
        text, ids = _encoded(out, encoder, pieces)
        if len(ids) <= budget:
            return RenderedRecord(text, len(ids), n_total, kept, ids)
        target -= len(ids) - budget  # BPE joins cost a few tokens more than the pieces: tighten
