"""Readers for MEDS datasets (`data/**/*.parquet`, `metadata/codes.parquet`,
`metadata/dataset.json`, `metadata/subject_splits.parquet`) and MEDS label files, with pyarrow.

A dataset (or one of its data shards: MEDS keeps each subject in one shard) is read once into
columns and grouped by subject with numpy; no per-row Python objects are built for it. Schemas
come from the `meds` package; a file that does not match raises `MedsFormatError` naming the
file and the column.
"""

from __future__ import annotations

import json
from collections.abc import Collection, Iterator, Mapping, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

import meds
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from flexible_schema.exceptions import SchemaValidationError, TableValidationError

from medtpe.core.meds.events import SubjectEvents
from medtpe.core.meds.prediction_point import PredictionPoint

LABEL_VALUE_COLUMNS = ("boolean_value", "integer_value", "float_value", "categorical_value")


class MedsFormatError(ValueError):
    """A MEDS file is missing, unreadable, or has a missing / wrongly typed / invalid column."""


def _parquet_files(path: Path) -> list[Path]:
    files = sorted(path.glob("**/*.parquet")) if path.is_dir() else [path]
    if not files or not files[0].exists():
        raise MedsFormatError(f"no parquet files at {path}")
    return files


def _read_aligned(
    files: list[Path],
    schema: type[meds.DataSchema] | type[meds.LabelSchema] | type[meds.SubjectSplitSchema],
) -> pa.Table:
    tables = []
    for file in files:
        try:
            tables.append(schema.align(pq.read_table(file)))
        except (SchemaValidationError, TableValidationError) as exc:
            raise MedsFormatError(f"{file}: {exc}") from exc
        except (OSError, pa.ArrowInvalid) as exc:
            raise MedsFormatError(f"{file}: not a readable parquet file ({exc})") from exc
    return pa.concat_tables(tables, promote_options="default")


def _require_non_null(table: pa.Table, column: str, where: Path) -> None:
    nulls = table.column(column).null_count
    if nulls:
        raise MedsFormatError(f"{where}: column '{column}' has {nulls} null value(s)")


def _require_finite(values: np.ndarray, column: str, where: Path) -> None:
    bad = np.isinf(values) | np.isnan(values)
    if bad.any():
        row = int(np.flatnonzero(bad)[0])
        raise MedsFormatError(
            f"{where}: column '{column}' has non-finite value {values[row]} at row {row}"
        )


class MedsDataset:
    """A MEDS dataset directory held as sorted columns, grouped by subject."""

    def __init__(
        self, root: Path, table: pa.Table, descriptions: dict[str, str], metadata: dict[str, Any]
    ):
        self.root = root
        self.descriptions = descriptions
        self.metadata = metadata
        times = table.column("time").to_numpy(zero_copy_only=False).astype("datetime64[us]")
        # stable: same-time events keep file order; NaT (static) is the smallest int64, so first
        order = np.lexsort((times.astype("int64"), table.column("subject_id").to_numpy()))
        table = table.take(order)
        subjects = table.column("subject_id").to_numpy()
        self._times = times[order]
        self._codes = table.column("code").to_pylist()
        values = pc.fill_null(table.column("numeric_value").cast(pa.float64()), np.nan).to_numpy()
        # non-finite check on present values only (nulls became NaN just above)
        present = ~np.asarray(
            table.column("numeric_value").is_null().to_numpy(zero_copy_only=False)
        )
        _require_finite(values[present], "numeric_value", root)
        self._values = values
        self._texts: list[str | None] = (
            table.column("text_value").to_pylist()
            if "text_value" in table.column_names
            else [None] * len(subjects)
        )
        ids, starts = np.unique(subjects, return_index=True)
        ends = np.append(starts[1:], len(subjects))
        self._slices = {int(s): (int(a), int(b)) for s, a, b in zip(ids, starts, ends, strict=True)}

    @classmethod
    def load(cls, root: str | Path, shards: Sequence[Path] | None = None) -> MedsDataset:
        """Read `root/data/**/*.parquet` (or only the data files `shards`) and the optional
        codes / dataset metadata."""
        root = Path(root)
        files = list(shards) if shards is not None else data_shards(root)
        table = _read_aligned(files, meds.DataSchema)
        where = files[0] if len(files) == 1 else root / meds.data_subdirectory
        _require_non_null(table, "subject_id", where)
        _require_non_null(table, "code", where)
        return cls(root, table, read_code_descriptions(root), read_dataset_metadata(root))

    @property
    def meds_version(self) -> str | None:
        """The MEDS version the dataset declares in `metadata/dataset.json` (None if none)."""
        value = self.metadata.get(meds.DatasetMetadataSchema.meds_version_name)
        return None if value is None else str(value)

    @property
    def subject_ids(self) -> list[int]:
        """Subject ids, ascending."""
        return list(self._slices)

    @property
    def n_events(self) -> int:
        """Number of events in the dataset."""
        return len(self._codes)

    def events(self, subject_id: int) -> SubjectEvents:
        """All events of one subject, sorted by time (static first); KeyError if unknown."""
        start, end = self._slices[subject_id]
        return SubjectEvents(
            subject_id=subject_id,
            times=self._times[start:end],
            codes=self._codes[start:end],
            numeric_values=self._values[start:end],
            text_values=self._texts[start:end],
        )

    def __iter__(self) -> Iterator[SubjectEvents]:
        return (self.events(s) for s in self._slices)


