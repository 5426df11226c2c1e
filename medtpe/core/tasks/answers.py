"""The answer contract: what counts as a model's answer and when its format complies.

- **The answer is the first complete answer object** the model writes: `{"answer": ...}`.
  Whatever follows it is *trailing text*: reported, never parsed, so text written after the
  answer cannot overturn it.
- **Strict reading** (the default): the output must be that object and nothing else, whitespace
  aside. The object is JSON whose only key is `answer`; any text before it means there is no
  answer; text after it keeps the answer but fails format compliance.
- **Lenient reading** (a task file's `answer_reading: lenient`, for models that wrap their answer
  in prose or code fences): the first object anywhere in the text that carries an `answer` key,
  also in the Python-literal spelling small models often write (single quotes, True/False/None)
  or with an unquoted bare value (`{"answer": yes}`). An answer found complies (the paper's
  parse-based format compliance); trailing text is reported the same way.
- **The stop rule**: the engine stops generating at the first token whose text holds
  `ANSWER_END`. An answer object holds no nested braces, so that token ends the first answer
  object (or makes the output fail the contract); under MedTPE one token may close the object and
  begin the next text, which then becomes trailing text.

>>> found = read_answer('{"answer": "yes"} or {"answer": "no"}')
>>> found.value, found.compliant, found.trailing
('yes', False, ' or {"answer": "no"}')
"""

from __future__ import annotations

import ast
import json
import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from enum import StrEnum

MISSING = object()
"""`FoundAnswer.value` when the text holds no answer object."""
ANSWER_KEY = "answer"
ANSWER_END = "}"
"""The character that closes an answer object; the engine's stop rule stops on it."""
_BARE_VALUE = re.compile(r"""^\{\s*["']?answer["']?\s*:\s*([^{}\[\],"']+?)\s*\}$""", re.IGNORECASE)
_LITERALS = re.compile(r"\b(true|false|null)\b")


class AnswerReading(StrEnum):
    """How a task reads its answer object (see the module docstring)."""

    STRICT = "strict"
    LENIENT = "lenient"


@dataclass(frozen=True)
class FoundAnswer:
    """The first answer object of an output: its value, whether the output complies with the
    format (that object and nothing else, whitespace aside) and the text after the object."""

    value: object
    """The object's `answer` value, or `MISSING`."""
    compliant: bool
    trailing: str
    """What follows the answer object when it is more than whitespace, else ""."""


NOT_FOUND = FoundAnswer(MISSING, False, "")


def _brace_spans(text: str) -> Iterable[tuple[int, int]]:
    """(start, end) of each top-level balanced `{...}` of `text`, in order, ignoring braces inside
    quoted strings."""
    depth, start, quote, escaped = 0, -1, "", False
    for i, char in enumerate(text):
        if quote:
            if escaped:
                escaped = False
            elif char == "\\":
                escaped = True
            elif char == quote:
                quote = ""
        elif char in "\"'" and depth:
            quote = char
        elif char == "{":
            if depth == 0:
                start = i
            depth += 1
        elif char == "}" and depth:
            depth -= 1
            if depth == 0:
                yield start, i + 1


def _strict_value(span: str) -> object:
    """The value of a JSON object whose only key is `answer`, else `MISSING`."""
    try:
        parsed = json.loads(span)
    except json.JSONDecodeError:
        return MISSING
    if isinstance(parsed, dict) and list(parsed) == [ANSWER_KEY]:
        return parsed[ANSWER_KEY]
    return MISSING


def _lenient_value(span: str) -> object:
    """The `answer` value (any key case) of an object in JSON or Python spelling or with a bare
    value, else `MISSING`."""
    parsed: object = MISSING
    try:
        parsed = json.loads(span)
    except json.JSONDecodeError:
        python_spelling = _LITERALS.sub(
            lambda m: {"true": "True", "false": "False", "null": "None"}[m.group(1)], span
        )
        try:
            parsed = ast.literal_eval(python_spelling)
        except (ValueError, SyntaxError, MemoryError, RecursionError):
            match = _BARE_VALUE.match(span.strip())
            parsed = {ANSWER_KEY: match.group(1)} if match else MISSING
    if isinstance(parsed, dict):
        for key, value in parsed.items():
            if isinstance(key, str) and key.strip().lower() == ANSWER_KEY:
                return value
    return MISSING


def _found(text: str, value: object, end: int, reading: AnswerReading) -> FoundAnswer:
    """Strict: compliant when nothing but whitespace follows (what precedes was checked);
    lenient: an answer found is compliant (the paper's parse-based FCR)."""
    trailing = text[end:] if text[end:].strip() else ""
    compliant = reading is AnswerReading.LENIENT or not trailing
    return FoundAnswer(value, compliant, trailing)


def read_answer(text: str, reading: AnswerReading = AnswerReading.STRICT) -> FoundAnswer:
    """The first answer object of a model's output under `reading` (`NOT_FOUND` when none).

    >>> read_answer('Sure: {"answer": "no"}').value is MISSING
    True
    >>> read_answer('Sure: {"answer": "no"}', AnswerReading.LENIENT).value
    'no'
    """
    for start, end in _brace_spans(text):
        if reading is AnswerReading.STRICT:
            if text[:start].strip():
                return NOT_FOUND
            value = _strict_value(text[start:end])
            return NOT_FOUND if value is MISSING else _found(text, value, end, reading)
        value = _lenient_value(text[start:end])
        if value is not MISSING:
            return _found(text, value, end, reading)
    return NOT_FOUND


def answer_end_ids(tokens: Callable[[Sequence[int]], list[str]], vocab_size: int) -> frozenset[int]:
    """The stop rule for one vocabulary: the ids whose text holds `ANSWER_END` (`tokens`: each
    id's text, e.g. `MedTPETokenizer.tokens`, whose merged tokens may hold it inside).

    >>> sorted(answer_end_ids(lambda ids: ['"}', "yes", "}\\n"][: len(ids)], 3))
    [0, 2]
    """
    ids = range(vocab_size)
    return frozenset(i for i, text in zip(ids, tokens(ids), strict=True) if ANSWER_END in text)
