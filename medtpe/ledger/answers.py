"""One answer's ledger rows from its facts (`medtpe.core.answer_facts.AnswerFacts`), in two
steps, each in one place: `ReceiptBasis.of` computes what the answer was derived from (the
receipt's digests and the row's figures), `ReceiptBasis.signed` signs it as one prediction (a new
id and time). A CDS card served from the score cache is a prediction shown again: a new row on
the cached basis (`ReceiptBasis.to_json` and `from_json` keep it as JSON values). Every door —
`/predict`, `/predict/batch`, the CDS hooks, the fidelity shadow, `medtpe predict` — writes its
rows through these, and `medtpe verify` re-derives a receipt's `Derivation` with `of`."""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from dataclasses import asdict, dataclass, fields
from datetime import UTC, datetime
from typing import Any

from medtpe.core.answer_facts import AnswerFacts
from medtpe.core.meds.canonical import canonical_record, record_digest
from medtpe.ledger.receipt import (
    Derivation,
    Receipt,
    prompt_ids_digest,
    rendering_digest,
    rendering_settings,
    utc_text,
)
from medtpe.ledger.signing import Signer
from medtpe.ledger.store import PredictionRow


@dataclass(frozen=True, kw_only=True)
class ReceiptBasis(Derivation):
    """What an answer's rows are built from: what the receipt signs (`Derivation`) and the
    row's figures, all JSON values."""

    subject_id: str
    prediction_time: str | None
    """UTC ISO 8601 (`utc_text`); None: every event was read."""
    format_ok: bool
    original_tokens: int
    medtpe_tokens: int
    compression_rate: float
    latency_ms: float
    record: str | None
    """The canonical record (`MEDTPE_LEDGER_RECORDS=store`), else None."""

    @classmethod
    def of(cls, facts: AnswerFacts, *, keep_record: bool = False) -> ReceiptBasis:
        """The basis of one answer's `facts`: the record, prompt and rendering hashed; with
        `keep_record` the canonical record kept."""
        events, when, descriptions = facts.events, facts.prediction_time, facts.descriptions
        settings = facts.rendering
        rendering = rendering_settings(
            settings.render_version,
            settings.descriptions_sha256,
            settings.max_input_tokens,
            settings.window_policy,
            settings.window_grid_hours,
            settings.prompt_layout,
            settings.shell_tokens,
        )
        record = canonical_record(events, when, descriptions).decode() if keep_record else None
        return cls(
            task=facts.task,
            record_sha256=record_digest(events, when, descriptions),
            prompt_ids_sha256=prompt_ids_digest(facts.prompt_ids),
            artefact_digest=facts.artefact_digest,
            rendering=rendering,
            rendering_digest=rendering_digest(rendering),
            model=facts.model,
            mode=facts.mode,
            dtype=facts.dtype,
            decoding=dict(facts.decoding),
            engine_version=facts.engine_version,
            product_version=facts.product_version,
            answer=facts.answer,
            p_yes=facts.p_yes,
            subject_id=facts.subject_id,
            prediction_time=None if when is None else utc_text(when),
            format_ok=facts.format_ok,
            original_tokens=facts.original_tokens,
            medtpe_tokens=facts.medtpe_tokens,
            compression_rate=facts.compression_rate,
            latency_ms=facts.latency_ms,
            record=record,
        )

    def signed(
        self,
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
        """The signed row of one prediction on this basis, asked by `caller` through `door`
        for `site` (the receipt signs them, with the basis' subject and prediction time, and
        `silent`: recorded, not shown); `prediction_id`: a given id (a batch run's) else a new
        random one; `latency_ms`: this answer's, when not the basis' (a card from the score
        cache); `shadow_of`: the prediction this row answers a second way (a fidelity
        shadow)."""
        receipt = Receipt.of(
            self,
            prediction_id=prediction_id or str(uuid.uuid4()),
            created_at=utc_text(datetime.now(UTC)),
            subject_id=self.subject_id,
            prediction_time=self.prediction_time,
            door=door,
            caller=caller,
            site=site,
            silent=silent,
        )
        return PredictionRow.signed(
            receipt,
            signer,
            format_ok=self.format_ok,
            original_tokens=self.original_tokens,
            medtpe_tokens=self.medtpe_tokens,
            compression_rate=self.compression_rate,
            latency_ms=self.latency_ms if latency_ms is None else latency_ms,
            record=None if self.record is None else self.record.encode(),
            shadow_of=shadow_of,
        )

    def to_json(self) -> dict[str, Any]:
        """The basis as JSON values (what the score cache keeps): `receipt`, what is signed,
        and `row`, the row's figures."""
        values = asdict(self)
        signed = {f.name for f in fields(Derivation)}
        return {
            "receipt": {name: value for name, value in values.items() if name in signed},
            "row": {name: value for name, value in values.items() if name not in signed},
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> ReceiptBasis:
        """The basis `to_json` gave (a field read from either part, so a figure signed since
        reads the same); a ValueError naming a missing, repeated or unknown field."""
        try:
            return cls(**data["receipt"], **data["row"])
        except KeyError as exc:
            raise ValueError(f"receipt basis: no {exc} part") from exc
        except TypeError as exc:
            raise ValueError(f"receipt basis: {exc}") from exc
