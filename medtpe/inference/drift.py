"""Drift figures of one prepared record: how its vocabulary met the artefact.

Four figures no model-monitoring tool sees, each a count so that sums over many records give
shares over any window (the service adds them to counters, `medtpe.service.plumbing.metrics`):

- the events the prompt could show and those the input budget dropped;
- the shown events whose code has no description (neither in the artefact's codes metadata nor,
  for a FHIR record, in the record's own display texts): the prompt shows the raw code, text the
  artefact's merges were never mined on;
- the prompt's tokens under both tokenizers (compression = 1 - MedTPE / original) and how many of
  its MedTPE ids are merged ids (the artefact's new tokens).

`build_compression_rate` reads the compression the artefact's build measured, the level the live
figure is compared with.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import meds
import numpy as np

from medtpe.core.tokenizer import MedTPETokenizer
from medtpe.inference.predictor import PreparedRecord

BUILD_REPORT_FILE = "build_report.json"
_NAMED_CODES = frozenset({meds.birth_code, meds.death_code})
"""Codes the record text names without a description (`Birth`, `Death`)."""


@dataclass(frozen=True)
class DriftFigures:
    """The drift counts of one prepared record."""

    events: int
    """Events the prompt could show: static ones and those up to the prediction time."""
    events_dropped: int
    """Of those, the ones the input budget (or the window) left out."""
    events_undescribed: int
    """Shown events whose code has no description."""
    original_tokens: int
    medtpe_tokens: int
    merged_tokens: int
    """MedTPE ids of the prompt that are the artefact's new (merged) tokens."""


def drift_figures(
    record: PreparedRecord, tokenizer: MedTPETokenizer, descriptions: Mapping[str, str]
) -> DriftFigures:
    """The drift counts of `record`, prepared with `tokenizer` and the codes metadata
    `descriptions` (the predictor's). Cost grows with the events shown, not the record."""
    prompt, events = record.prompt, record.events
    total, kept = prompt.n_events_total, prompt.n_events_kept
    n_static = min(events.n_static, total)
    # the budget keeps static events first, then the newest timed ones: a prefix of the
    # statics and a suffix of the events up to the prediction time (`n_events_total` of them)
    if kept <= n_static:
        shown = sorted(events.codes[:n_static])[:kept]  # statics are kept in code order
    else:
        shown = [*events.codes[:n_static], *events.codes[total - (kept - n_static) : total]]
    own = record.fhir.descriptions if record.fhir is not None else {}
    undescribed = sum(
        1
        for code in shown
        if not descriptions.get(code) and not own.get(code) and code not in _NAMED_CODES
    )
    ids = record.segmentation.medtpe_ids
    merged = int(np.count_nonzero(_merged_mask(tokenizer)[np.asarray(ids, dtype=np.int64)]))
    return DriftFigures(
        events=total,
        events_dropped=total - kept,
        events_undescribed=undescribed,
        original_tokens=len(record.segmentation.original_ids),
        medtpe_tokens=len(ids),
        merged_tokens=merged,
    )


@lru_cache(maxsize=4)
def _merged_mask(tokenizer: MedTPETokenizer) -> np.ndarray:
    """True at each id of `tokenizer`'s vocabulary that is one of its merged tokens."""
    mask = np.zeros(tokenizer.vocab_size, dtype=bool)
    mask[[token.id for token in tokenizer.new_tokens]] = True
    return mask


@lru_cache(maxsize=8)
def build_compression_rate(artefact_dir: Path) -> float | None:
    """The prompt compression the artefact's build measured (`build_report.json`,
    `measure.compression.prompt_compression_rate`; read once per directory); None without that
    figure."""
    path = Path(artefact_dir) / BUILD_REPORT_FILE
    if not path.is_file():
        return None
    report = json.loads(path.read_text())
    value = report.get("measure", {}).get("compression", {}).get("prompt_compression_rate")
    return float(value) if isinstance(value, int | float) else None
