"""A second architecture end to end: a tiny Qwen2 checkpoint (random weights, untied output head,
Qwen2.5's 151,936 embedding rows) with the real Qwen2.5 tokenizer and chat template goes through
`medtpe build-artefact` (the default artefact's method: rows distilled to be read at a RoPE
stretch; the real vLLM engine answers the gate in both modes: the base checkpoint, and the export
with its new rows and stretch through the service's loader, `Predictor` and stop rule),
`medtpe export` (the stretch in its config) and the service's `POST /predict` on the artefact.
Its answers are noise; the path is what is tested.

The service's request runs in-process on the instant engine: the gate's second engine already
served this export through the service's own model loading, and a third engine start (a `medtpe
serve` process: two imports of torch and vLLM, a minute or more on a loaded 2-core machine) would
check the same engine again; the service's process and HTTP layer on the real engine are the
session service's tests (tests/service/)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("vllm")

from click.testing import CliRunner

from medtpe.cli.main import cli
from medtpe.core.tokenizer import MedTPETokenizer
from medtpe.service.settings import ServiceSettings
from medtpe.training.export import load_rows
from tests.support.meds_fixtures import write_meds_dataset
from tests.support.model_fixtures import QWEN25_VOCAB_SIZE, tiny_qwen2
from tests.support.service_support import instant_client, own_ledger_settings, synthetic_events

pytestmark = [pytest.mark.slow, pytest.mark.engine, pytest.mark.timeout(1800)]

SETTINGS = """\
tasks: [icu_mortality]
budget: 64
n_train: 4
n_val: 2
held_out: 0.25
max_input_tokens: 512
serving_budgets: [512]
n_gate: 2
min_same_answer: 0  # a random model's answers are noise: the gate's path is what is tested
max_delta_p_mean: 1
gate_dtype: auto  # the machine's served dtype, its fast path (float32 is tested apart)
mining_max_tokens: 800
distill:  # the default artefact's method: no pseudo-labelling engine to start
  snippets: 16
  val_snippets: 4
  snippet_tokens: 32
  batch_size: 8
  epochs: 1
  start: last
  output: base
  rope_stretch: 1.5
losses: []
max_new_tokens: 8
device: cpu
"""


def test_qwen2_build_export_serve_predict(tmp_path: Path) -> None:
    base = tiny_qwen2(tmp_path / "tiny-qwen2")
    meds = write_meds_dataset(tmp_path / "meds", subjects=tuple(range(1, 9)))
    config = tmp_path / "build.yaml"
    config.write_text(SETTINGS)
    out, export = tmp_path / "artefact", tmp_path / "export"
    runner = CliRunner()

    args = ["--config", str(config), "--base", str(base), "--meds", str(meds), "--out", str(out)]
    built = runner.invoke(cli, ["build-artefact", *args], catch_exceptions=False)
    assert built.exit_code == 0, built.output
    report = json.loads((out / "build_report.json").read_text())
    assert report["base"]["model_type"] == "qwen2" and not report["base"]["tied_embeddings"]
    assert report["base"]["vocab_size"] == QWEN25_VOCAB_SIZE
    assert report["base"]["eos_ids"] == [151645]  # <|im_end|>, from the generation config
    assert report["pseudo_label"] is None and report["distill"]["steps"] == 2
    assert report["gate"]["512"]["dtype"] == "auto"
    gate = report["gate"]["512"]["fidelity"]  # both models answered in vLLM at 512 tokens
    assert gate["n_records"] == 2 and gate["generated_tokens_mean"]["medtpe"] > 0
    assert report["measure"]["compression"]["record_compression_rate"] > 0
    tokenizer = MedTPETokenizer.load(out)
    assert tokenizer.artefact_id == report["artefact_id"] and len(tokenizer.new_tokens) == 64
    rows, _ = load_rows(out)
    assert rows.input.shape == (64, 128)  # untied: the output side is the base head's rows
    assert rows.output_base and rows.output is None
    assert rows.rope_stretch == 1.5

    exported = runner.invoke(
        cli, ["export", "--base", str(base), "--medtpe", str(out), "--out", str(export)]
    )
    assert exported.exit_code == 0, exported.output
    rope = json.loads((export / "config.json").read_text())["rope_parameters"]
    assert (rope["rope_type"], rope["factor"]) == ("yarn", 1 / 1.5)  # vLLM serves it stretched

    settings = ServiceSettings(
        model_dir=base,
        artefact_dir=out,
        export_dir=export,
        max_input_tokens=512,
        max_new_tokens=8,
        **own_ledger_settings(),
    )
    with instant_client(settings) as client:
        body = {"task": "icu_mortality", "events": synthetic_events(1, 80)}
        response = client.post("/predict", json=body)
    assert response.status_code == 200, response.text
    answer = response.json()
    assert answer["model"]["artefact_id"] == report["artefact_id"]
    assert answer["model"]["mode"] == "medtpe"
    assert 0 < answer["tokens"]["medtpe"] < answer["tokens"]["original"] <= 512
    assert 1 <= answer["tokens"]["generated"] <= 8
    assert answer["prediction"] is True  # the instant engine answers "yes"
