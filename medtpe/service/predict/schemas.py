"""Request and response bodies of the HTTP API (pydantic v2; events use the MEDS model), the
errors and probe answers it documents; `/tokenize`'s bodies are in `tokenize_schemas`, built from
the request parts here."""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime
from typing import Annotated, Any

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    GetCoreSchemaHandler,
    PlainSerializer,
    StrictBool,
    ValidationError,
    ValidatorFunctionWrapHandler,
    model_validator,
)
from pydantic.json_schema import WithJsonSchema
from pydantic_core import InitErrorDetails, PydanticCustomError, core_schema

from medtpe.core.fhir.parsing import BUNDLE_TYPES
from medtpe.core.meds.events import (
    MAX_EVENTS_PER_RECORD,
    IsoTime,
    JsonInt,
    MedsEvent,
    SubjectEvents,
)
from medtpe.core.tasks import Prediction
from medtpe.inference.model import ModelIdentity
from medtpe.inference.sampling import Sampling
from medtpe.service.plumbing.receipts import SignedReceipt
from medtpe.service.predict.task_choice import (
    TASK_OR_TASKS,
    OptionalTask,
    OptionalTasks,
    check_task_choice,
    left_out_not_null,
)

MAX_EVENT_CODE_BYTES = 1024
"""Longest event `code`, in UTF-8 bytes."""
MAX_EVENT_TEXT_BYTES = 64 * 1024
"""Longest event `text_value`, in UTF-8 bytes."""
BUDGET = "max_input_tokens"
"""The name of the per-request input budget field (`PredictOptions`, `TokenizeRequest`)."""


def left_out(data: object, names: tuple[str, ...]) -> object:
    """A request body whose optional fields `names` are left out when unused, never null."""
    if isinstance(data, dict):
        for name in names:
            if name in data and data[name] is None:
                raise ValueError(f"`{name}` must be left out, not null")
    return data


class StrictBody(BaseModel):
    """A request body: unknown fields are refused."""

    model_config = ConfigDict(extra="forbid")


UtcTime = Annotated[datetime, PlainSerializer(lambda t: t.isoformat() + "Z", return_type=str)]
"""A MEDS time (naive, UTC) answered in RFC 3339 with its `Z`."""


def _columns(value: object, validate: ValidatorFunctionWrapHandler) -> object:
    """A record's events as sorted columns: as they are when the body's decoder already built
    them (`medtpe.service.plumbing.json_body`), else validated event by event and converted. Events
    of several subjects are refused at the first event whose `subject_id` differs from the first
    event's."""
    if isinstance(value, SubjectEvents):
        return _within_text_caps(value)
    events: list[MedsEvent] = validate(value)
    subject_id = events[0].subject_id
    other = next((i for i, e in enumerate(events) if e.subject_id != subject_id), None)
    if other is not None:
        error = PydanticCustomError(
            "several_subjects",
            "all events of a record must have the same subject_id: event {index} differs from "
            "event 0",
            {"index": other},
        )
        where = (other, "subject_id")
        detail = InitErrorDetails(type=error, loc=where, input=events[other].subject_id)
        raise ValidationError.from_exception_data("events", [detail])
    return _within_text_caps(SubjectEvents.from_events(events))


def _over(text: str | None, limit: int) -> bool:
    """Whether `text` holds more than `limit` UTF-8 bytes (encoded only when it might)."""
    return text is not None and len(text) * 4 > limit and len(text.encode()) > limit


def _within_text_caps(events: SubjectEvents) -> SubjectEvents:
    """`events`, once no `code` holds over `MAX_EVENT_CODE_BYTES` bytes and no `text_value` over
    `MAX_EVENT_TEXT_BYTES`; else a validation error naming the field (`[..., events, code]`: the
    events are sorted by time by now, so no request index is at hand)."""
    for field, column, limit in (
        ("code", events.codes, MAX_EVENT_CODE_BYTES),
        ("text_value", events.text_values, MAX_EVENT_TEXT_BYTES),
    ):
        # a character takes at most 4 UTF-8 bytes: only a column whose longest text might be
        # over the limit is looked at text by text
        longest = max(map(len, filter(None, column)), default=0)
        if longest * 4 > limit and any(_over(text, limit) for text in column):
            message = "an event's {field} holds more than {limit} UTF-8 bytes"
            error = PydanticCustomError("too_long", message, {"field": field, "limit": limit})
            detail = InitErrorDetails(type=error, loc=(field,), input="")
            raise ValidationError.from_exception_data("events", [detail])
    return events


