"""The MEDS-DEV `model.yaml`: a predict step only, whose command, formatted the way MEDS-DEV
formats it, is a valid `medtpe evaluate` invocation writing `{output_dir}/predictions.parquet`."""

from __future__ import annotations

import shlex
from pathlib import Path

import pytest
import yaml

from medtpe_cli.evaluation_commands import evaluate

MODEL_YAML = Path(__file__).resolve().parents[1] / "meds_dev" / "model.yaml"
FORMAT = {
    "dataset_dir": "/data/meds",
    "labels_dir": "/data/labels/mortality",
    "output_dir": "/runs/medtpe",
    "model_dir": "/models/medtpe",
    "demo": False,
}


def test_only_the_supervised_predict_step() -> None:
    commands = yaml.safe_load(MODEL_YAML.read_text())["commands"]
    assert commands["unsupervised"] is None
    supervised = commands["supervised"]
    assert supervised["train"] is None and supervised["hyperparameter_tune"] is None
    assert supervised["predict"].startswith("medtpe evaluate")


def test_predict_command_parses_as_medtpe_evaluate(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MEDTPE_TASK", "icu_mortality")
    predict = yaml.safe_load(MODEL_YAML.read_text())["commands"]["supervised"]["predict"]
    argv = shlex.split(predict.format(**FORMAT))
    assert argv[:2] == ["medtpe", "evaluate"]
    # parse only: resilient parsing does not check that the paths exist
    context = evaluate.make_context("evaluate", argv[2:], resilient_parsing=True)
    params = context.params
    assert params["task_name"] == "icu_mortality"
    assert str(params["predictions_out"]) == "/runs/medtpe/predictions.parquet"
    assert params["mode"] == "medtpe" and params["split"] == "held_out"
    assert params["constrained"] is True
