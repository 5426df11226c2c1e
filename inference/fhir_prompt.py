"""A FHIR record's prompt, reading its resources only as far back as the prompt reaches
(`medtpe_core.fhir.window`): the newest resources first, more while the prompt builder finds
that it could show or depend on a resource not read (`IncompleteWindowError`). The prompt is
byte-identical to that of the whole record read; the record's counts are the whole record's.
"""

from __future__ import annotations

import math
from datetime import datetime

from inference.predictor import Predictor, PreparedRecord
from medtpe_core.fhir import FhirRecord
from medtpe_core.fhir.window import FhirWindow
from medtpe_core.prompt.task_prompt import IncompleteWindowError
from medtpe_core.tasks import Task

TOKENS_PER_RESOURCE = 8
"""The first window reads `max_input_tokens / TOKENS_PER_RESOURCE` resources (an ICU record's
event lines take about 8.5 tokens an event at 4,096 and 8,192 tokens, its resources give about
1.2 events each)."""
GROWTH = 1.5
"""Each further window reads this many times as many resources."""


def prepare_fhir(
    predictor: Predictor, task: Task, window: FhirWindow, prediction_time: datetime | None
) -> tuple[PreparedRecord | None, FhirRecord]:
    """The prepared prompt of the record in `window` (None when it holds no event) and the
    record it was built from (CPU work: call it in a worker thread). The window's resources
    read raise their `FhirInputError`s."""
    n: int | None = max(1, predictor.max_input_tokens // TOKENS_PER_RESOURCE)
    while True:
        record = window.record(n)
        if not record.rows and not record.stand_ins:
            return None, record
        try:
            prepared = predictor.prepare(
                task,
                record.subject_events(),
                prediction_time,
                record.descriptions,
                record.horizon,
            )
        except IncompleteWindowError:
            assert n is not None  # the whole record read has no horizon
            n = math.ceil(n * GROWTH)
            n = None if n >= window.n_candidates else n
            continue
        return prepared, record
