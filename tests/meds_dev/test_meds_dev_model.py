"""The MEDS-DEV `model.yaml`: a predict step only, whose command, formatted the way MEDS-DEV
formats it, is a valid `medtpe predict` invocation writing its predictions into `{output_dir}`,
with the metadata MEDS-DEV's model registry requires."""

from __future__ import annotations

import shlex

import pytest
import yaml

from medtpe.cli.predict_commands import predict
from tests.support.paths import ROOT

MODEL_YAML = ROOT / "meds_dev" / "model.yaml"
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
    assert supervised["predict"].startswith("medtpe predict")


def test_metadata_as_meds_dev_requires() -> None:
    metadata = yaml.safe_load(MODEL_YAML.read_text())["metadata"]
    assert isinstance(metadata["description"], str) and metadata["description"]
    assert isinstance(metadata["links"], list)
    assert metadata["contacts"] and all(c.get("name") for c in metadata["contacts"])


def test_predict_command_parses_as_medtpe_predict(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MEDTPE_TASK", "icu_mortality")
    predict_step = yaml.safe_load(MODEL_YAML.read_text())["commands"]["supervised"]["predict"]
    argv = shlex.split(predict_step.format(**FORMAT))
    assert argv[:2] == ["medtpe", "predict"]
    # MEDS-DEV writes the command into a bash script as is: a line break would end the command
    assert "\n" not in predict_step
    # parse only: resilient parsing does not check that the paths exist
    context = predict.make_context("predict", argv[2:], resilient_parsing=True)
    params = context.params
    # MEDS-DEV passes no task: the environment does
    assert params["task_names"] == ("icu_mortality",)
    labels = argv.index("--labels")  # (not converted here: resilient parsing checks no path)
    assert argv[labels + 1] == "/data/labels/mortality"
    assert str(params["out_dir"]) == "/runs/medtpe"
    assert params["mode"] == "medtpe" and params["split"] == "held_out"
    assert params["constrained"] is True
