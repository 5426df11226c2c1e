"""What the engine's side knows of one answer, as the prediction ledger records it: the record
read, the prompt's ids, the model and its settings, the versions, the answer and the response's
figures. The inference layer gathers them (`medtpe.inference.receipt_facts.answer_facts`); the
ledger hashes and signs them (`medtpe.ledger.answers.ReceiptBasis.of`). Pure values, so both
layers share the type without importing each other."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from medtpe.core.meds.events import SubjectEvents


@dataclass(frozen=True, kw_only=True)
class RenderingFacts:
    """What turns a record into a prompt besides the record, under the option names a verifier
    configures a model with."""

    render_version: int
    descriptions_sha256: str
    """The code descriptions in use (their digest, `/readyz`'s `rendering.digest`)."""
    max_input_tokens: int
    """The input budget the prompt was built within."""
    window_policy: str
    window_grid_hours: int
    prompt_layout: str
    """Where the record sits in the prompt (`medtpe.core.prompt.layout.PromptLayout`)."""
    shell_tokens: int | None
    """`record-first`: the tokens the record's budget left for the text around it
    (`medtpe.core.prompt.Prompt.shell_tokens`); None in `task-first`."""


@dataclass(frozen=True, kw_only=True)
class AnswerFacts:
    """One answer to one record, as plain values (no digest computed yet)."""

    task: str
    subject_id: str
    """A FHIR record's Patient id, else the MEDS `subject_id`."""
    events: SubjectEvents
    prediction_time: datetime | None
    descriptions: Mapping[str, str] | None
    """A FHIR record's display texts (None: MEDS events)."""
    prompt_ids: Sequence[int]
    """The ids the engine read."""
    artefact_digest: str
    rendering: RenderingFacts
    model: str
    mode: str
    dtype: str
    """The dtype the engine ran in (`Engine.dtype`), never the option's `auto`."""
    decoding: Mapping[str, Any]
    """The decoding settings (`medtpe.inference.sampling.Sampling.as_dict`)."""
    engine_version: str
    product_version: str
    answer: Any
    """The answer's value (JSON), None when the model gave none."""
    p_yes: float | None
    format_ok: bool
    original_tokens: int
    medtpe_tokens: int
    compression_rate: float
    latency_ms: float
    """From the start of the record's work to the answer."""