class _EventColumns:
    """Schema of `Events`: a JSON array of `MedsEvent` (1 to `MAX_EVENTS_PER_RECORD`), held as
    `SubjectEvents`."""

    def __get_pydantic_core_schema__(
        self, source: Any, handler: GetCoreSchemaHandler
    ) -> core_schema.CoreSchema:
        events = Annotated[list[MedsEvent], Field(min_length=1, max_length=MAX_EVENTS_PER_RECORD)]
        return core_schema.no_info_wrap_validator_function(
            _columns, handler.generate_schema(events)
        )


Events = Annotated[SubjectEvents, _EventColumns()]
"""A record's events: a JSON array of MEDS events, validated and held as sorted columns."""


FHIR_BUNDLE_SCHEMA: dict[str, Any] = {
    "type": "object",
    "description": "One patient's record as a FHIR R4 Bundle (searchset, collection, "
    "transaction or batch), mapped to MEDS events by the site mapping (docs/integration.md); "
    "a resource or field that cannot be mapped is a 422 locating it "
    "(`[..., 'bundle', 'entry', i, 'resource', field...]`); a Bundle without entries holds no "
    "event (422).",
    "required": ["resourceType", "type", "entry"],
    "properties": {
        "resourceType": {"const": "Bundle"},
        "type": {"enum": sorted(BUNDLE_TYPES)},
        "entry": {"type": "array", "minItems": 1, "items": {"type": "object"}},
    },
}


def _bundle_schema(schema: dict[str, Any]) -> None:
    left_out_not_null(schema)
    schema.update(FHIR_BUNDLE_SCHEMA)


FhirBundle = dict[str, Any]
"""A FHIR R4 Bundle as JSON (validated by `medtpe.core.fhir`, which names the failing entry)."""


Budget = Annotated[JsonInt, Field(ge=1), WithJsonSchema({"type": "integer", "minimum": 1})]
"""A per-request input budget (the instance's range is checked by the route and stated in the
document by `medtpe.service.app`)."""
BUDGET_HELP = (
    "Input budget of this record's prompt in original-tokenizer tokens (the newest events that "
    "fit are kept); default and largest: the instance's (`max_input_tokens` of `/readyz`), "
    "smallest: what every task's prompt needs; the document states both."
)


class PredictOptions(StrictBody):
    """Sampling options of one prediction."""

    n_samples: JsonInt = Field(1, ge=1, description="Answers generated; the majority wins.")
    temperature: Annotated[float, Field(strict=True)] | None = Field(
        None, ge=0.0, le=2.0, description="Sampling temperature (default: the service's)."
    )
    return_text: StrictBool = Field(False, description="Include each sample's generated text.")
    return_probabilities: StrictBool = Field(
        False,
        description="Include the answer options' probabilities from the first answer token "
        "(tasks with a closed set of options: yes/no, option letters).",
    )
    constrained: StrictBool = Field(
        False,
        description="Constrain decoding to a well-formed answer (vLLM structured outputs): "
        "every answer parses; option probabilities come from the masked distribution.",
    )
    max_input_tokens: Budget | None = Field(None, description=BUDGET_HELP)
    both_modes: StrictBool = Field(
        False,
        description="Also answer in the other mode (`original` beside `medtpe`) on the same "
        "prompt, in `other_mode`; only on an instance started with `MEDTPE_COMPARE_MODES=true` "
        "(`modes` of `/readyz` lists two), 422 otherwise.",
    )

    def sampling(self, served: Sampling) -> Sampling:
        """The request's decoding: these options over the instance's `served` decoding (its
        temperature where none is given, its answer length)."""
        temperature = served.temperature if self.temperature is None else self.temperature
        return replace(
            served,
            n_samples=self.n_samples,
            temperature=temperature,
            probabilities=self.return_probabilities,
            constrained=self.constrained,
        )


