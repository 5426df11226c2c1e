"""Find the `{"answer": ...}` object in what a model wrote.

Accepted: the object anywhere in the text (prose or code fences around it), JSON or the
Python-literal spelling small models often write (single quotes, True/False/None), or an
unquoted bare value (`{"answer": yes}`). When several objects carry an answer, the last one
wins (models tend to echo the example first). Anything else yields no answer.
"""

from __future__ import annotations

import ast
import json
import re

MISSING = object()
_BARE_VALUE = re.compile(r"""^\{\s*["']?answer["']?\s*:\s*([^{}\[\],"']+?)\s*\}$""", re.IGNORECASE)
_LITERALS = re.compile(r"\b(true|false|null)\b")


def _brace_spans(text: str) -> list[str]:
    """Top-level balanced `{...}` substrings, ignoring braces inside quoted strings."""
    spans: list[str] = []
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
                spans.append(text[start : i + 1])
    return spans


def _parse_object(span: str) -> object:
    try:
        return json.loads(span)
    except json.JSONDecodeError:
        pass
    python_spelling = _LITERALS.sub(
        lambda m: {"true": "True", "false": "False", "null": "None"}[m.group(1)], span
    )
    try:
        return ast.literal_eval(python_spelling)
    except (ValueError, SyntaxError, MemoryError, RecursionError):
        pass
    match = _BARE_VALUE.match(span.strip())
    return {"answer": match.group(1)} if match else MISSING


def find_answer(text: str) -> object:
    """The value of the last `answer` key found in a JSON-like object, or `MISSING`."""
    found: object = MISSING
    for span in _brace_spans(text):
        parsed = _parse_object(span)
        if isinstance(parsed, dict):
            for key, value in parsed.items():
                if isinstance(key, str) and key.strip().lower() == "answer":
                    found = value
    return found
