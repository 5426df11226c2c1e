"""Request and response bodies of the HTTP API (pydantic v2; events use the MEDS model)."""

from __future__ import annotations

from datetime import datetime

from pydantic import BaseModel, ConfigDict, Field, model_validator

from inference.model import ModelIdentity
from medtpe_core.meds import MAX_EVENTS_PER_RECORD, MedsEvent
from medtpe_core.tasks import Prediction


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class PredictOptions(_Strict):
    """Sampling options of one prediction."""

    n_samples: int = Field(1, ge=1, description="Answers generated; the majority wins.")
    temperature: float | None = Field(
        None, ge=0.0, le=2.0, description="Sampling temperature (default: the service's)."
    )
    return_text: bool = Field(False, description="Include each sample's generated text.")
    return_probabilities: bool = Field(
        False,
        description="Include the answer options' probabilities from the first answer token "
        "(tasks with a closed set of options: yes/no, option letters).",
    )
    constrained: bool = Field(
        False,
        description="Constrain decoding to a well-formed answer (vLLM structured outputs): "
        "every answer parses; option probabilities come from the masked distribution.",
    )


class PredictRequest(_Strict):
    """One record and the task to predict."""

    task: str = Field(description="Task name, e.g. `icu_mortality`.")
    events: list[MedsEvent] = Field(min_length=1, max_length=MAX_EVENTS_PER_RECORD)
    prediction_time: datetime | None = Field(
        None,
        description="Events after it are ignored (MEDS: up to and including it is used); "
        "default: just after the last event.",
    )
    options: PredictOptions = Field(default_factory=PredictOptions)

    @model_validator(mode="after")
    def _one_subject(self) -> PredictRequest:
        if len({event.subject_id for event in self.events}) > 1:
            raise ValueError("all events of a record must have the same subject_id")
        return self


class BatchRequest(_Strict):
    """Several records, generated concurrently."""

    records: list[PredictRequest] = Field(min_length=1)


class TokenCounts(BaseModel):
    """Prompt length under both tokenizers."""

    original: int
    medtpe: int
    compression_rate: float
    generated: int = Field(description="Answer tokens generated (all samples).")


class Latency(BaseModel):
    """Where the time of one record went, in milliseconds."""

    render: float
    tokenize: float
    generate: float
    total: float


class Vote(BaseModel):
    """One sample's parsed answer (and text when asked for)."""

    prediction: Prediction | None
    format_ok: bool
    text: str | None = None


class PredictResponse(BaseModel):
    """The prediction for one record."""

    task: str
    prediction: Prediction | None
    format_ok: bool
    votes: list[Vote]
    probabilities: dict[str, float] | None = Field(
        None,
        description="{option: probability} from the first answer token's top-20 logprobs, "
        "when asked for; null otherwise, for multilabel tasks or when no top token spells an "
        "option.",
    )
    prediction_time: datetime | None
    events: dict[str, int] = Field(description="`total` and `kept` within the input budget.")
    tokens: TokenCounts
    latency_ms: Latency
    model: ModelIdentity = Field(description="The model, mode and artefact that answered.")


class BatchResponse(BaseModel):
    """Predictions in request order."""

    results: list[PredictResponse]


class TokenizeRequest(_Strict):
    """Either a `text`, or `events` with their `task` (the full prompt is tokenized)."""

    text: str | None = None
    task: str | None = None
    events: list[MedsEvent] | None = Field(None, min_length=1, max_length=MAX_EVENTS_PER_RECORD)
    prediction_time: datetime | None = None

    @model_validator(mode="after")
    def _text_or_record(self) -> TokenizeRequest:
        if (self.text is None) == (self.events is None):
            raise ValueError("give either `text` or `events` with `task`")
        if self.events is not None and self.task is None:
            raise ValueError("`events` need a `task`")
        return self


class TokenList(BaseModel):
    """One tokenizer's view of the text."""

    ids: list[int]
    tokens: list[str]
    count: int


class TokenizeResponse(BaseModel):
    """Both segmentations of the same text."""

    original: TokenList
    medtpe: TokenList
    compression_rate: float


class ErrorItem(BaseModel):
    """One problem with a request, located by its field path."""

    loc: list[str | int]
    msg: str
    type: str


class ErrorResponse(BaseModel):
    """Body of every 4xx/5xx answer."""

    error: str
    detail: list[ErrorItem] | str