class PredictRequest(StrictBody):
    """One record, as MEDS `events` or as a FHIR R4 `bundle`, and the task to predict (`task`)
    or the tasks (`tasks`: the record read once for all of them)."""

    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={
            "oneOf": [
                {"required": ["events"], "not": {"required": ["bundle"]}},
                {"required": ["bundle"], "not": {"required": ["events"]}},
            ],
            **TASK_OR_TASKS,
        },
    )

    task: OptionalTask = Field(None, description="Task name; give it or `tasks`, not both.")
    tasks: OptionalTasks = Field(
        None,
        description="Several task names, each once (at most `MAX_TASKS_PER_RECORD`, 8), in "
        "place of `task`: the record is read and rendered once, within what the longest of "
        "their texts leaves of the input budget, and each prompt starts with the same ids up "
        "to the end of the record, which the engine computes once (its prefix cache). The "
        "answer is `PredictTasksResponse`: one result per task, in this order.",
    )
    events: Events | None = Field(
        None,
        description="The record's MEDS events, all with the same `subject_id` (422 otherwise, "
        "located at the first event whose `subject_id` differs).",
        json_schema_extra=left_out_not_null,
    )
    bundle: FhirBundle | None = Field(None, json_schema_extra=_bundle_schema)
    prediction_time: IsoTime | None = Field(
        None,
        description="Events after it are ignored (MEDS: up to and including it is used); "
        "default: just after the last event.",
    )
    options: PredictOptions = Field(default_factory=PredictOptions)

    @model_validator(mode="before")
    @classmethod
    def _no_null(cls, data: object) -> object:
        """`task`, `tasks`, `events` and `bundle` are left out when unused, never null (as
        documented)."""
        return left_out(data, ("task", "tasks", "events", "bundle"))

    @model_validator(mode="after")
    def _events_or_bundle(self) -> PredictRequest:
        if (self.events is None) == (self.bundle is None):
            raise ValueError("give either `events` (MEDS) or `bundle` (FHIR R4)")
        return self

    @model_validator(mode="after")
    def _task_or_tasks(self) -> PredictRequest:
        """One of `task` and `tasks` (`check_task_choice`)."""
        check_task_choice(self.task, self.tasks)
        return self

    @property
    def task_names(self) -> list[str]:
        """The tasks asked: `[task]`, or `tasks`."""
        if self.tasks is not None:
            return self.tasks
        assert self.task is not None  # `_task_or_tasks`
        return [self.task]


class BatchRequest(StrictBody):
    """Several records, generated concurrently."""

    records: list[PredictRequest] = Field(min_length=1)


class TokenCounts(BaseModel):
    """Prompt length under both tokenizers."""

    original: int
    medtpe: int
    compression_rate: float
    generated: int = Field(description="Answer tokens generated (all samples).")


class ResourceMapping(BaseModel):
    """What became of the FHIR resources of one type."""

    mapped: int = Field(description="Mapped to MEDS codes by the site mapping.")
    unmapped: int = Field(description="Kept with a generic code and their display text.")
    after_prediction_time: int = Field(description="Dropped: after the prediction time.")
    skipped: int = Field(
        description="Not read: a type the mapping does not cover, entered in error, no time."
    )
    outside_window: int = Field(
        0,
        description="Of the above, those older than anything the prompt can show: counted by "
        "a first pass over every resource (patient, resourceType, times, codes), not validated "
        "as FHIR R4 nor read (docs/integration.md, 'FHIR records').",
    )
    dropped_elements: int = Field(
        0,
        description="Faulty elements left out of the resources read (a blank unit code, a "
        "number that does not parse); `warnings` names each.",
    )


class FhirWarning(BaseModel):
    """A faulty element left out of a resource read (docs/integration.md, 'Faulty data')."""

    loc: list[str | int] = Field(description="Where the element is in the request's record.")
    msg: str = Field(description="The resource, the field and its fault.")


