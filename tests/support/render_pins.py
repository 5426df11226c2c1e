"""Pinned rendering: sha256 of the prompt text, its token count and the events kept, per record
and budget, recorded from the renderer as it was before the columnar rewrite (issue 12), so the
new path is held to the very same bytes.

    .venv/bin/python -m tests.support.render_pins --write [--meds DIR]

rewrites `tests/fixtures/render_pins.json` (project fixtures) and, with `--meds`, the pins of
every ICU record of that MEDS dataset. Only regenerate when the rendered format changes on
purpose: the point of the file is that it does not follow the code.
"""

from __future__ import annotations

import argparse
import hashlib
import json
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path

from medtpe.core.meds import MedsEvent, SubjectEvents
from medtpe.core.prompt import ChatTemplate, build_prompt, render_record
from medtpe.core.prompt.layout import PromptLayout
from medtpe.core.tokenizer import BaseTokenizer
from tests.support.meds_fixtures import DESCRIPTIONS, PREDICTION_TIME, subject_rows
from tests.support.paths import FIXTURES, SHARED
from tests.support.service_support import synthetic_events
from tests.support.tokenizer_support import smollm2_dir

PINS_FILE = FIXTURES / "render_pins.json"
SHARED_PINS_FILE = FIXTURES / "render_pins_mimic_demo.json"
SHARED_MEDS = SHARED / "data" / "mimic-iv-demo-meds"
TEMPLATE_DIR = FIXTURES / "smollm2"
RENDER_BUDGETS = (None, 64, 512, 4096)
PROMPT_BUDGETS = (1024, 8192)
SHARED_PROMPT_BUDGETS = (1024, 4096, 8192)
TASK = "icu_mortality"


def sha256(text: str) -> str:
    """Hex digest of the UTF-8 text."""
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def base_tokenizer() -> BaseTokenizer:
    """SmolLM2's tokenizer (committed fixture), the default model's."""
    return BaseTokenizer.load(smollm2_dir())


def template() -> ChatTemplate:
    """SmolLM2's chat template (committed fixture)."""
    return ChatTemplate.from_model_dir(TEMPLATE_DIR)


def fixture_records() -> Iterator[tuple[str, list[MedsEvent], datetime | None]]:
    """(name, events as validated JSON, prediction time) of the project's fixture records."""
    for subject in (1, 2, 3):
        for hours in (2, 30, 400):
            rows = [
                {**row, "time": row["time"].isoformat() if row["time"] else None}
                for row in subject_rows(subject, hours)
            ]
            yield f"meds_fixtures/{subject}/{hours}h", _validated(rows), PREDICTION_TIME
    for subject in range(1, 9):
        for n_events in (5, 60, 700, 4000):
            rows = synthetic_events(subject, n_events)
            yield f"synthetic/{subject}/{n_events}", _validated(rows), None


def _validated(rows: list[dict]) -> list[MedsEvent]:
    return [MedsEvent.model_validate(row) for row in rows]


def pin(text: str, n_tokens: int | None, kept: int, total: int) -> dict[str, object]:
    """What is pinned of one rendering."""
    return {"sha256": sha256(text), "n_tokens": n_tokens, "kept": kept, "total": total}


def record_pins(
    events: SubjectEvents,
    when: datetime | None,
    descriptions: dict[str, str],
    tokenizer: BaseTokenizer,
    chat: ChatTemplate,
    prompt_budgets: tuple[int, ...],
) -> dict[str, dict[str, object]]:
    """Pins of one record: the record text at each render budget, the prompt at each budget.

    The pins were recorded when records ended strictly before the prediction time; the default
    is now up to and including it (MEDS), so the events are cut strictly before it here, which
    keeps the pins a check of the renderer, not of the cut (tested in
    tests/core/meds/test_meds_models.py).
    """
    out: dict[str, dict[str, object]] = {}
    if when is not None:
        events = events.before(when, inclusive=False)
    for budget in RENDER_BUDGETS:
        try:
            r = render_record(events, descriptions, when, tokenizer, budget)
        except ValueError as exc:  # a budget too small for the record is pinned as such
            out[f"render/{budget}"] = {"error": type(exc).__name__}
            continue
        out[f"render/{budget}"] = pin(r.text, r.n_tokens, r.n_events_kept, r.n_events_total)
    for budget in prompt_budgets:
        # pinned in the layout they were recorded in: a receipt of that layout re-derives
        p = build_prompt(
            TASK,
            events,
            when,
            tokenizer,
            chat,
            budget,
            descriptions,
            layout=PromptLayout.TASK_FIRST,
        )
        out[f"prompt/{budget}"] = pin(
            p.text, p.n_tokens_original, p.n_events_kept, p.n_events_total
        )
        out[f"prompt/{budget}"]["ids_sha256"] = sha256(json.dumps(p.base_ids))
    return out


def compute_fixture_pins() -> dict[str, dict[str, dict[str, object]]]:
    """Pins of every fixture record."""
    tokenizer, chat = base_tokenizer(), template()
    return {
        name: record_pins(
            SubjectEvents.from_events(events), when, DESCRIPTIONS, tokenizer, chat, PROMPT_BUDGETS
        )
        for name, events, when in fixture_records()
    }


def compute_shared_pins(meds: Path) -> dict[str, dict[str, dict[str, object]]]:
    """Pins of every ICU label row of a MEDS dataset (key: `subject_id@prediction_time`)."""
    from medtpe.core.meds import MedsDataset, read_labels

    dataset = MedsDataset.load(meds)
    tokenizer, chat = base_tokenizer(), template()
    return {
        f"{row.subject_id}@{row.prediction_time.isoformat()}": record_pins(
            dataset.events(row.subject_id),
            row.prediction_time,
            dataset.descriptions,
            tokenizer,
            chat,
            SHARED_PROMPT_BUDGETS,
        )
        for row in read_labels(meds / "labels" / "icu_mortality.parquet")
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--write", action="store_true", required=True)
    parser.add_argument("--meds", type=Path)
    args = parser.parse_args()
    PINS_FILE.write_text(json.dumps(compute_fixture_pins(), indent=1, sort_keys=True) + "\n")
    if args.meds:
        pins = compute_shared_pins(args.meds)
        SHARED_PINS_FILE.write_text(json.dumps(pins, indent=1, sort_keys=True) + "\n")


if __name__ == "__main__":
    main()
