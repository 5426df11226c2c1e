"""The batch job's rows: one `RecordRow` per record, written as a shard's records file
(`records_table`, read back by `read_records`) and as meds-evaluation's predictions
(`predictions_table`)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import meds
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from medtpe.core.figure_names import RENAMED
from medtpe.core.meds.predictions_file import PREDICTED_VALUE, results_table
from medtpe.core.tasks import Prediction, Task


@dataclass(frozen=True)
class RecordRow:
    """One record's result: a row of the records file (`error`: why it was not scored)."""

    record: int
    subject_id: int
    prediction_time: datetime | None
    label: Prediction | None
    prediction: Prediction | None
    format_ok: bool
    p_yes: float | None
    answer: str | None
    error: str | None
    original_tokens: int | None
    medtpe_tokens: int | None
    generate_s: float
    prediction_id: str | None = None
    """The answer's id in the prediction ledger (None: not scored, or the ledger off)."""

    def row(self) -> dict[str, Any]:
        """The records-file row (label and prediction as JSON text)."""
        data = asdict(self)
        data["label"] = None if self.label is None else json.dumps(self.label)
        data["prediction"] = None if self.prediction is None else json.dumps(self.prediction)
        return data

    @classmethod
    def from_row(cls, row: dict[str, Any]) -> RecordRow:
        """The inverse of `row`."""
        data = dict(row)
        for name in ("label", "prediction"):
            data[name] = None if data[name] is None else json.loads(data[name])
        return cls(**data)


RECORDS_SCHEMA = pa.schema(
    [
        ("record", pa.int64()),
        ("subject_id", pa.int64()),
        ("prediction_time", pa.timestamp("us")),
        ("label", pa.string()),
        ("prediction", pa.string()),
        ("format_ok", pa.bool_()),
        ("p_yes", pa.float64()),
        ("answer", pa.string()),
        ("error", pa.string()),
        ("original_tokens", pa.int64()),
        ("medtpe_tokens", pa.int64()),
        ("generate_s", pa.float64()),
        ("prediction_id", pa.string()),
    ]
)


def records_table(rows: Sequence[RecordRow]) -> pa.Table:
    """The records file of `rows`, in record order."""
    ordered = [r.row() for r in sorted(rows, key=lambda r: r.record)]
    return pa.Table.from_pylist(ordered, schema=RECORDS_SCHEMA)


def read_records(path: Path, columns: Sequence[str] | None = None) -> pa.Table:
    """The records file at `path` (`columns`: only those, by their current names), one an
    earlier release wrote included: its columns come back under their current names
    (`medtpe.core.figure_names.RENAMED`)."""
    if columns is not None:
        earlier = {new: old for old, new in RENAMED.items()}
        present = set(pq.read_schema(path).names)
        columns = [c if c in present else earlier.get(c, c) for c in columns]
    table = pq.read_table(path, columns=columns)
    return table.rename_columns([RENAMED.get(name, name) for name in table.column_names])


def predictions_table(task: Task, rows: Sequence[RecordRow], labelled: bool) -> pa.Table:
    """meds-evaluation predictions of `rows` in record order (the predictions file's columns and
    conventions, `medtpe.core.meds.predictions_file.results_table`; a record without a
    prediction time has no row). Without labels: no `boolean_value`, and a null predicted value
    where the record could not be scored."""
    timed = sorted((r for r in rows if r.prediction_time is not None), key=lambda r: r.record)
    table = results_table(
        task, [r.subject_id for r in timed], [r.prediction_time for r in timed], timed
    )
    if labelled:
        return table
    per_record = 1 if task.label_type == "binary" else len(task.labels)
    scored = pa.array([r.format_ok for r in timed for _ in range(per_record)], pa.bool_())
    predicted = pc.if_else(scored, table.column(PREDICTED_VALUE), pa.scalar(None, pa.bool_()))
    column = table.schema.get_field_index(PREDICTED_VALUE)
    table = table.set_column(column, PREDICTED_VALUE, predicted)
    return table.drop_columns([meds.LabelSchema.boolean_value_name])
