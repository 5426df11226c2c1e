"""A prediction's receipt: what re-derives its answer — digests of the record, of the prompt the
engine read, of the artefact and of the rendering — with the model, the decoding settings and
the versions, and the answer itself; its canonical bytes are what the ledger's key signs
(`medtpe.ledger.signing`).

Canonical bytes: compact JSON (UTF-8, keys sorted, no spaces) of the fields the receipt's version
signs; times as UTC ISO 8601 with microseconds and `Z`, numbers by Python's `repr`. Equal receipts
give equal bytes, and any edited field other bytes.

Versions: 2 (written now) also signs the prediction's ledger columns of who asked, about whom, as
of when and whether it was shown (`PREDICTION_FIELDS`); 1 (written before) does not, and still
reads and verifies for what it signs."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field, fields
from datetime import UTC, datetime
from typing import Any

from medtpe.core.prompt.layout import LEGACY_LAYOUT

RECEIPT_VERSION = 2
"""The version of the receipts written now."""
PREDICTION_FIELDS = ("subject_id", "prediction_time", "door", "caller", "site", "silent")
"""The ledger columns of who asked (`caller`, through `door`, for `site`), about whom
(`subject_id`), as of when (`prediction_time`) and whether the answer was shown (`silent`): signed
since receipt version 2."""
READ_VERSIONS = (1, 2)
"""The receipt versions this release reads and verifies."""


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
    prompt_layout: str = LEGACY_LAYOUT,
    shell_tokens: int | None = None,
) -> dict[str, Any]:
    """What turns a record into a prompt besides the record: the renderer's version, the code
    descriptions in use (their digest, `/readyz`'s `rendering.digest`), the input budget, the
    windowing and, but for the `task-first` layout (which settings written before layouts were
    named mean), the prompt layout and its text's reserve, under their option names (`medtpe
    verify` configures a model with them)."""
    settings: dict[str, Any] = {
        "descriptions_sha256": descriptions_sha256,
        "max_input_tokens": int(max_input_tokens),
        "render_version": int(render_version),
        "window_grid_hours": int(window_grid_hours),
        "window_policy": str(window_policy),
    }
    if prompt_layout != LEGACY_LAYOUT:
        settings["prompt_layout"] = str(prompt_layout)
        settings["shell_tokens"] = None if shell_tokens is None else int(shell_tokens)
    return settings


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
    """What one answer was derived from, and the answer, as one prediction: its id and time,
    who asked it about whom, as of when, and whether it was shown (`PREDICTION_FIELDS`: None in
    a version 1 receipt, which does not sign them)."""

    prediction_id: str
    created_at: str
    """UTC ISO 8601 (`utc_text`)."""
    subject_id: str | None = None
    """Whom the answer is about: a FHIR record's Patient id, else the MEDS `subject_id`."""
    prediction_time: str | None = None
    """As of when, UTC ISO 8601 (`utc_text`); None in a version 2 receipt: every event was
    read."""
    door: str | None = None
    """Where the prediction came in (`medtpe.ledger.schema.DOORS`)."""
    caller: str | None = None
    """Who asked: the API key's id, a CDS issuer and tenant, `cli`."""
    site: str | None = None
    """The tenant or service the call was for (None in a version 2 receipt: none)."""
    silent: bool | None = None
    """Whether the answer was recorded and not shown (a shadow run)."""
    receipt_version: int = field(default=RECEIPT_VERSION)

    def __post_init__(self) -> None:
        if self.receipt_version not in READ_VERSIONS:
            raise _unread(self.receipt_version)
        if self.receipt_version == 1:
            given = [name for name in PREDICTION_FIELDS if getattr(self, name) is not None]
            if given:
                raise ValueError(f"receipt: version 1 signs no {', '.join(given)}")
            return
        for name, kind in (("subject_id", str), ("door", str), ("caller", str), ("silent", bool)):
            if not isinstance(getattr(self, name), kind):
                raise ValueError(
                    f"receipt: version {self.receipt_version} needs {name} ({kind.__name__})"
                )

    @classmethod
    def of(
        cls,
        derivation: Derivation,
        *,
        prediction_id: str,
        created_at: str,
        subject_id: str,
        prediction_time: str | None,
        door: str,
        caller: str,
        site: str | None,
        silent: bool,
    ) -> Receipt:
        """The receipt of prediction `prediction_id`, made at `created_at`, on `derivation`
        (its `Derivation` fields, whatever its own type adds), about `subject_id` as of
        `prediction_time`, asked by `caller` through `door` for `site`; `silent`: not shown."""
        signed = {f.name: getattr(derivation, f.name) for f in fields(Derivation)}
        return cls(
            prediction_id=prediction_id,
            created_at=created_at,
            subject_id=subject_id,
            prediction_time=prediction_time,
            door=door,
            caller=caller,
            site=site,
            silent=silent,
            **signed,
        )

    def signed_fields(self) -> tuple[str, ...]:
        """The fields this receipt's version signs (version 1: none of `PREDICTION_FIELDS`)."""
        return _SIGNED_FIELDS[self.receipt_version]

    def canonical(self) -> bytes:
        """The bytes that are signed (the fields as they are: `asdict`'s deep copy would give
        the same JSON at several times the cost)."""
        return canonical_json({name: getattr(self, name) for name in self.signed_fields()})

    def to_json(self) -> dict[str, Any]:
        """The receipt as a JSON object (a response's `receipt`): the fields it signs."""
        signed = self.signed_fields()
        return {name: value for name, value in asdict(self).items() if name in signed}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Receipt:
        """A receipt from its JSON object; a ValueError naming a missing or unknown field, or
        a version this release does not read."""
        names = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - names)
        if unknown:
            raise ValueError(f"receipt: unknown fields {unknown}")
        version = data.get("receipt_version")
        if type(version) is not int or version not in READ_VERSIONS:
            raise _unread(version)
        missing = sorted(set(_SIGNED_FIELDS[version]) - set(data))
        if missing:
            raise ValueError(f"receipt: version {version} misses fields {missing}")
        try:
            return cls(**data)
        except TypeError as exc:
            raise ValueError(f"receipt: {exc}") from exc

    @classmethod
    def from_text(cls, text: str | bytes) -> Receipt:
        """A receipt from its JSON text (a ledger row's `receipt`)."""
        return cls.from_json(json.loads(text))


def _unread(version: object) -> ValueError:
    return ValueError(
        f"receipt: version {version!r} is none this release reads "
        f"({', '.join(map(str, READ_VERSIONS))})"
    )


_SIGNED_FIELDS = {
    version: tuple(
        f.name for f in fields(Receipt) if version >= 2 or f.name not in PREDICTION_FIELDS
    )
    for version in READ_VERSIONS
}
