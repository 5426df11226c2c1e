"""A prediction task (instruction, answer form, answer parsing), defined by a YAML/JSON file."""

from __future__ import annotations

import re
import string
from typing import Literal, NamedTuple

from pydantic import BaseModel, ConfigDict, Field, model_validator

from medtpe.core.tasks.answers import MISSING, AnswerReading, read_answer

Prediction = bool | str | list[str]
"""binary -> bool; multiclass -> label name; multilabel -> label names in the task's order."""

_YES = {"yes", "y", "true", "1", "positive", "pos"}
_NO = {"no", "n", "false", "0", "negative", "neg"}
_NONE = {"", "none", "no", "n/a", "na", "null", "nothing", "[]"}
_LETTER = re.compile(r"^\(?([A-Za-z])\s*[).:]?$")
_LETTER_AND_NAME = re.compile(r"^\(?([A-Za-z])\s*[).:]\s+(\S.*)$")
_MIN_PREFIX = 5
BINARY_OPTIONS = ("yes", "no")
"""What a binary task's prompt asks the model to write, the positive answer first."""


class ParsedAnswer(NamedTuple):
    """A model output under the answer contract (`medtpe.core.tasks.answers`)."""

    prediction: Prediction | None
    """The first answer object's value as a prediction; None when there is none or the task
    does not accept its value."""
    format_ok: bool
    """Strict format compliance: the output is one well-formed answer object and nothing else."""
    trailing: str
    """Text after the answer object ("" when none): reported, never parsed."""


def _norm(text: str) -> str:
    return " ".join(text.strip().strip(".!\"'`").lower().split())


