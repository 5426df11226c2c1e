"""One answer's ledger row from its facts (`medtpe.inference.receipt_facts.answer_facts`, plain
values), in two steps: `receipt_basis` computes what the answer was derived from (the receipt's
digests and the row's figures, as JSON values a score cache can keep), `basis_row` signs it as one
prediction (a new id and time): an answer's row is `basis_row(receipt_basis(facts), ...)`. A
CDS card served from the score cache is a prediction shown again: a new row on the cached
basis. Every door writes its rows through these."""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

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

_RECEIPT_FACTS = (
    "task", "artefact_digest", "model", "mode", "dtype", "engine_version", "product_version",
    "answer", "p_yes",
)  # fmt: skip
_ROW_FACTS = (
    "subject_id", "format_ok", "original_tokens", "medtpe_tokens", "compression_rate",
    "latency_ms",
)  # fmt: skip


def receipt_basis(facts: Mapping[str, Any], *, keep_record: bool = False) -> dict[str, Any]:
    """What an answer was derived from, as JSON values: `receipt` (the receipt's fields but its
    id and time: digests of the record, prompt and rendering computed) and `row` (the row's
    figures; with `keep_record` the canonical record, `MEDTPE_LEDGER_RECORDS=store`)."""
    events, when, descriptions = facts["events"], facts["prediction_time"], facts["descriptions"]
    rendering = rendering_settings(**facts["rendering"])
    receipt = {name: facts[name] for name in _RECEIPT_FACTS}
    receipt |= {
        "record_sha256": record_digest(events, when, descriptions),
        "prompt_ids_sha256": prompt_ids_digest(facts["prompt_ids"]),
        "rendering": rendering,
        "rendering_digest": rendering_digest(rendering),
        "decoding": dict(facts["decoding"]),
    }
    row = {name: facts[name] for name in _ROW_FACTS}
    row["prediction_time"] = None if when is None else utc_text(when)
    row["record"] = canonical_record(events, when, descriptions).decode() if keep_record else None
    return {"receipt": receipt, "row": row}


def basis_row(
    basis: Mapping[str, Any],
    signer: Signer,
    *,
    door: str,
    caller: str,
    site: str | None = None,
    prediction_id: str | None = None,
    latency_ms: float | None = None,
    silent: bool = False,
    shadow_of: str | None = None,
) -> PredictionRow:
    """The signed row of one prediction on `basis` (`receipt_basis`), asked by `caller` through
    `door`; `prediction_id`: a given id (a batch run's) else a new random one; `latency_ms`: this
    answer's, when not the basis' (a card from the score cache); `silent`: recorded, not shown;
    `shadow_of`: the prediction this row answers a second way (a fidelity shadow)."""
    receipt = Receipt(
        prediction_id=prediction_id or str(uuid.uuid4()),
        created_at=utc_text(datetime.now(UTC)),
        **basis["receipt"],
    )
    row = basis["row"]
    when = row["prediction_time"]
    record = row["record"]
    return PredictionRow.signed(
        receipt,
        signer,
        door=door,
        caller=caller,
        site=site,
        subject_id=row["subject_id"],
        prediction_time=None if when is None else datetime.fromisoformat(when.removesuffix("Z")),
        format_ok=row["format_ok"],
        original_tokens=row["original_tokens"],
        medtpe_tokens=row["medtpe_tokens"],
        compression_rate=row["compression_rate"],
        latency_ms=row["latency_ms"] if latency_ms is None else latency_ms,
        record=None if record is None else record.encode(),
        silent=silent,
        shadow_of=shadow_of,
    )