def data_shards(root: str | Path) -> list[Path]:
    """The data shards of a MEDS dataset (`data/*.parquet` or `data/**/*.parquet`), sorted."""
    root = Path(root)
    data_dir = root / meds.data_subdirectory
    if not data_dir.is_dir():
        raise MedsFormatError(
            f"{root}: no '{meds.data_subdirectory}/' directory (not a MEDS dataset)"
        )
    return _parquet_files(data_dir)


def read_code_descriptions(root: str | Path) -> dict[str, str]:
    """`code -> description` from `metadata/codes.parquet` (empty if the file is absent)."""
    path = Path(root) / meds.code_metadata_filepath
    if not path.exists():
        return {}
    try:
        table = pq.read_table(path, columns=["code", "description"])
    except (OSError, pa.ArrowInvalid, KeyError) as exc:
        raise MedsFormatError(
            f"{path}: needs string columns 'code' and 'description' ({exc})"
        ) from exc
    return {
        code: desc
        for code, desc in zip(
            table.column("code").to_pylist(), table.column("description").to_pylist(), strict=True
        )
        if code is not None and desc
    }


def write_code_descriptions(root: str | Path, descriptions: Mapping[str, str]) -> Path:
    """Write `descriptions` as `root/metadata/codes.parquet` (string columns `code` and
    `description`, sorted by code: what `read_code_descriptions` reads back); returns its path."""
    path = Path(root) / meds.code_metadata_filepath
    path.parent.mkdir(parents=True, exist_ok=True)
    codes = sorted(descriptions)
    table = pa.table(
        {
            "code": pa.array(codes, pa.string()),
            "description": pa.array([descriptions[c] for c in codes], pa.string()),
        }
    )
    pq.write_table(table, path, compression="zstd")
    return path


def read_dataset_metadata(root: str | Path) -> dict[str, Any]:
    """The `metadata/dataset.json` object (empty if absent)."""
    path = Path(root) / meds.dataset_metadata_filepath
    if not path.exists():
        return {}
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as exc:
        raise MedsFormatError(f"{path}: not valid JSON ({exc})") from exc
    if not isinstance(data, dict):
        raise MedsFormatError(f"{path}: expected a JSON object")
    return data


def read_subject_splits(root: str | Path) -> dict[int, str]:
    """`subject_id -> split` from `metadata/subject_splits.parquet` (empty if the file is absent);
    MEDS names the splits `train`, `tuning` and `held_out`."""
    path = Path(root) / meds.subject_splits_filepath
    if not path.exists():
        return {}
    table = _read_aligned([path], meds.SubjectSplitSchema)
    _require_non_null(table, meds.SubjectSplitSchema.subject_id_name, path)
    subjects = table.column(meds.SubjectSplitSchema.subject_id_name).to_pylist()
    splits = table.column(meds.SubjectSplitSchema.split_name).to_pylist()
    return dict(zip(subjects, splits, strict=True))


def read_labels(path: str | Path) -> list[PredictionPoint]:
    """Rows of a MEDS label file (or a directory of them), in file order; a point's `label` is
    its row's first non-null value column (None if it has none)."""
    path = Path(path)
    table = _read_aligned(_parquet_files(path), meds.LabelSchema)
    _require_non_null(table, "subject_id", path)
    _require_non_null(table, "prediction_time", path)
    if "float_value" in table.column_names:
        floats = table.column("float_value")
        present = floats.filter(floats.is_valid()).cast(pa.float64()).to_numpy()
        _require_finite(present, "float_value", path)
    value_columns = [
        table.column(c).to_pylist() for c in LABEL_VALUE_COLUMNS if c in table.column_names
    ]
    subjects = table.column("subject_id").to_pylist()
    times = table.column("prediction_time").to_pylist()
    rows = []
    for i, (subject_id, time) in enumerate(zip(subjects, times, strict=True)):
        value = next((col[i] for col in value_columns if col[i] is not None), None)
        rows.append(PredictionPoint(subject_id, time, value))
    return rows


def read_prediction_times(
    path: str | Path, subjects: Collection[int] | None = None
) -> list[tuple[int, datetime]]:
    """Distinct (subject_id, prediction_time) pairs of a label file (or a directory of them), in
    file order; only those of `subjects` when given."""
    path = Path(path)
    table = _read_aligned(_parquet_files(path), meds.LabelSchema)
    _require_non_null(table, "subject_id", path)
    _require_non_null(table, "prediction_time", path)
    if subjects is not None:
        wanted = pa.array(sorted(subjects), pa.int64())
        table = table.filter(pc.is_in(table.column("subject_id"), value_set=wanted))
    pairs = zip(
        table.column("subject_id").to_pylist(),
        table.column("prediction_time").to_pylist(),
        strict=True,
    )
    return list(dict.fromkeys(pairs))