class FhirMapping(BaseModel):
    """How a FHIR Bundle became the record's MEDS events."""

    subject_id: int = Field(description="The MEDS subject id the Patient became.")
    counts: dict[str, ResourceMapping] = Field(description="Per FHIR resource type.")
    warnings: list[FhirWarning] = Field(
        default_factory=list, description="Each faulty element left out, located."
    )


class Latency(BaseModel):
    """Where the time of one record went, in milliseconds."""

    render: float
    tokenize: float
    generate: float
    total: float


class Vote(BaseModel):
    """One sample's answer under the answer contract (and its text when asked for)."""

    prediction: Prediction | None = Field(
        description="The first answer object's value; null when the output holds none."
    )
    format_ok: bool = Field(
        description="The output is one well-formed answer object and nothing else."
    )
    text: str | None = None
    trailing: str | None = Field(
        None,
        description="With `return_text`: what the model wrote after its answer object (never "
        "parsed; empty when nothing but whitespace).",
    )


class PredictResponse(BaseModel):
    """The prediction for one record."""

    prediction_id: str | None = Field(
        None,
        description="The answer's id in the prediction ledger (`medtpe verify ID`); null only "
        "with `MEDTPE_LEDGER_OFF=true`.",
    )
    receipt: SignedReceipt | None = Field(
        None, description="The answer's signed receipt; null only with the ledger off."
    )
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
    prediction_time: UtcTime | None
    events: dict[str, int] = Field(description="`total` and `kept` within the input budget.")
    tokens: TokenCounts
    latency_ms: Latency
    model: ModelIdentity = Field(description="The model, mode and artefact that answered.")
    fhir: FhirMapping | None = Field(
        None, description="With a `bundle`: the mapping's subject id and per-type counts."
    )
    other_mode: PredictResponse | None = Field(
        None,
        description="With `options.both_modes`: the same record answered in the other mode "
        "(its own token counts, latency and model); null otherwise.",
    )


class SharedTokens(BaseModel):
    """The leading prompt tokens every task's prompt about the record shares."""

    original: int
    medtpe: int


class TaskPrediction(PredictResponse):
    """One task's prediction about a record asked with several (`tasks`): what `task` alone
    answers, and the engine's prefix-cache hit."""

    cached_tokens: int = Field(
        description="Prompt tokens (in the mode's ids) the engine reused from its prefix cache "
        "instead of computing them: the record, prefilled once for every task asked of it "
        "(whole cache blocks)."
    )


class PredictTasksResponse(BaseModel):
    """The predictions of several tasks (`tasks`) about one record, read once."""

    record_sha256: str | None = Field(
        description="The record's SHA-256, as each result's receipt names it "
        "(`record_sha256`); null only with `MEDTPE_LEDGER_OFF=true`."
    )
    shared_tokens: SharedTokens = Field(
        description="How many leading tokens every task's prompt shares (the record and what "
        "precedes it), under both tokenizers: the engine computes them once."
    )
    results: list[TaskPrediction] = Field(
        description="One per task, in the order of `tasks`, each with its own ledger row "
        "(`prediction_id`) and signed receipt."
    )


PredictAnswer = PredictResponse | PredictTasksResponse
"""`/predict`'s answer: `PredictResponse` to a `task`, `PredictTasksResponse` to `tasks`."""


class BatchResponse(BaseModel):
    """Predictions in request order (each record's as `/predict` answers it)."""

    results: list[PredictAnswer]


class ErrorItem(BaseModel):
    """One problem with a request, located by its field path."""

    loc: list[str | int]
    msg: str
    type: str


class ErrorResponse(BaseModel):
    """Body of every 4xx/5xx answer."""

    error: str = Field(description="Machine-readable error code, e.g. `invalid_request`.")
    detail: list[ErrorItem] | str


def _error(description: str, **headers: str) -> dict[str, Any]:
    response: dict[str, Any] = {"model": ErrorResponse, "description": description}
    if headers:
        response["headers"] = {
            name: {"description": text, "schema": {"type": "string"}}
            for name, text in headers.items()
        }
    return response


