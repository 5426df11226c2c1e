"""Window policies: which stretch of a record a budgeted prompt shows.

Contract:

- `sliding` (the paper's): the newest events that fit the budget. Every appended event pushes
  the oldest shown one out, so the start of the record text (and of everything after it) changes
  with each re-score of a growing record, and the engine's prefix cache cannot serve it.
- `stable`: the window starts at the earliest boundary of a grid of `grid_hours` hours from
  which the record fits the budget. Boundaries are UTC multiples of `grid_hours` counted from
  1970-01-01 00:00 (24: calendar days; a divisor of 24 keeps them at the same clock times every
  day). The start depends on the request alone (no state is kept between requests) and stays
  where it is while the record keeps fitting; when it no longer does, it jumps to the next
  boundary that fits. Re-scores between two jumps share every token of their prompt up to the
  newest events. When not even the last boundary before the newest event fits (one grid cell
  holds more than the budget), the newest events of that cell that fit are kept.
- A record that fits whole is shown whole under both policies.
- Rendered under `stable` (see `medtpe.core.prompt.render.render_record`'s `window_start`): the
  "(earlier events omitted)" line carries no count (the count of events before the start
  depends on how much history the client sent: a client sending its last N events or last 7
  days would change it on every re-score), and the Age line gives the age at the start, so
  appending events, or sending a bounded history, never changes the text before the newest
  events.
- The price: the events between the sliding window's first event and the next boundary, fewer
  than one grid cell's worth (`tools/benchmarks/bench_rescore.py` measures it).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import datetime
from enum import StrEnum

import numpy as np

from medtpe.core.declared import described
from medtpe.core.meds.events import SubjectEvents

_MICROSECONDS_PER_HOUR = 3_600_000_000


class WindowPolicy(StrEnum):
    """How the window of a record that exceeds the budget is chosen."""

    SLIDING = "sliding"
    STABLE = "stable"


DEFAULT_GRID_HOURS = 6


@dataclass(frozen=True)
class Windowing:
    """A window policy and, for `stable`, the grid its start moves on."""

    policy: WindowPolicy = field(
        default=WindowPolicy.SLIDING,
        metadata=described(
            "Which events of a record over the budget the prompt shows: `sliding` (the newest "
            "that fit) or `stable` (a start on a grid that moves only when the record no longer "
            "fits, so hourly re-scores hit the prefix cache); medtpe/core/prompt/windowing.py."
        ),
    )
    grid_hours: int = field(
        default=DEFAULT_GRID_HOURS,
        metadata=described("Grid of the `stable` window's start, in hours (UTC boundaries)."),
    )

    def __post_init__(self) -> None:
        if self.grid_hours < 1:
            raise ValueError(f"grid_hours must be at least 1, not {self.grid_hours}")


SLIDING_WINDOW = Windowing()
"""The paper's policy: the newest events that fit."""


def window_events(events: SubjectEvents, start: datetime) -> SubjectEvents:
    """The static events and the timed events at or after `start`."""
    cutoff = np.datetime64(start, "us")
    return events.take(np.isnat(events.times) | (events.times >= cutoff))


def _grid_ceil(time: np.datetime64, grid_us: int) -> np.datetime64:
    ticks = time.astype("datetime64[us]").astype(np.int64)
    return np.datetime64(int(-(-ticks // grid_us) * grid_us), "us")


def _grid_floor(time: np.datetime64, grid_us: int) -> np.datetime64:
    ticks = time.astype("datetime64[us]").astype(np.int64)
    return np.datetime64(int(ticks // grid_us * grid_us), "us")


def stable_starts(events: SubjectEvents, n_kept: int, grid_hours: int) -> Iterator[datetime]:
    """Candidate starts of the stable window, earliest first, for `events` (already cut at the
    prediction time) of which a newest-first fit keeps `n_kept` (static events first).

    The earliest boundary that can fit is the first at or after the sliding window's first
    event: an earlier one shows every event the sliding window shows and more. The caller takes
    the first candidate whose window fits whole, else the last (one cell, fitted newest-first).
    Nothing is yielded when the sliding fit keeps every event or not every static one.
    """
    timed = ~np.isnat(events.times)
    n_static = int((~timed).sum())
    n_timed_kept = n_kept - n_static
    if n_kept >= len(events) or n_timed_kept <= 0:
        return
    times = events.times[timed]
    grid_us = grid_hours * _MICROSECONDS_PER_HOUR
    first_kept = times[len(times) - n_timed_kept]
    start, last = _grid_ceil(first_kept, grid_us), times[-1]
    if start > last:
        start = _grid_floor(last, grid_us)
    step = np.timedelta64(grid_us, "us")
    while start <= last:
        yield start.astype(datetime)
        start += step
