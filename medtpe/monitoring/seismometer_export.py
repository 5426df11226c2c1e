"""The report's predictions in the input format of Epic's seismometer (its `ConfigProvider` and
`loader_factory` read them), one folder per task:

- `predictions.parquet`: `Id` (the subject), `ContextId` (the prediction id), `PredictTime` (the
  prediction time on the record's clock; the ledger's time where it has none), `Score` (p("yes")),
  `Threshold`, and the cohort columns `Site`, `Silent` and every attribute (sex, age band, mapped);
- `events.parquet`: `Id`, `ContextId`, `Type` (`Outcome`), `EventTime` (when the outcome became
  known: its horizon's end), `Value` (1 or 0), one row per known outcome;
- `metadata.json`: the model's name and the operating thresholds;
- `config.yml`, `usage_config.yml` (`data_usage`: keys, score, target, cohorts) and
  `dictionary.yml` (what each column is).

Only scored predictions (with a p("yes")) are exported, shadow rows left out (they answer
requests a second way), silent rows kept and marked. seismometer reads a prediction without an
outcome event as a negative, so `usage_config.yml` keeps only those whose outcome is known
(`load_time_filters` on `OutcomeStatus`) when `seismometer.run_startup` loads the export."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import yaml

from medtpe.monitoring.frame import Monitored

PREDICTIONS = "predictions.parquet"
EVENTS = "events.parquet"
METADATA = "metadata.json"
OUTCOME = "Outcome"
COHORT_COLUMNS = {"sex": "Sex", "age_band": "AgeBand"}
"""Column names of the built-in attributes (mapped attributes keep their own names)."""


def _text(values: np.ndarray) -> pa.Array:
    """A text column from numpy's texts, never through a fixed-width copy of them (4 bytes a
    character of the longest: a report's ids alone would take 144 bytes a row)."""
    return pa.array(values, pa.string())


def _column(name: str) -> str:
    return COHORT_COLUMNS.get(name, name)


def write_task(data: Monitored, rows: np.ndarray, thresholds: np.ndarray, folder: Path) -> None:
    """The export of the rows `rows` (one task) into `folder`."""
    folder.mkdir(parents=True, exist_ok=True)
    when = np.where(
        np.isnat(data.prediction_time[rows]), data.created_at[rows], data.prediction_time[rows]
    )
    columns: dict[str, pa.Array] = {
        "Id": _text(data.subject_id[rows]),
        "ContextId": _text(data.prediction_id[rows]),
        "PredictTime": pa.array(when, pa.timestamp("us")),
        "Score": pa.array(data.p_yes[rows], pa.float64(), from_pandas=True),
        "Threshold": pa.array(thresholds[rows], pa.float64()),
        "Site": _text(np.where(data.site[rows] == "", "(none)", data.site[rows])),
        "Silent": _text(np.where(data.silent[rows], "silent", "live")),
        "OutcomeStatus": _text(np.where(data.status[rows] == "", "not_joined", data.status[rows])),
    }
    for name, values in sorted(data.attributes.items()):
        columns[_column(name)] = _text(np.where(values[rows] == "", "(unknown)", values[rows]))
    pq.write_table(pa.table(columns), folder / PREDICTIONS)
    known_mask = ~np.isnan(data.label[rows])
    known = rows[known_mask]
    ends = data.horizon_end[known]
    event_time = np.where(np.isnat(ends), when[known_mask], ends)
    events = pa.table(
        {
            "Id": _text(data.subject_id[known]),
            "ContextId": _text(data.prediction_id[known]),
            "Type": pa.array([OUTCOME] * len(known), pa.string()),
            "EventTime": pa.array(event_time, pa.timestamp("us")),
            "Value": pa.array(data.label[known].astype(np.int64)),
        }
    )
    pq.write_table(events, folder / EVENTS)
    cohorts = ["Site", "Silent", *(_column(n) for n in sorted(data.attributes))]
    _write_configuration(folder, cohorts)
    metadata = {
        "modelname": f"MedTPE {data.task[rows][0]}" if len(rows) else "MedTPE",
        "thresholds": sorted({float(t) for t in thresholds[rows]}, reverse=True),
    }
    (folder / METADATA).write_text(json.dumps(metadata, indent=1) + "\n", encoding="utf-8")


def _write_configuration(folder: Path, cohorts: list[str]) -> None:
    config = {
        "other_info": {
            "template": "binary",
            "usage_config": "usage_config.yml",
            "info_dir": str((folder / "outputs").resolve()),
            "data_dir": str(folder.resolve()),
            "prediction_path": PREDICTIONS,
            "event_path": EVENTS,
            "event_definition": "dictionary.yml",
            "prediction_definition": "dictionary.yml",
        }
    }
    usage = {
        "data_usage": {
            "entity_id": "Id",
            "context_id": "ContextId",
            "primary_output": "Score",
            "primary_target": OUTCOME,
            "predict_time": "PredictTime",
            "event_table": {"type": "Type", "time": "EventTime", "value": "Value"},
            "outputs": ["Score"],
            "load_time_filters": [
                {"source": "OutcomeStatus", "action": "include", "values": ["known"]}
            ],
            "cohorts": [{"source": c} for c in cohorts],
            "events": [
                {
                    "source": [OUTCOME],
                    "display_name": OUTCOME,
                    "usage": "target",
                    "aggregation_method": "max",
                }
            ],
        }
    }
    dictionary = {
        "predictions": [
            {"name": "Id", "definition": "The patient (MEDS subject id)."},
            {"name": "ContextId", "definition": "The ledger's prediction id."},
            {
                "name": "PredictTime",
                "dtype": "datetime64[ns]",
                "definition": "The prediction time.",
            },
            {"name": "Score", "dtype": "float", "definition": 'The model\'s p("yes").'},
            {"name": "Threshold", "dtype": "float", "definition": "The operating threshold."},
            {
                "name": "OutcomeStatus",
                "dtype": "string",
                "definition": "known, open (horizon not reached), no_label or not_joined.",
            },
            *({"name": c, "dtype": "string", "definition": "A cohort attribute."} for c in cohorts),
        ],
        "events": [
            {
                "name": OUTCOME,
                "dtype": "int",
                "definition": "The task's outcome (1: happened), known at its horizon's end.",
            }
        ],
    }
    for name, content in (
        ("config.yml", config),
        ("usage_config.yml", usage),
        ("dictionary.yml", dictionary),
    ):
        (folder / name).write_text(yaml.safe_dump(content, sort_keys=False), encoding="utf-8")


def write_seismometer(data: Monitored, thresholds: np.ndarray, out: Path) -> list[Path]:
    """One export per task of the period's rows (shadows left out) under `out`; the folders."""
    folders = []
    kept = data.in_period & (data.shadow_of == "") & ~np.isnan(data.p_yes)
    for task in sorted(set(data.task[kept])):
        folder = out / task
        write_task(data, np.flatnonzero(kept & (data.task == task)), thresholds, folder)
        folders.append(folder)
    return folders
