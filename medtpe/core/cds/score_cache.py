"""The score cache: a record's answer kept under its patient and record digest, so a hook that
asks again about an unchanged record (the chart opened twice, `patient-view` then
`encounter-start`) answers without the model.

The digest covers every event of the record (times, codes, values), the prediction time, the
task and the model that answered: any new observation, another task or another artefact is a new
key. A record sent as FHIR is also kept under a digest of its resources' JSON text
(`texts_digest`), so the same resources sent again find their score before being mapped.
The cache itself is the service's (medtpe/service/cds_hooks/state_store.py: in each API process's
memory, or on a Redis or Valkey server every process and replica shares), keyed by these digests.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from datetime import datetime

import msgspec
import numpy as np

from medtpe.core.meds.events import SubjectEvents


def record_digest(events: SubjectEvents, prediction_time: datetime | None, *parts: str) -> str:
    """SHA-256 (hex) of a record's events, its prediction time and `parts` (task, model...).

    Cost: one pass over the columns' bytes (about a millisecond for 10,000 events).

    >>> from medtpe.core.meds.events import MedsEvent
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
