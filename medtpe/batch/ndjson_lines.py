"""An NDJSON file's lines read without trusting them: each line as bytes (gzip read as a stream,
a line over `MAX_LINE_BYTES` given as None and skipped to its end), and whether a line nests
deeper than a JSON parser should be asked to follow (`nested_deeper_than`: on the bytes, before any
parser sees them, no recursion). `medtpe.batch.fhir_export` reads an export's files with them.
"""

from __future__ import annotations

import gzip
import re
from collections.abc import Iterator
from pathlib import Path

import numpy as np

MAX_LINE_BYTES = 16 * 1024 * 1024
"""A longer line is counted as unreadable and skipped (no resource the mapping reads is near)."""
MAX_JSON_DEPTH = 100
"""A line nested deeper (arrays and objects) is counted as unreadable and skipped, before it is
parsed (FHIR resources nest about ten deep; a QuestionnaireResponse's items some more)."""


_JSON_STRING = re.compile(rb'"(?:[^"\\]++|\\.)*+"', re.DOTALL)
_DEPTH_STEP = np.zeros(256, np.int8)
_DEPTH_STEP[list(b"[{")] = 1
_DEPTH_STEP[list(b"]}")] = -1


def nested_deeper_than(text: bytes, limit: int) -> bool:
    """Whether JSON `text` nests arrays and objects more than `limit` deep (brackets inside
    strings not counted), found without parsing it: no recursion, linear in its length."""
    if text.count(b"[") + text.count(b"{") <= limit:
        return False
    outside = np.frombuffer(_JSON_STRING.sub(b"", text), np.uint8)
    return bool(outside.size) and int(np.cumsum(_DEPTH_STEP[outside], dtype=np.int64).max()) > limit


def read_lines(path: Path) -> Iterator[tuple[int, bytes | None]]:
    """(line number from 1, the line without its end) of an NDJSON file, gzip read as a stream;
    a line over `MAX_LINE_BYTES` is given as None (and skipped to its end)."""
    opener = gzip.open if path.name.endswith(".gz") else open
    with opener(path, "rb") as file:
        number = 0
        while True:
            line = file.readline(MAX_LINE_BYTES + 1)
            if not line:
                return
            number += 1
            if len(line) > MAX_LINE_BYTES and not line.endswith(b"\n"):
                while (rest := file.readline(MAX_LINE_BYTES)) and not rest.endswith(b"\n"):
                    pass
                yield number, None
                continue
            yield number, line.rstrip(b"\r\n")
