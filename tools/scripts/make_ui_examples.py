"""Write the compression page's bundled examples
(`medtpe/service/page/static/examples/examples.json`) from the MIMIC-IV demo in MEDS form: for a few
ICU-mortality label rows, the subject's static events, birth, and the events of the hours before the
prediction time, with the label's prediction time.

    .venv/bin/python -m tools.scripts.make_ui_examples --meds ../shared/data/mimic-iv-demo-meds

The output keeps the demo's attribution and licence (ODbL 1.0), as its README requires.
"""

from __future__ import annotations

import argparse
import json
import math
from datetime import timedelta
from pathlib import Path
from typing import Any

import meds
import numpy as np

from medtpe.core.meds import MedsDataset, MedsEvent, SubjectEvents, read_labels

OUT = (
    Path(__file__).resolve().parents[2]
    / "medtpe"
    / "service"
    / "page"
    / "static"
    / "examples"
    / "examples.json"
)
LABEL_ROWS = (0, 10)
"""Which rows of the label file become examples (two care units)."""
HOURS = 6
"""Hours of events before each prediction time."""
TASK = "icu_mortality"
ATTRIBUTION = (
    "Derived from the MIMIC-IV Clinical Database Demo v2.2 (Johnson et al., PhysioNet, "
    "doi:10.13026/07hj-2a80) in MEDS form (MIMIC_IV_MEDS ETL); de-identified; Open Database "
    "License (ODbL 1.0): redistributed copies keep this attribution and licence."
)
MINIMAL = [
    {
        "subject_id": 1,
        "time": "2150-01-01T08:00:00",
        "code": "LAB//220045//bpm",
        "numeric_value": 88,
    },
    {
        "subject_id": 1,
        "time": "2150-01-01T08:00:00",
        "code": "LAB//220179//mmHg",
        "numeric_value": 92,
    },
]
"""The README's two-event record (synthetic)."""


def _events(events: SubjectEvents) -> list[dict[str, Any]]:
    """MEDS events as the API takes them (ISO 8601 times; absent values left out)."""
    out = []
    for time, code, value, text in zip(
        events.times.tolist(),
        events.codes,
        events.numeric_values.tolist(),
        events.text_values,
        strict=True,
    ):
        event = MedsEvent(
            subject_id=events.subject_id,
            time=time,
            code=code,
            numeric_value=None if math.isnan(value) else round(value, 4),
            text_value=text,
        )
        out.append(event.model_dump(mode="json", exclude_defaults=True))
    return out


def examples(meds_dir: Path) -> list[dict[str, Any]]:
    """The examples: `LABEL_ROWS` of the ICU-mortality labels, `HOURS` each, and `MINIMAL`."""
    labels = read_labels(meds_dir / "labels" / f"{TASK}.parquet")
    dataset = MedsDataset.load(meds_dir)
    out = []
    for n, row in enumerate(LABEL_ROWS, 1):
        point = labels[row]
        shown = dataset.events(point.subject_id).before(point.prediction_time)
        start = np.datetime64(point.prediction_time - timedelta(hours=HOURS), "us")
        birth = np.array([code == meds.birth_code for code in shown.codes], dtype=bool)
        recent = np.isnat(shown.times) | birth | (shown.times > start)
        kept = shown.take(recent)
        out.append(
            {
                "id": f"mimic-demo-{n}",
                "title": f"MIMIC-IV demo ICU stay {n}: the {HOURS} h before 24 h in the ICU "
                f"({len(kept)} events)",
                "source": "mimic-iv-demo",
                "task": TASK,
                "prediction_time": point.prediction_time.isoformat(),
                "events": _events(kept),
            }
        )
    out.append(
        {
            "id": "minimal",
            "title": "Synthetic: two vital signs (the README's example)",
            "source": "synthetic",
            "task": TASK,
            "events": MINIMAL,
        }
    )
    return out


def main() -> None:
    """Write `examples.json` (the attribution first, then the examples)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--meds", type=Path, required=True, help="the MIMIC-IV demo MEDS root")
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args()
    document = {"attribution": ATTRIBUTION, "examples": examples(args.meds)}
    args.out.write_text(json.dumps(document, indent=None, separators=(",", ":")) + "\n")
    print(f"wrote {args.out}: {[len(e['events']) for e in document['examples']]} events")


if __name__ == "__main__":
    main()
