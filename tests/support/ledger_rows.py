"""Ledger rows for the tests: real receipts of a small record, signed with a test key."""

from __future__ import annotations

import base64
import dataclasses
import functools
import uuid
from datetime import UTC, datetime, timedelta

import numpy as np
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from medtpe.core.meds import SubjectEvents
from medtpe.core.meds.canonical import canonical_record, record_digest
from medtpe.ledger.receipt import (
    Receipt,
    prompt_ids_digest,
    rendering_digest,
    rendering_settings,
    utc_text,
)
from medtpe.ledger.signing import Signer
from medtpe.ledger.store import PredictionRow

RFC8037_SEED = "nWGxne_9WmC6hEr0kuwsxERJxWl7MmkZcDusAxyuf2A"
"""RFC 8037 Appendix A.1's Ed25519 private key `d`; A.3 gives its thumbprint."""
RFC8037_THUMBPRINT = "kPrK_qmxVWaYVA9wwBF6Iuo3vVzz7TxHCTwXBygrS4k"
RFC8037_SEED_B64 = base64.b64encode(base64.urlsafe_b64decode(RFC8037_SEED + "=")).decode()
SIGNER = Signer(Ed25519PrivateKey.from_private_bytes(bytes(range(32))))
START = datetime(2026, 11, 27, 3, 14, tzinfo=UTC)
DECODING = {
    "constrained": False,
    "max_new_tokens": 64,
    "n_samples": 1,
    "probabilities": True,
    "seed": None,
    "temperature": 0.0,
}


def events(subject_id: int = 7) -> SubjectEvents:
    """A small record: a static event, two labs, a note."""
    times = np.array(
        ["NaT", "2020-01-01T08:00", "2020-01-01T09:30:00.250", "2020-01-02T10:00"],
        dtype="datetime64[us]",
    )
    return SubjectEvents(
        subject_id,
        times,
        ["GENDER//F", "LAB//50912", "LAB//50912", "NOTE"],
        np.array([np.nan, 1.1, 0.1 + 0.2, np.nan]),
        [None, None, None, "stable, café"],
    )


RENDERING = rendering_settings(1, "b" * 64, 4096, "sliding", 24)
RECORD = canonical_record(events(), datetime(2020, 1, 2, 0, 0))


def receipt(index: int = 0, **changes: object) -> Receipt:
    """The receipt of prediction `index`, a typical `/predict` answer (ids, times, site and p
    differ by index)."""
    when = START + timedelta(milliseconds=index)
    fields: dict[str, object] = {
        "prediction_id": str(uuid.UUID(int=index + 1, version=4)),
        "created_at": utc_text(when),
        "task": "icu_mortality",
        "record_sha256": record_digest(events(), datetime(2020, 1, 2, 0, 0)),
        "prompt_ids_sha256": prompt_ids_digest(range(index, index + 500)),
        "artefact_digest": "a" * 64,
        "rendering": RENDERING,
        "rendering_digest": rendering_digest(RENDERING),
        "model": "smollm2-135m-instruct",
        "mode": "medtpe",
        "dtype": "float32",
        "decoding": DECODING,
        "engine_version": "vllm 0.0-test",
        "product_version": "0.1.0",
        "answer": "yes" if index % 2 else "no",
        "p_yes": 1 / (index + 3),
        "subject_id": "7",
        "prediction_time": utc_text(datetime(2020, 1, 2, 0, 0)),
        "door": "predict",
        "caller": "key:3f2a9c01",
        "site": "tenant-a" if index % 3 else None,
        "silent": False,
    }
    return Receipt(**(fields | changes))  # type: ignore[arg-type]


def row(index: int = 0, **changes: object) -> PredictionRow:
    """A signed row of `receipt(index)`, a typical `/predict` answer (`changes`: columns)."""
    return dataclasses.replace(_row(index), **changes)  # type: ignore[arg-type]


@functools.cache
def _row(index: int) -> PredictionRow:
    return PredictionRow.signed(
        receipt(index),
        SIGNER,
        format_ok=True,
        original_tokens=3_000 + index,
        medtpe_tokens=1_500,
        compression_rate=0.5,
        latency_ms=123.25,
        record=RECORD,
    )
