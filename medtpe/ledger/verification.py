"""Checking a ledger row: its signature and, column by column, its agreement with its receipt
(`check_row`: every column the receipt's version signs), then what was re-derived from the
record, the artefact and the engine against what the receipt says (`compare`). Each check names
the part that differs: signature invalid, row edited (and which columns), record changed,
artefact changed, rendering changed, prompt changed, dtype changed, engine drifted.

Re-deriving (reading the record, re-preparing the prompt, re-running the engine) needs the
inference layer: the command line does it (`medtpe verify`) and hands the result here, the
`Derivation` its doors would sign (`medtpe.ledger.answers.ReceiptBasis.of`)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from medtpe.ledger.receipt import (
    PREDICTION_FIELDS,
    Derivation,
    Receipt,
    canonical_json,
    utc_text,
)
from medtpe.ledger.signing import verify_signature

if TYPE_CHECKING:
    from medtpe.ledger.store import PredictionRow

AUTO = "auto"
"""The dtype of a receipt written before receipts named the dtype the engine ran in."""
P_TOLERANCE = 0.02
"""Largest |Δp("yes")| of a re-run taken as the same: a float32 re-run of a float32 answer moves p
by float noise only; bfloat16 puts p on steps of 0.02–0.04 (re-run in the receipt's dtype)."""


@dataclass(frozen=True)
class Check:
    """One comparison: which part, whether it holds, in words."""

    part: str
    ok: bool
    detail: str


SIGNED_COLUMNS = ("prediction_id", "created_at", "task", "mode", "answer", "p_yes")
"""The `predictions` columns every receipt signs; since version 2 also `PREDICTION_FIELDS`."""


def signed_columns(receipt: Receipt) -> tuple[str, ...]:
    """The `predictions` columns `receipt` signs (its version's)."""
    signed = receipt.signed_fields()
    return SIGNED_COLUMNS + tuple(name for name in PREDICTION_FIELDS if name in signed)


def check_row(
    row: PredictionRow, public_key: Ed25519PublicKey
) -> tuple[Receipt | None, list[Check]]:
    """The row's receipt (None when it cannot be read), whether it is signed by `public_key`,
    and whether each column the receipt signs says what it signs; a receipt of a version that
    signs fewer columns gets a `coverage` line naming the columns it leaves unchecked."""
    try:
        receipt = Receipt.from_text(row.receipt)
    except ValueError as exc:
        return None, [
            Check("signature", False, f"signature invalid: the receipt is unreadable ({exc})")
        ]
    signed = verify_signature(receipt, row.signature, public_key)
    checks = [
        Check(
            "signature",
            signed,
            "signature valid"
            if signed
            else "signature invalid: the receipt was edited or signed by another key",
        )
    ]
    columns = signed_columns(receipt)
    edited = sorted(
        name
        for name in columns
        if _column_text(row, name) != canonical_json(getattr(receipt, name)).decode()
    )
    checks.append(
        Check(
            "row",
            not edited,
            f"the row's {len(columns)} signed columns say what its receipt signs"
            if not edited
            else f"row edited: {', '.join(edited)} differ from the signed receipt",
        )
    )
    unsigned = [name for name in PREDICTION_FIELDS if name not in columns]
    if unsigned:
        checks.append(
            Check(
                "coverage",
                True,
                f"receipt version {receipt.receipt_version} does not sign "
                f"{', '.join(unsigned)}: those columns are not checked",
            )
        )
    return receipt, checks


def _column_text(row: PredictionRow, name: str) -> str:
    """Column `name` of `row` as a receipt writes it: canonical JSON (`answer` is stored so),
    times as `utc_text`; a value no receipt holds (NaN) as its `repr`, which no receipt's text
    equals."""
    value = getattr(row, name)
    if name == "answer":
        return value
    if isinstance(value, datetime):
        value = utc_text(value)
    try:
        return canonical_json(value).decode()
    except ValueError:
        return repr(value)


def compare(receipt: Receipt, again: Derivation, p_tolerance: float = P_TOLERANCE) -> list[Check]:
    """The re-derived prediction (`again`: what its answer now derives from, its dtype the one
    the re-run's engine ran in) against its receipt, part by part: the inputs (record, artefact,
    rendering), the prompt they give, the engine's dtype, answer and p("yes")."""
    checks = [
        _same("record", receipt.record_sha256, again.record_sha256, "record changed"),
        _same("artefact", receipt.artefact_digest, again.artefact_digest, "artefact changed"),
        _same(
            "rendering",
            receipt.rendering_digest,
            again.rendering_digest,
            "rendering changed (renderer version, code descriptions, budget or windowing)",
        ),
    ]
    inputs_same = all(check.ok for check in checks)
    prompt = receipt.prompt_ids_sha256 == again.prompt_ids_sha256
    checks.append(
        Check(
            "prompt",
            prompt,
            "same prompt"
            if prompt
            else "prompt changed: "
            + (
                "the same inputs give other ids (renderer or tokenizer code)"
                if inputs_same
                else "its inputs differ"
            ),
        )
    )
    checks.append(_dtype_check(receipt.dtype, again.dtype))
    same_answer = canonical_json(receipt.answer) == canonical_json(again.answer)
    checks.append(
        Check(
            "answer",
            same_answer,
            "same answer"
            if same_answer
            else f"engine drifted: answer {again.answer!r}, the receipt's {receipt.answer!r}",
        )
    )
    checks.append(_p_check(receipt.p_yes, again.p_yes, p_tolerance))
    return checks


def _same(part: str, signed: str, found: str, difference: str) -> Check:
    if signed == found:
        return Check(part, True, f"same {part} (sha256 {found[:12]})")
    return Check(part, False, f"{difference}: sha256 {found[:12]}, the receipt's {signed[:12]}")


def _dtype_check(signed: str, ran: str) -> Check:
    if signed == ran:
        return Check("dtype", True, f"same dtype ({ran})")
    if signed == AUTO:
        return Check(
            "dtype",
            True,
            f"re-run in {ran}; the receipt says auto (written before receipts named the dtype "
            "that ran: `--dtype` names it)",
        )
    return Check("dtype", False, f"dtype changed: re-run in {ran}, the receipt's {signed}")


def _p_check(signed: float | None, found: float | None, tolerance: float) -> Check:
    if signed is None or found is None:
        ok = signed is None and found is None
        detail = (
            "no p(yes) either time"
            if ok
            else f"engine drifted: p(yes) {found}, the receipt's {signed}"
        )
        return Check("p_yes", ok, detail)
    delta = abs(found - signed)
    if delta <= tolerance:
        return Check("p_yes", True, f"|Δp(yes)| = {delta:.2g} ≤ {tolerance}")
    return Check(
        "p_yes",
        False,
        f"engine drifted: |Δp(yes)| = {delta:.3g} > {tolerance} ({found:.4f}, the "
        f"receipt's {signed:.4f})",
    )
