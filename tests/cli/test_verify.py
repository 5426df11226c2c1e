"""`medtpe verify`'s re-derivation on the instant engine: a prediction recorded as a door
records it re-derives to the same record, artefact, rendering, prompt, answer and p("yes");
a changed record, artefact, dtype or engine is named; a receipt written before receipts named
the dtype that ran (`auto`) still verifies; an edited row fails its signature check through the
command line."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import uuid
from pathlib import Path

import click
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner

from medtpe.cli.ledger_commands import RecordSource, rederive, rerun_dtype
from medtpe.cli.main import cli
from medtpe.core.meds.readers import MedsDataset
from medtpe.core.tasks import get_task
from medtpe.inference.engines.instant import InstantEngine
from medtpe.inference.engines.protocol import Engine, EngineConfig
from medtpe.inference.model import LoadedModel, ModelConfig, load_model
from medtpe.inference.predictor import Answer, PreparedRecord
from medtpe.inference.receipt_facts import answer_facts
from medtpe.inference.record import MedsRecord
from medtpe.inference.sampling import Sampling
from medtpe.ledger.answers import ReceiptBasis
from medtpe.ledger.receipt import Receipt
from medtpe.ledger.store import Ledger, PredictionRow
from medtpe.ledger.verification import check_row, compare
from tests.support.ledger_rows import SIGNER
from tests.support.meds_fixtures import PREDICTION_TIME, write_meds_dataset, write_table
from tests.support.rederived import rederived_checks

SUBJECT = 2


@pytest.fixture(scope="module")
def meds_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_meds_dataset(tmp_path_factory.mktemp("meds"))


@pytest.fixture(scope="module")
def model_files(service_files: tuple[Path, Path], meds_dir: Path) -> dict[str, Path]:
    artefact, export = service_files
    return {"artefact_dir": artefact, "export_dir": export, "codes_dir": meds_dir}


def door_row(
    loaded: LoadedModel,
    engine: Engine,
    prepared: PreparedRecord,
    sampling: Sampling,
    answer: Answer,
) -> PredictionRow:
    """The ledger row a door writes for `answer` (`medtpe predict` on MEDS input, the record
    kept)."""
    facts = answer_facts(loaded, engine, prepared, sampling, answer, latency_s=0.001)
    basis = ReceiptBasis.of(facts, keep_record=True)
    return basis.signed(SIGNER, door="batch_meds", caller="cli")


@pytest.fixture(scope="module")
def recorded(model_files: dict[str, Path], meds_dir: Path) -> PredictionRow:
    """A prediction of subject 2 answered on the instant engine, as a door records it."""
    config = ModelConfig.from_options(
        **model_files, mode="medtpe", max_input_tokens=1024, max_new_tokens=16, dtype="float32"
    )
    loaded = load_model(config)
    task = get_task("icu_mortality")
    events = MedsDataset.load(meds_dir).events(SUBJECT)
    prepared = MedsRecord(events, PREDICTION_TIME).prepare(loaded.predictor, task)
    sampling = Sampling(max_new_tokens=16)
    engine = InstantEngine.factory()(loaded.engine_config)
    answer = asyncio.run(loaded.predictor.answer(engine, prepared, sampling))
    return door_row(loaded, engine, prepared, sampling, answer)


def test_a_recorded_prediction_re_derives_from_the_meds_dataset_and_the_stored_record(
    recorded: PredictionRow, model_files: dict, meds_dir: Path
) -> None:
    assert Receipt.from_text(recorded.receipt).p_yes is not None
    for source in (RecordSource(meds_dir=meds_dir), RecordSource()):
        checks = rederived_checks(recorded, source, model_files)
        assert {part: check.ok for part, check in checks.items()} == dict.fromkeys(
            ("record", "artefact", "rendering", "prompt", "dtype", "answer", "p_yes"), True
        ), checks
        assert checks["prompt"].detail == "same prompt"
        assert checks["dtype"].detail == "same dtype (float32)"


def test_a_changed_record_artefact_or_engine_is_named(
    recorded: PredictionRow, model_files: dict, meds_dir: Path, tmp_path: Path
) -> None:
    changed = tmp_path / "meds"
    write_meds_dataset(changed)
    for shard in (changed / "data").rglob("*.parquet"):  # subject 2's first lab value
        rows = pq.read_table(shard).to_pylist()
        seen = [
            i
            for i, r in enumerate(rows)
            if r["subject_id"] == SUBJECT
            and r["numeric_value"] is not None
            and r["time"] <= PREDICTION_TIME
        ]
        if seen:
            rows[seen[0]]["numeric_value"] += 1.0
            write_table(shard, rows)
    checks = rederived_checks(recorded, RecordSource(meds_dir=changed), model_files)
    assert not checks["record"].ok and checks["record"].detail.startswith("record changed")
    assert not checks["prompt"].ok and "inputs differ" in checks["prompt"].detail

    checks = rederived_checks(
        recorded, RecordSource(), model_files, artefact_digest="0" * 64, answer=False, p_yes=0.5
    )
    assert checks["artefact"].detail.startswith("artefact changed")
    assert checks["answer"].detail.startswith("engine drifted: answer True")
    assert checks["p_yes"].detail.startswith("engine drifted: |Δp(yes)|")
    assert checks["record"].ok and checks["prompt"].ok


def test_a_receipt_that_says_auto_still_verifies(
    recorded: PredictionRow, model_files: dict
) -> None:
    """A receipt written before receipts named the dtype that ran says `auto`: its signature
    holds, the re-run is in `auto` as this machine resolves it or in `--dtype`, and the dtype
    line says which; a re-run in another dtype than a receipt names is a difference."""
    old = dataclasses.replace(Receipt.from_text(recorded.receipt), dtype="auto")
    row = dataclasses.replace(
        recorded, receipt=old.canonical().decode(), signature=SIGNER.sign(old)
    )
    receipt, row_checks = check_row(row, SIGNER.public_key)
    assert receipt == old and all(check.ok for check in row_checks), row_checks
    for given, ran in ((None, "float32"), ("bfloat16", "bfloat16")):
        dtype = rerun_dtype(receipt.dtype, given)
        again = rederive(
            row, receipt, RecordSource(), model_files, InstantEngine.factory(), dtype=dtype
        )
        checks = {check.part: check for check in compare(receipt, again)}
        assert all(check.ok for check in checks.values()), checks
        assert checks["dtype"].detail.startswith(f"re-run in {ran}; the receipt says auto")
    named = Receipt.from_text(recorded.receipt)
    assert rerun_dtype(named.dtype, None) == rerun_dtype(named.dtype, "float32") == "float32"
    with pytest.raises(click.UsageError, match=r"the receipt names its dtype \(float32\)"):
        rerun_dtype(named.dtype, "bfloat16")
    again = rederive(
        recorded, named, RecordSource(), model_files, InstantEngine.factory(), dtype="float16"
    )
    checks = {check.part: check for check in compare(named, again)}
    assert not checks["dtype"].ok
    assert checks["dtype"].detail == "dtype changed: re-run in float16, the receipt's float32"


def test_the_rerun_engine_is_eager(recorded: PredictionRow, model_files: dict) -> None:
    """One answer to re-derive: its engine skips torch.compile (minutes on a CPU)."""
    started = []

    def start(config: EngineConfig) -> InstantEngine:
        started.append(config)
        return InstantEngine.factory()(config)

    rederive(recorded, Receipt.from_text(recorded.receipt), RecordSource(), model_files, start)
    assert [config.options.enforce_eager for config in started] == [True]


def test_the_command_line_names_an_edited_row(
    recorded: PredictionRow, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    url = f"sqlite:///{tmp_path / 'ledger.sqlite3'}"
    edited = dataclasses.replace(recorded, prediction_id=str(uuid.uuid4()), answer='"no"')
    forged_receipt = Receipt.from_text(recorded.receipt)
    forged = dataclasses.replace(
        recorded,
        prediction_id=str(uuid.uuid4()),
        receipt=dataclasses.replace(forged_receipt, p_yes=0.99).canonical().decode(),
        p_yes=0.99,
    )
    ledger = Ledger.open(url, keep_records=True)
    ledger.record([recorded])
    with ledger.engine.begin() as connection:  # edits behind the ledger's back
        for row in (edited, forged):
            values = row.values()
            connection.execute(ledger_table().insert().values(values))
    ledger.close()
    key = tmp_path / "key.jwk"
    key.write_text(json.dumps(SIGNER.jwk()))
    monkeypatch.setenv("MEDTPE_LEDGER_URL", url)
    run = CliRunner().invoke
    args = ["--signature-only", "--public-key", str(key)]
    ok = run(cli, ["verify", recorded.prediction_id, *args])
    assert ok.exit_code == 0, ok.output
    assert "ok   signature" in ok.output
    bad = run(cli, ["verify", edited.prediction_id, *args])
    assert bad.exit_code == 1 and "row edited: answer, prediction_id differ" in bad.output
    bad = run(cli, ["verify", forged.prediction_id, *args])
    assert bad.exit_code == 1 and "DIFF signature signature invalid" in bad.output
    missing = run(cli, ["verify", str(uuid.uuid4()), *args])
    assert missing.exit_code == 1 and "no prediction" in missing.output


def ledger_table():
    from medtpe.ledger.schema import Prediction

    return Prediction.__table__
