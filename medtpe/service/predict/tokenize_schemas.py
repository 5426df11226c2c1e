"""Request and response bodies of `/tokenize`: a text, or a record's full prompt, segmented by both
tokenizers (pydantic v2; a record's fields as `/predict` takes them, from `schemas`)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator, model_validator

from medtpe.core.meds.events import IsoTime
from medtpe.service.predict.schemas import (
    BUDGET,
    BUDGET_HELP,
    MAX_TASK_CHARS,
    Budget,
    Events,
    StrictBody,
    left_out,
    left_out_not_null,
    optional_task,
)


class TokenizeRequest(StrictBody):
    """Either a `text`, or `events` with their `task` (the full prompt is tokenized)."""

    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={
            "oneOf": [
                {
                    "required": ["text"],
                    "not": {"anyOf": [{"required": ["events"]}, {"required": [BUDGET]}]},
                },
                {"required": ["events", "task"], "not": {"required": ["text"]}},
            ]
        },
    )

    text: str | None = Field(
        None,
        description="A text to segment: at most `MEDTPE_MAX_TOKENIZE_TEXT_BYTES` UTF-8 bytes "
        "(64 KiB by default; 422 beyond).",
        json_schema_extra=left_out_not_null,
    )
    task: str | None = Field(
        None,
        max_length=MAX_TASK_CHARS,
        json_schema_extra=optional_task,
    )
    events: Events | None = Field(None, json_schema_extra=left_out_not_null)
    prediction_time: IsoTime | None = None
    max_input_tokens: Budget | None = Field(
        None,
        description=f"Only with `events`. {BUDGET_HELP}",
        json_schema_extra=left_out_not_null,
    )

    @model_validator(mode="before")
    @classmethod
    def _no_null(cls, data: object) -> object:
        """`text`, `task`, `events` and `max_input_tokens` are left out when unused, never null
        (as documented)."""
        return left_out(data, ("text", "task", "events", BUDGET))

    @model_validator(mode="after")
    def _text_or_record(self) -> TokenizeRequest:
        if (self.text is None) == (self.events is None):
            raise ValueError("give either `text` or `events` with `task`")
        if self.events is not None and self.task is None:
            raise ValueError("`events` need a `task`")
        return self

    @field_validator(BUDGET)
    @classmethod
    def _budget_of_a_record(cls, value: int | None, info: ValidationInfo) -> int | None:
        """A budget applies to a record's prompt: refused beside `text` (located at itself)."""
        if value is not None and info.data.get("text") is not None:
            raise ValueError("applies to `events`, not to `text`")
        return value


class TokenList(BaseModel):
    """One tokenizer's view of the text."""

    ids: list[int]
    tokens: list[str]
    count: int


class MergedToken(BaseModel):
    """A MedTPE token: the pair of tokens it stands for, and the base token whose id it reuses."""

    id: int
    pair: tuple[int, int] = Field(
        description="The ids it merges, left and right: base tokens or earlier MedTPE tokens."
    )
    pair_tokens: tuple[str, str] = Field(description="The text of each of `pair`.")
    base_ids: list[int] = Field(description="The original-tokenizer ids it spells.")
    reuses: str | None = Field(
        description="The text of the rare base token evicted for its id; null for a fresh id "
        "(an artefact without replacement)."
    )


class TokenizeResponse(BaseModel):
    """Both segmentations of the same text."""

    original: TokenList
    medtpe: TokenList
    compression_rate: float
    merged: list[MergedToken] = Field(
        default_factory=list,
        description="Each MedTPE token of `medtpe.ids` once, in order of first appearance.",
    )
    events: dict[str, int] | None = Field(
        None,
        description="For a record: `total` and `kept` within the input budget (the prompt "
        "says how many older events it leaves out); null for a text.",
    )
    max_input_tokens: int | None = Field(
        None, description="For a record: the input budget its prompt was built within."
    )