class Task(BaseModel):
    """A task file's content; see `medtpe/core/tasks/*.yaml` for examples."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(pattern=r"^[a-z0-9][a-z0-9_\-]*$")
    title: str
    label_type: Literal["binary", "multiclass", "multilabel"]
    instruction: str = Field(min_length=1)
    """What the task asks, said before the record (the `task-first` prompt layout)."""
    instruction_after_record: str | None = Field(None, min_length=1)
    """What the task asks, said after the record (the `record-first` layout, whose shared head
    names no task); None: `instruction`."""
    question: str = Field(min_length=1)
    labels: list[str] = Field(default_factory=list, max_length=26)
    positive_words: list[str] = Field(default_factory=list)
    negative_words: list[str] = Field(default_factory=list)
    system_prompt: str | None = None
    prefill_answer: bool = True
    """Start the assistant's turn with the answer's JSON opening (`response_prefix`), so that even
    a small model only has to write the value; `false` lets the model write the whole answer."""
    answer_reading: AnswerReading = AnswerReading.STRICT
    """`strict`: the output must be the answer object alone; `lenient`: the first answer object
    anywhere in the text (prose, code fences, Python spelling) is read."""

    @model_validator(mode="after")
    def _check_labels(self) -> Task:
        if self.label_type == "binary" and self.labels:
            raise ValueError("a binary task has no 'labels' (its answer is yes/no)")
        if self.label_type != "binary" and len(self.labels) < 2:
            raise ValueError(f"a {self.label_type} task needs at least 2 'labels'")
        if len({_norm(label) for label in self.labels}) != len(self.labels):
            raise ValueError("'labels' must be distinct")
        return self

    @property
    def letters(self) -> list[str]:
        """Option letters, `A`, `B`, ... one per label."""
        return list(string.ascii_uppercase[: len(self.labels)])

    @property
    def answer_options(self) -> tuple[str, ...]:
        """The closed set of answer values the prompt asks for: `yes`/`no` (binary), the option
        letters (multiclass); empty for multilabel (a list, not one choice)."""
        if self.label_type == "binary":
            return BINARY_OPTIONS
        return tuple(self.letters) if self.label_type == "multiclass" else ()

    @property
    def positive_option(self) -> str | None:
        """The answer option of the positive class (`yes`) for a binary task; None otherwise."""
        return BINARY_OPTIONS[0] if self.label_type == "binary" else None

    def answer_format(self) -> str:
        """The sentence that tells the model how to answer."""
        if self.label_type == "binary":
            return 'Reply with JSON only: {"answer": "yes"} or {"answer": "no"}.'
        if self.label_type == "multiclass":
            return 'Reply with JSON only, giving the letter of one option, e.g. {"answer": "A"}.'
        return (
            "Reply with JSON only, giving the letters of all options that apply, e.g. "
            '{"answer": ["A", "D"]}, or {"answer": []} if none apply.'
        )

    @property
    def response_prefix(self) -> str:
        """Text the assistant's turn starts with (empty when `prefill_answer` is off)."""
        if not self.prefill_answer:
            return ""
        return '{"answer": [' if self.label_type == "multilabel" else '{"answer": "'

    def answer_values(self) -> tuple[str, ...]:
        """The strings an answer value may be: yes/no (binary) or the option letters."""
        return self.answer_options or tuple(self.letters)

    def answer_regex(self) -> str:
        """A regular expression of what the model may write after `response_prefix` (with the
        prefill on): the rest of a well-formed answer object, e.g. `(yes|no)"\\}`."""
        if not self.prefill_answer:
            raise ValueError(f"task {self.name}: an answer regex needs the answer prefill")
        value = "(" + "|".join(re.escape(v) for v in self.answer_values()) + ")"
        if self.label_type == "multilabel":
            item = f'"{value}"'
            return f"({item}(, {item})*)?" + r"\]\}"
        return value + r'"\}'

    def answer_schema(self) -> dict[str, object]:
        """JSON schema of the whole answer object `{"answer": ...}` (for decoding without the
        prefill). No `uniqueItems` on a multilabel list: vLLM's grammar backends refuse it, and
        a repeated label parses as the label once."""
        values = {"enum": list(self.answer_values())}
        answer = {"type": "array", "items": values} if self.label_type == "multilabel" else values
        return {
            "type": "object",
            "properties": {"answer": answer},
            "required": ["answer"],
            "additionalProperties": False,
        }

    def user_message(self, record_text: str, prediction_time: str | None = None) -> str:
        """The user turn of the `task-first` layout: instruction, options, record, prediction
        time, question, answer form (`medtpe.core.prompt.layout` places the record first)."""
        parts = [self.instruction, *self.options_block()]
        parts.append(f"Patient record:\n{record_text}")
        parts.extend(self.closing(prediction_time))
        return "\n\n".join(parts)

    def options_block(self) -> list[str]:
        """The options paragraph (`Options:` and a lettered line per label), if any."""
        if not self.labels:
            return []
        options = "\n".join(
            f"{letter}. {label}" for letter, label in zip(self.letters, self.labels, strict=True)
        )
        return [f"Options:\n{options}"]

    def closing(self, prediction_time: str | None) -> list[str]:
        """The paragraphs after the record: the prediction time, if any, then the question and
        the answer form."""
        parts = [f"Prediction time: {prediction_time}"] if prediction_time else []
        return [*parts, f"{self.question}\n{self.answer_format()}"]

    def parse_answer(self, text: str) -> ParsedAnswer:
        """A model's output (the prefill included) under this task's answer reading.

        >>> get_task("icu_mortality").parse_answer('{"answer": "yes"} and more')
        ParsedAnswer(prediction=True, format_ok=False, trailing=' and more')
        """
        found = read_answer(text, self.answer_reading)
        if found.value is MISSING:
            return ParsedAnswer(None, False, found.trailing)
        prediction = self.normalise(found.value)
        return ParsedAnswer(prediction, found.compliant and prediction is not None, found.trailing)

    def parse_label(self, value: object) -> Prediction:
        """A label file's value as a prediction-typed label (multilabel: `|`-separated string)."""
        if self.label_type == "multilabel" and isinstance(value, str):
            value = [item for item in value.split("|") if item.strip()]
        label = self.normalise(value)
        if label is None:
            raise ValueError(
                f"task {self.name}: label value {value!r} is not a valid {self.label_type} label"
            )
        return label

    def normalise(self, value: object) -> Prediction | None:
        """An answer value as a prediction, or None when it is not one this task accepts."""
        if isinstance(value, list | tuple) and self.label_type != "multilabel":
            if len(value) != 1:
                return None
            value = value[0]
        if self.label_type == "binary":
            return self._binary(value)
        if self.label_type == "multiclass":
            return self._match_label(value) if isinstance(value, str) else None
        return self._multilabel(value)

    def _binary(self, value: object) -> bool | None:
        if isinstance(value, bool):
            return value
        if isinstance(value, int) and value in (0, 1):
            return bool(value)
        if not isinstance(value, str):
            return None
        word = _norm(value)
        if word in _YES or word in {_norm(w) for w in self.positive_words}:
            return True
        if word in _NO or word in {_norm(w) for w in self.negative_words}:
            return False
        return None

    def _multilabel(self, value: object) -> list[str] | None:
        if isinstance(value, str):
            if _norm(value) in _NONE:
                return []
            value = re.split(r"[,;|\n]", value) if any(c in value for c in ",;|\n") else [value]
        if not isinstance(value, list | tuple):
            return None
        chosen = set()
        for item in value:
            if not isinstance(item, str):
                return None
            if not item.strip():
                continue
            label = self._match_label(item)
            if label is None:
                return None
            chosen.add(label)
        return [label for label in self.labels if label in chosen]

    def _match_label(self, item: str) -> str | None:
        """A label from its letter, name, `B. name` form or a unique prefix of its name."""
        item = item.strip()
        match = _LETTER.match(item) or _LETTER_AND_NAME.match(item)
        if match:
            index = ord(match.group(1).upper()) - ord("A")
            return self.labels[index] if index < len(self.labels) else None
        wanted = _norm(item)
        names = {_norm(label): label for label in self.labels}
        if wanted in names:
            return names[wanted]
        if len(wanted) >= _MIN_PREFIX:
            hits = [label for key, label in names.items() if key.startswith(wanted)]
            if len(hits) == 1:
                return hits[0]
        return None
