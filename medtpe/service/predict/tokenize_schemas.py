"""Request and response bodies of `/tokenize`: a text, or a record's full prompt for a task (or for
several, the part they share given once), segmented by both tokenizers (pydantic v2; a record's
fields from `schemas`, `task` and `tasks` as `/predict` takes them from `task_choice`)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator, model_validator

from medtpe.core.meds.events import IsoTime
from medtpe.service.predict.schemas import BUDGET, BUDGET_HELP, Budget, Events, StrictBody, left_out
from medtpe.service.predict.task_choice import (
    TASK_OR_TASKS,
    OptionalTask,
    OptionalTasks,
    check_task_choice,
    left_out_not_null,
)


class TokenizeRequest(StrictBody):
    """Either a `text`, or `events` with their `task` (the full prompt is tokenized) or their
    `tasks` (each task's prompt, the part they share given once)."""

    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={
            "oneOf": [
                {
                    "required": ["text"],
                    "not": {
                        "anyOf": [
                            {"required": ["events"]},
                            {"required": [BUDGET]},
                            {"required": ["tasks"]},
                        ]
                    },
                },
                {"required": ["events"], "not": {"required": ["text"]}, **TASK_OR_TASKS},
            ]
        },
    )

    text: str | None = Field(
        None,
        description="A text to segment: at most `MEDTPE_MAX_TOKENIZE_TEXT_BYTES` UTF-8 bytes "
        "(64 KiB by default; 422 beyond).",
        json_schema_extra=left_out_not_null,
    )
    task: OptionalTask = None
    tasks: OptionalTasks = Field(
        None,
        description="Only with `events`, in place of `task`: several task names, each once (at "
        "most `MAX_TASKS_PER_RECORD`, 8), as `/predict` takes them. The record is rendered once "
        "for all of them; the answer is `TokenizeTasksResponse`: the leading tokens every "
        "task's prompt shares (the prompt's head and the record), then each task's own tail.",
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
        """`text`, `task`, `tasks`, `events` and `max_input_tokens` are left out when unused,
        never null (as documented)."""
        return left_out(data, ("text", "task", "tasks", "events", BUDGET))

    @model_validator(mode="after")
    def _text_or_record(self) -> TokenizeRequest:
        """A `text`, or `events` with one of `task` and `tasks` (`check_task_choice`)."""
        if (self.text is None) == (self.events is None):
            raise ValueError("give either `text` or `events` with `task` or `tasks`")
        if self.events is not None:
            check_task_choice(self.task, self.tasks)
        return self

    @field_validator("tasks", BUDGET)
    @classmethod
    def _of_a_record(cls, value: object, info: ValidationInfo) -> object:
        """`tasks` and a budget apply to a record's prompt: refused beside `text` (located at
        the field)."""
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


class TokenSpan(BaseModel):
    """Both segmentations of a text, or of a stretch of a prompt."""

    original: TokenList
    medtpe: TokenList
    compression_rate: float
    merged: list[MergedToken] = Field(
        default_factory=list,
        description="Each MedTPE token of `medtpe.ids` once, in order of first appearance.",
    )


class TokenizeResponse(TokenSpan):
    """Both segmentations of the same text."""

    events: dict[str, int] | None = Field(
        None,
        description="For a record: `total` and `kept` within the input budget (the prompt "
        "says how many older events it leaves out); null for a text.",
    )
    max_input_tokens: int | None = Field(
        None, description="For a record: the input budget its prompt was built within."
    )


class PromptTokens(BaseModel):
    """A whole prompt's length under both tokenizers."""

    original: int
    medtpe: int
    compression_rate: float


class TaskTokens(BaseModel):
    """One task's prompt about a record asked with several (`tasks`): what it adds to the
    shared part."""

    task: str
    tail: TokenSpan = Field(
        description="The prompt past `shared`: the task's own text (the `record-first` layout); "
        "the whole prompt where nothing is shared (`task-first`)."
    )
    total: PromptTokens = Field(
        description="The whole prompt, `shared` then `tail`: what `/predict` counts (`tokens`)."
    )
    events: dict[str, int] = Field(
        description="`total` and `kept` within the input budget (in `record-first`, the same "
        "for every task: the record is rendered once)."
    )


class TokenizeTasksResponse(BaseModel):
    """The prompts of several tasks (`tasks`) about one record: the leading tokens they share
    (the prompt's head and the record, which an engine reads once), then each task's tail."""

    shared: TokenSpan = Field(
        description="The leading tokens every task's prompt starts with, under both tokenizers "
        "(`shared_tokens` of `/predict`'s answer counts them); empty in the `task-first` layout."
    )
    results: list[TaskTokens] = Field(description="One per task, in the order of `tasks`.")
    max_input_tokens: int = Field(description="The input budget the prompts were built within.")


TokenizeAnswer = TokenizeResponse | TokenizeTasksResponse
"""`/tokenize`'s answer: `TokenizeResponse` to a `text` or a `task`, `TokenizeTasksResponse` to
`tasks`."""
