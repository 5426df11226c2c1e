"""One answer's ledger row from its facts (`inference.receipt_facts.answer_facts`, plain values):
the receipt's digests computed, the receipt signed, the row built. Every door writes its rows
through `answer_row`."""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

from ledger.receipt import (
    Receipt,
    prompt_ids_digest,
    rendering_digest,
    rendering_settings,
    utc_text,
)
from ledger.signing import Signer
from ledger.store import PredictionRow
from medtpe_core.meds.canonical import canonical_record, record_digest


def answer_row(
    facts: Mapping[str, Any],
    signer: Signer,
    *,
    door: str,
    caller: str,
    site: str | None = None,
    prediction_id: str | None = None,
    keep_record: bool = False,
    silent: bool = False,
) -> PredictionRow:
    """The signed row of the answer `facts` describes, asked by `caller` through `door`;
    `prediction_id`: a given id (a batch run's), else a new random one; `keep_record`: the
    canonical record kept in the row (`MEDTPE_LEDGER_RECORDS=store`)."""
    events, when, descriptions = facts["events"], facts["prediction_time"], facts["descriptions"]
    rendering = rendering_settings(**facts["rendering"])
    receipt = Receipt(
        prediction_id=prediction_id or str(uuid.uuid4()),
        created_at=utc_text(datetime.now(UTC)),
        task=facts["task"],
        record_sha256=record_digest(events, when, descriptions),
        prompt_ids_sha256=prompt_ids_digest(facts["prompt_ids"]),
        artefact_digest=facts["artefact_digest"],
        rendering=rendering,
        rendering_digest=rendering_digest(rendering),
        model=facts["model"],
        mode=facts["mode"],
        dtype=facts["dtype"],
        decoding=dict(facts["decoding"]),
        engine_version=facts["engine_version"],
        product_version=facts["product_version"],
        answer=facts["answer"],
        p_yes=facts["p_yes"],
    )
    return PredictionRow.signed(
        receipt,
        signer,
        door=door,
        caller=caller,
        site=site,
        subject_id=facts["subject_id"],
        prediction_time=when,
        format_ok=facts["format_ok"],
        original_tokens=facts["original_tokens"],
        medtpe_tokens=facts["medtpe_tokens"],
        compression_rate=facts["compression_rate"],
        latency_ms=facts["latency_ms"],
        record=canonical_record(events, when, descriptions) if keep_record else None,
        silent=silent,
    )