API_KEY_SCHEMES: dict[str, dict[str, Any]] = {
    "bearerApiKey": {
        "type": "http",
        "scheme": "bearer",
        "description": "`Authorization: Bearer KEY`, KEY one of `MEDTPE_API_KEYS`.",
    },
    "headerApiKey": {
        "type": "apiKey",
        "in": "header",
        "name": "X-API-Key",
        "description": "`X-API-Key: KEY`, KEY one of `MEDTPE_API_KEYS`.",
    },
}
"""The ways to send an API key (OpenAPI security schemes, either one), stated by an instance
with keys configured."""

ERROR_RESPONSES: dict[int | str, dict[str, Any]] = {
    400: _error("Malformed HTTP request (a `Content-Length` that is no byte count included)."),
    401: _error(
        "No valid API key (when keys are configured).",
        **{"WWW-Authenticate": "`Bearer`"},
    ),
    408: _error("Request body not received within `MEDTPE_REQUEST_TIMEOUT_S` (`body_timeout`)."),
    413: _error("Request body over `MEDTPE_MAX_REQUEST_BYTES`."),
    422: _error(
        "Invalid request: `error` is `invalid_request` or `unknown_task`, `detail` locates each "
        "offending field (`loc`)."
    ),
    500: _error("Internal error (logged without record content)."),
    503: _error(
        "Not ready (`not_ready`, `engine_dead`), too many records in flight (`queue_full`), or "
        "the answer's ledger row cannot be written (`ledger_unavailable`: no answer leaves "
        "unrecorded).",
        **{
            "Retry-After": "Seconds to wait before retrying (not_ready, queue_full, "
            "ledger_unavailable)."
        },
    ),
    504: _error("No answer within `MEDTPE_REQUEST_TIMEOUT_S` (`timeout`)."),
}
"""Every error status the authenticated API can answer, with its body."""


class HealthStatus(BaseModel):
    """Liveness or readiness of the instance."""

    status: str = Field(
        description="`alive` (liveness); `ready`, `starting`, `stopping`, "
        "`ledger_unavailable` (the prediction ledger cannot be opened), `failed` or "
        "`engine_dead` (readiness; liveness reports the last two)."
    )
    detail: str | None = Field(None, description="Why the start-up failed.")
    model: ModelIdentity | None = None
    validated_budgets: list[int] | None = Field(
        None, description="Readiness, model loaded: the input budgets its artefact passed at."
    )
    max_input_tokens: int | None = Field(
        None, description="Readiness, model loaded: the input budget served."
    )
    tasks: list[str] | None = Field(None, description="Readiness: the task names.")
    modes: list[str] | None = Field(
        None,
        description="Readiness, model loaded: the modes `/predict` answers in (the second with "
        "`options.both_modes`).",
    )
    ledger: dict[str, Any] | None = Field(
        None,
        description="Readiness: the prediction ledger (`status` open, unavailable or off; its "
        "`url`, password masked; `records` kept: digest or store; `detail`: why it cannot be "
        "opened). Not ready while it cannot be opened.",
    )


HEALTH_RESPONSES: dict[int | str, dict[str, Any]] = {
    200: {"model": HealthStatus, "description": "The process can serve (or is starting)."},
    503: {"model": HealthStatus, "description": "The engine died or the start-up failed."},
}
READY_RESPONSES: dict[int | str, dict[str, Any]] = {
    200: {"model": HealthStatus, "description": "The engine is loaded and warmed up."},
    503: {"model": HealthStatus, "description": "Starting, stopping, failed or dead."},
}
METRICS_RESPONSES: dict[int | str, dict[str, Any]] = {
    200: {
        "description": "Prometheus text exposition (format 0.0.4).",
        "content": {"text/plain; version=0.0.4; charset=utf-8": {"schema": {"type": "string"}}},
    },
    401: _error(
        "No valid API key or metrics token (when `MEDTPE_API_KEYS` or `MEDTPE_METRICS_KEYS` is "
        "set and `MEDTPE_METRICS_PUBLIC` is not).",
        **{"WWW-Authenticate": "`Bearer`"},
    ),
}
