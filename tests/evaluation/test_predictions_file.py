"""`predictions.parquet` as meds-evaluation reads it: written from an evaluation's per-record
results and scored by the real meds-evaluation package (its Python API and its command line); the
format's layouts: tests/core/meds/test_predictions_file.py."""

from __future__ import annotations

import json
import subprocess
import sys
from datetime import datetime
from pathlib import Path

import numpy as np
import polars as pl
import pytest
from meds_evaluation.evaluate import evaluate_binary_classification
from meds_evaluation.schema import PredictionSchema

from medtpe.core.meds import MedsEvent, PredictionPoint, SubjectEvents
from medtpe.core.tasks import get_task
from medtpe.evaluation.figures import summarise_mode
from medtpe.evaluation.predictions import predictions_table, write_predictions
from medtpe.evaluation.record_result import RecordResult
from medtpe.evaluation.records import EvalRecord

WHEN = datetime(2150, 3, 2, 8)
MORTALITY = get_task("icu_mortality")


def record(subject_id: int, label: object) -> EvalRecord:
    events = SubjectEvents.from_events(
        [MedsEvent(subject_id=subject_id, time=datetime(2150, 3, 1), code="LAB//1//x")]
    )
    return EvalRecord(PredictionPoint(subject_id, WHEN, label), events)


def result(rec: EvalRecord, prediction: object, p: float | None, ok: bool = True) -> RecordResult:
    return RecordResult(
        key=rec.key,
        label=rec.label,
        prediction=prediction,
        format_ok=ok,
        latency_s=1.0,
        generate_s=1.0,
        n_tokens=10,
        original_tokens=10,
        p_yes=p,
    )


def binary_case() -> tuple[list[EvalRecord], list[RecordResult]]:
    rng = np.random.default_rng(3)
    labels = [bool(v) for v in rng.random(40) < 0.4]
    records = [record(i, label) for i, label in enumerate(labels)]
    results = []
    for rec in records:
        p = float(np.clip(0.35 * rec.label + rng.random() * 0.65, 0, 1))
        parsed = rng.random() > 0.1  # some answers do not parse
        results.append(result(rec, p > 0.5 if parsed else None, p, ok=parsed))
    return records, results[::-1]  # any order: matched by key


def test_binary_predictions_score_the_same_in_meds_evaluation(tmp_path: Path) -> None:
    records, results = binary_case()
    path = tmp_path / "predictions.parquet"
    write_predictions(MORTALITY, records, results, path)
    frame = pl.read_parquet(path)
    assert frame.columns == [
        "subject_id",
        "prediction_time",
        "boolean_value",
        "predicted_boolean_value",
        "predicted_boolean_probability",
    ]
    PredictionSchema.align(frame.to_arrow())  # the package's own schema check

    scored = evaluate_binary_classification(frame)["samples_equally_weighted"]
    ours = summarise_mode("original", MORTALITY, results)
    assert scored["roc_auc_score"] == pytest.approx(ours.auroc.value, abs=1e-6)
    assert scored["average_precision_score"] == pytest.approx(ours.auprc.value, abs=1e-6)
    assert scored["brier_score"] == pytest.approx(ours.brier.value, abs=1e-6)
    # unparsed answers are written wrong, so meds-evaluation's F1 is the report's F1
    assert scored["f1_score"] == pytest.approx(ours.f1.value)


def test_meds_evaluation_command_line_reads_the_file(tmp_path: Path) -> None:
    records, results = binary_case()
    path, out = tmp_path / "predictions.parquet", tmp_path / "scores.json"
    write_predictions(MORTALITY, records, results, path)
    cli = Path(sys.executable).with_name("meds-evaluation-cli")
    done = subprocess.run(
        [str(cli), f"predictions_path={path}", f"output_file={out}"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    scores = json.loads(out.read_text())
    ours = summarise_mode("original", MORTALITY, results)
    assert scores["samples_equally_weighted"]["roc_auc_score"] == pytest.approx(
        ours.auroc.value, abs=1e-6
    )


def test_a_result_missing_for_a_record_is_an_error() -> None:
    records, results = binary_case()
    with pytest.raises(ValueError, match="no result"):
        predictions_table(MORTALITY, records, results[1:])
