"""The signed receipt both doors (`/predict`, the CDS hooks) carry with an answer: its response
model and its body from a ledger row."""

from __future__ import annotations

import json
from typing import Any

from pydantic import BaseModel, Field

from medtpe.ledger.store import PredictionRow


class SignedReceipt(BaseModel):
    """What an answer was derived from, signed by the service (docs/ledger.md): `receipt`'s
    canonical JSON (UTF-8, keys sorted, no spaces) verifies against `signature` with the
    Ed25519 key `GET /ledger/public-key` publishes."""

    receipt: dict[str, Any] = Field(
        description="The receipt: `prediction_id`, `created_at`, `task`, the SHA-256 of the "
        "record (`record_sha256`), of the prompt's ids, the artefact's digest, the rendering "
        "and its digest, model, mode, dtype, decoding settings, engine and product versions, "
        "`answer` and `p_yes`; who asked it about whom, as of when and whether it was shown "
        "(`subject_id`, `prediction_time`, `door`, `caller`, `site`, `silent`); "
        "`receipt_version` (2)."
    )
    signature: str = Field(
        description="Ed25519 signature of the receipt's canonical JSON, base64url."
    )
    key_id: str = Field(description="The signing key's id (the public key's `kid`).")


def receipt_body(row: PredictionRow) -> SignedReceipt:
    """A ledger row's signed receipt as a response carries it."""
    return SignedReceipt(
        receipt=json.loads(row.receipt), signature=row.signature, key_id=row.key_id
    )
