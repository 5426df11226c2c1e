"""A frozen copy of the per-event renderer as it was before issue 12 (commit f0e8a85), used
ONLY as the reference that tests/core/prompt/test_render_reference.py holds the columnar
renderer to on generated records (the pins in tests/fixtures/render_pins*.json do the same on
fixed records).
Do not edit it to follow the production code: that would defeat its purpose. One deliberate
format change since: the lines of one instant (and the static lines) are ordered by code, then
line (issue 32: the text no longer depends on the input order of same-time events)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime

import numpy as np

from medtpe.core.meds.events import SubjectEvents, to_naive_utc
from medtpe.core.prompt.render import (
    STATIC_HEADER,
    BudgetTooSmallError,
    RenderedRecord,
    TokenEncoder,
    describe_code,
    event_line,
)

_BIRTH_CODE = "MEDS_BIRTH"


def _age_line(events: SubjectEvents, prediction_time: datetime) -> str | None:
    births = [
        t
        for t, c in zip(events.times, events.codes, strict=True)
        if c == _BIRTH_CODE and not np.isnat(t)
    ]
    if not births:
        return None
    days = (np.datetime64(prediction_time, "us") - births[0]) / np.timedelta64(1, "D")
    return f"Age: {int(days // 365.25)} years"


@dataclass
class _Lines:
    """Record lines before any budget: statics, then timed lines with their group index."""

    statics: list[tuple[str, int]]  # (line, number of events it stands for)
    timed: list[tuple[str, int]]
    line_group: np.ndarray  # group index of each timed line
    full_headers: list[str]  # "[YYYY-MM-DD HH:MM]" per group
    natural_headers: list[str]  # full when the date changes, else "[HH:MM]"


def _collect_lines(events: SubjectEvents, descriptions: Mapping[str, str]) -> _Lines:
    cache: dict[str, tuple[str, str | None]] = {}
    static = np.isnat(events.times)
    statics: list[tuple[str, str]] = []
    timed: list[tuple[str, int]] = []
    line_group: list[int] = []
    full_headers: list[str] = []
    natural_headers: list[str] = []
    group: list[tuple[str, str]] = []  # (code, line) of the current instant
    previous_time = None
    previous_date = None

    def counted(items: list[tuple[str, str]]) -> dict[str, int]:
        lines: dict[str, int] = {}
        for _, line in sorted(items):
            lines[line] = lines.get(line, 0) + 1
        return lines

    def flush() -> None:
        lines = counted(group)
        timed.extend(lines.items())
        line_group.extend([len(full_headers) - 1] * len(lines))
        group.clear()

    for i, code in enumerate(events.codes):
        if code not in cache:
            cache[code] = describe_code(code, descriptions)
        label, unit = cache[code]
        line = event_line(label, unit, events.numeric_values[i], events.text_values[i])
        if static[i]:
            statics.append((code, line))
            continue
        time = events.times[i]
        if time != previous_time:
            flush()
            stamp = str(time.astype("datetime64[s]"))  # YYYY-MM-DDTHH:MM:SS
            date, clock = stamp[:10], stamp[11:16] if stamp.endswith(":00") else stamp[11:19]
            full_headers.append(f"[{date} {clock}]")
            natural_headers.append(full_headers[-1] if date != previous_date else f"[{clock}]")
            previous_time, previous_date = time, date
        group.append((code, line))
    flush()
    return _Lines(
        statics=list(counted(statics).items()),
        timed=timed,
        line_group=np.array(line_group, dtype=np.int64),
        full_headers=full_headers,
        natural_headers=natural_headers,
    )


def _shown(line: str, count: int) -> str:
    return f"{line} (x{count})" if count > 1 else line


def _assemble(lines: _Lines, n_static: int, start: int, preamble: list[str]) -> str:
    """Text keeping the first `n_static` static lines and the timed lines from `start` on."""
    out = list(preamble)
    if n_static:
        out.append(STATIC_HEADER)
        out.extend(_shown(line, count) for line, count in lines.statics[:n_static])
    previous_group = -1
    for j in range(start, len(lines.timed)):
        g = int(lines.line_group[j])
        if g != previous_group:
            out.append(lines.full_headers[g] if previous_group == -1 else lines.natural_headers[g])
            previous_group = g
        out.append(_shown(*lines.timed[j]))
    return "\n".join(out)


def render_record(
    events: SubjectEvents,
    descriptions: Mapping[str, str],
    prediction_time: datetime | None = None,
    encoder: TokenEncoder | None = None,
    max_tokens: int | None = None,
) -> RenderedRecord:
    """Render `events` (static + strictly before `prediction_time`) as text.

    With `max_tokens` (needs `encoder`, the ORIGINAL tokenizer) the newest events that fit are
    kept and the returned `n_tokens` is the exact count of the returned text.
    """
    if prediction_time is not None:  # SubjectEvents.before as it was
        cutoff = np.datetime64(to_naive_utc(prediction_time), "us")
        events = events.take(np.isnat(events.times) | (events.times < cutoff))
    lines = _collect_lines(events, descriptions)
    age = _age_line(events, prediction_time) if prediction_time is not None else None
    n_total = len(events)
    if max_tokens is None:
        text = _assemble(lines, len(lines.statics), 0, [age] if age else [])
        n_tokens = len(encoder.encode_batch([text])[0]) if encoder is not None else None
        return RenderedRecord(text, n_tokens, n_total, n_total)
    if encoder is None:
        raise ValueError("a token budget needs the original tokenizer (encoder)")
    return _fit(lines, age, n_total, encoder, max_tokens)


def _omitted_line(n: int) -> str:
    return f"({n:,} earlier events omitted)"


def _fit(
    lines: _Lines, age: str | None, n_total: int, encoder: TokenEncoder, budget: int
) -> RenderedRecord:
    """Keep the newest lines whose text fits `budget` original tokens (see module docstring)."""
    count = _PieceCounter(encoder)
    lines = _newest(lines, _candidate_lines(lines, count, budget))
    pieces = (
        [line + "\n" for line in _shown_all(lines.statics)]
        + [line + "\n" for line in _shown_all(lines.timed)]
        + [h + "\n" for h in lines.full_headers]
        + [h + "\n" for h in lines.natural_headers]
        + [STATIC_HEADER + "\n", (age or "") + "\n", _omitted_line(n_total) + "\n"]
    )
    counts = count(pieces)
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
            preamble.append(_omitted_line(n_total - kept))
        text = _assemble(lines, n_static, start, preamble)
        n_tokens = len(encoder.encode_batch([text])[0])
        if n_tokens <= budget:
            return RenderedRecord(text, n_tokens, n_total, kept)
        target -= n_tokens - budget  # BPE joins cost a few tokens more than the pieces: tighten


class _PieceCounter:
    """Token counts of text pieces; lines and headers repeat a lot, so each is encoded once."""

    def __init__(self, encoder: TokenEncoder):
        self.encoder = encoder
        self.known: dict[str, int] = {}

    def __call__(self, pieces: list[str]) -> np.ndarray:
        missing = [p for p in dict.fromkeys(pieces) if p not in self.known]
        if missing:
            ids = self.encoder.encode_batch(missing)
            self.known.update(zip(missing, map(len, ids), strict=True))
        return np.array([self.known[p] for p in pieces], dtype=np.int64)


def _candidate_lines(lines: _Lines, count: _PieceCounter, budget: int) -> int:
    """How many newest timed lines can matter: a window from the newest end, doubled until its
    lines alone exceed the budget (a line costs at least one token, so `budget` bounds it)."""
    n_t = len(lines.timed)
    window = min(256, n_t)
    while window < n_t and window < budget:
        tail = [line + "\n" for line in _shown_all(lines.timed[n_t - window :])]
        if count(tail).sum() > budget:
            break
        window *= 2
    return max(0, min(window, n_t, budget))


def _newest(lines: _Lines, n: int) -> _Lines:
    """Only the newest `n` timed lines: every line costs at least one token, so no more can fit."""
    first = max(0, len(lines.timed) - n)
    if first == 0:
        return lines
    group0 = int(lines.line_group[first]) if first < len(lines.timed) else len(lines.full_headers)
    return _Lines(
        statics=lines.statics,
        timed=lines.timed[first:],
        line_group=lines.line_group[first:] - group0,
        full_headers=lines.full_headers[group0:],
        natural_headers=lines.natural_headers[group0:],
    )


def _shown_all(items: list[tuple[str, int]]) -> list[str]:
    return [_shown(line, count) for line, count in items]
