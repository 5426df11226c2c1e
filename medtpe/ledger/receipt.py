"""A prediction's receipt: what re-derives its answer — digests of the record, of the prompt the
engine read, of the artefact and of the rendering — with the model, the decoding settings and
the versions, and the answer itself; its canonical bytes are what the ledger's key signs
(`medtpe.ledger.signing`).

Canonical bytes: compact JSON (UTF-8, keys sorted, no spaces) of the receipt's fields; times as
UTC ISO 8601 with microseconds and `Z`, numbers by Python's `repr`. Equal receipts give equal
bytes, and any edited field other bytes."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field, fields
from datetime import UTC, datetime
from typing import Any

RECEIPT_VERSION = 1


def canonical_json(value: Any) -> bytes:
    """`value` as compact JSON with sorted keys (UTF-8; NaN and infinity refused)."""
    return json.dumps(
        value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False
    ).encode()


def sha256_hex(data: bytes) -> str:
    """SHA-256 of `data`, hexadecimal."""
    return hashlib.sha256(data).hexdigest()


def prompt_ids_digest(ids: Sequence[int]) -> str:
    """SHA-256 of the engine's prompt ids as a canonical JSON list (`[1,2,3]`)."""
    return sha256_hex(canonical_json([int(i) for i in ids]))


def rendering_settings(
    render_version: int,
    descriptions_sha256: str,
    max_input_tokens: int,
    window_policy: str,
    window_grid_hours: int,
) -> dict[str, Any]:
    """What turns a record into a prompt besides the record: the renderer's version, the code
    descriptions in use (their digest, `/readyz`'s `rendering.digest`), the input budget and the
    windowing, under their option names (`medtpe verify` configures a model with them)."""
    return {
        "descriptions_sha256": descriptions_sha256,
        "max_input_tokens": int(max_input_tokens),
        "render_version": int(render_version),
        "window_grid_hours": int(window_grid_hours),
        "window_policy": str(window_policy),
    }


def rendering_digest(settings: Mapping[str, Any]) -> str:
    """SHA-256 of `rendering_settings`' canonical JSON."""
    return sha256_hex(canonical_json(dict(settings)))


def utc_text(when: datetime) -> str:
    """`when` as UTC ISO 8601 with microseconds and `Z` (a naive time is taken as UTC)."""
    if when.tzinfo is not None:
        when = when.astimezone(UTC).replace(tzinfo=None)
    return when.isoformat(timespec="microseconds") + "Z"


@dataclass(frozen=True, kw_only=True)
class Derivation:
    """What one answer was derived from, and the answer: what a receipt signs besides its
    prediction's id and time. A field declared here is signed by every receipt from then on
    (`Receipt.of` copies each; `medtpe.ledger.answers.ReceiptBasis` extends this type with the
    row's figures, so moving a figure here signs it)."""

    task: str
    record_sha256: str
    """SHA-256 of the canonical record (`medtpe.core.meds.canonical`)."""
    prompt_ids_sha256: str
    """SHA-256 of the ids the engine read (`prompt_ids_digest`)."""
    artefact_digest: str
    """The MedTPE artefact's content digest (its manifest's `content_digest`)."""
    rendering: dict[str, Any]
    """`rendering_settings`: the renderer, descriptions, budget and windowing used."""
    rendering_digest: str
    """`rendering_digest(rendering)`."""
    model: str
    mode: str
    dtype: str
    """The dtype the engine ran in, as it resolved `auto` (p("yes") moves with it: bfloat16
    puts it on steps of 0.02–0.04); receipts written before it was resolved say `auto`."""
    decoding: dict[str, Any]
    """The decoding settings (`medtpe.inference.sampling.Sampling.as_dict`)."""
    engine_version: str
    product_version: str
    answer: Any
    """The answer's value (JSON), None when the model gave none."""
    p_yes: float | None


@dataclass(frozen=True, kw_only=True)
class Receipt(Derivation):
    """What one answer was derived from, and the answer, as one prediction: its id and time."""

    prediction_id: str
    created_at: str
    """UTC ISO 8601 (`utc_text`)."""
    receipt_version: int = field(default=RECEIPT_VERSION)

    @classmethod
    def of(cls, derivation: Derivation, *, prediction_id: str, created_at: str) -> Receipt:
        """The receipt of prediction `prediction_id`, made at `created_at`, on `derivation`
        (its `Derivation` fields, whatever its own type adds)."""
        signed = {f.name: getattr(derivation, f.name) for f in fields(Derivation)}
        return cls(prediction_id=prediction_id, created_at=created_at, **signed)

    def canonical(self) -> bytes:
        """The bytes that are signed (the fields as they are: `asdict`'s deep copy would give
        the same JSON at several times the cost)."""
        return canonical_json({f.name: getattr(self, f.name) for f in fields(self)})

    def to_json(self) -> dict[str, Any]:
        """The receipt as a JSON object (a response's `receipt`)."""
        return asdict(self)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Receipt:
        """A receipt from its JSON object; a ValueError naming a missing or unknown field."""
        names = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - names)
        if unknown:
            raise ValueError(f"receipt: unknown fields {unknown}")
        try:
            return cls(**data)
        except TypeError as exc:
            raise ValueError(f"receipt: {exc}") from exc

    @classmethod
    def from_text(cls, text: str | bytes) -> Receipt:
        """A receipt from its JSON text (a ledger row's `receipt`)."""
        return cls.from_json(json.loads(text))
