"""The score cache: a record's answer kept under its patient and record digest, so a hook that
asks again about an unchanged record (the chart opened twice, `patient-view` then
`encounter-start`) answers without the model.

The digest covers every event of the record (times, codes, values), the prediction time, the
task and the model that answered: any new observation, another task or another artefact is a new
key. A record sent as FHIR is also kept under a digest of its resources' JSON text
(`texts_digest`), so the same resources sent again find their score before being mapped.
Entries expire after a time to live and the least recently used go first beyond a size
limit. One cache per API process, held in memory (nothing is written to disk).
"""

from __future__ import annotations

import hashlib
import time
from collections import OrderedDict
from collections.abc import Callable, Hashable, Sequence
from datetime import datetime
from typing import Generic, TypeVar

import msgspec
import numpy as np

from medtpe_core.meds import SubjectEvents

V = TypeVar("V")


def record_digest(events: SubjectEvents, prediction_time: datetime | None, *parts: str) -> str:
    """SHA-256 (hex) of a record's events, its prediction time and `parts` (task, model...).

    Cost: one pass over the columns' bytes (about a millisecond for 10,000 events).

    >>> from medtpe_core.meds import MedsEvent
    >>> e = SubjectEvents.from_events([MedsEvent(subject_id=1, time=None, code="A")])
    >>> record_digest(e, None, "t") == record_digest(e, None, "t") != record_digest(e, None, "u")
    True
    """
    digest = hashlib.sha256()
    digest.update(events.times.astype("datetime64[us]").tobytes())
    digest.update(events.numeric_values.astype("float64").tobytes())
    digest.update(msgspec.json.encode([list(events.codes), list(events.text_values)]))
    when = prediction_time.isoformat() if prediction_time is not None else None
    digest.update(msgspec.json.encode([events.subject_id, when, parts]))
    return digest.hexdigest()


def texts_digest(texts: Sequence[bytes], *parts: str) -> str:
    """SHA-256 (hex) of a sequence of texts (and of their lengths) and `parts`: the key of
    a record as it was sent (its resources' JSON text), before anything is decoded.

    Cost: hashing the bytes (a few milliseconds for the 2.5 MB of a long ICU stay's prefetch).

    >>> texts_digest([b"ab", b"c"]) != texts_digest([b"a", b"bc"])
    True
    """
    digest = hashlib.sha256(b"".join(texts))
    digest.update(np.array([len(text) for text in texts], dtype=np.int64).tobytes())
    digest.update(msgspec.json.encode(parts))
    return digest.hexdigest()


class ScoreCache(Generic[V]):
    """At most `max_entries` values, each for `ttl_s` seconds after it was stored."""

    def __init__(
        self, max_entries: int, ttl_s: float, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.max_entries = max_entries
        self.ttl_s = ttl_s
        self._clock = clock
        self._entries: OrderedDict[Hashable, tuple[float, V]] = OrderedDict()

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, key: Hashable) -> V | None:
        """The live value under `key` (now the most recently used), else None."""
        entry = self._entries.get(key)
        if entry is None:
            return None
        stored, value = entry
        if self._clock() - stored > self.ttl_s:
            del self._entries[key]
            return None
        self._entries.move_to_end(key)
        return value

    def put(self, key: Hashable, value: V) -> None:
        """Store `value`, dropping the least recently used entries beyond the size limit."""
        if self.max_entries <= 0:
            return
        self._entries[key] = (self._clock(), value)
        self._entries.move_to_end(key)
        while len(self._entries) > self.max_entries:
            self._entries.popitem(last=False)
