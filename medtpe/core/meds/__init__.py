"""MEDS data: events, datasets read with pyarrow, label files, the project's subject split.

    from medtpe.core.meds import MedsDataset, read_labels

    dataset = MedsDataset.load("mimic-iv-demo-meds")
    for point in read_labels("mimic-iv-demo-meds/labels/icu_mortality.parquet"):
        events = dataset.events(point.subject_id)  # SubjectEvents, static events first

Modules: `events` (`MedsEvent`, the columnar `SubjectEvents`), `json_events` (a JSON array of
events straight into columns), `readers` (datasets, code descriptions, label files, splits),
`prediction_point` (a label file's row), `subject_split` (the one train / held-out split),
`labels` (label files of the built-in tasks derived from events, or from ACES),
`predictions_file` (results as a meds-evaluation predictions file), `canonical` (a record's
canonical form and digest, for a prediction's receipt).
"""

from medtpe.core.meds.events import MedsEvent, SubjectEvents
from medtpe.core.meds.prediction_point import PredictionPoint
from medtpe.core.meds.readers import MedsDataset, read_labels

__all__ = [
    "MedsDataset",
    "MedsEvent",
    "PredictionPoint",
    "SubjectEvents",
    "canonical",
    "events",
    "json_events",
    "labels",
    "prediction_point",
    "predictions_file",
    "read_labels",
    "readers",
    "subject_split",
]
