"""The ledger at `medtpe predict`'s doors, on the instant engine: every scored record of a MEDS
or a FHIR run is one committed row carrying the records file's prediction id, answer and
p("yes") under a valid signature; a resumed run gives each record its first id and writes no
row twice; a rerun over changed data gives a changed record a row of its own; a ledger that
cannot be opened stops the job before it writes anything."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from medtpe.batch.fhir_job import FhirInput, run_fhir
from medtpe.batch.job import Job, run_local
from medtpe.core.tasks import get_task
from medtpe.inference.engines.instant import InstantEngine
from medtpe.inference.sampling import Sampling
from medtpe.ledger.receipt import Receipt
from medtpe.ledger.settings import LedgerSettings
from medtpe.ledger.signing import parse_private_key, verify_signature
from medtpe.ledger.store import Ledger, LedgerUnavailable
from tests.support.ledger_rows import RFC8037_SEED_B64 as SEED
from tests.support.meds_fixtures import write_meds_dataset
from tests.support.mimic_fhir_fixture import fixture_bundles, fixture_export
from tests.support.service_support import engine_test_config, free_port, instant_settings

TASK = get_task("icu_mortality")
PUBLIC_KEY = parse_private_key(SEED).public_key()


def records(out: Path) -> list[dict[str, Any]]:
    tables = [pq.read_table(p) for p in sorted(out.rglob("*.records.pq"))]
    return sorted(pa.concat_tables(tables).to_pylist(), key=lambda r: r["record"])


def checked_rows(url: str, scored: list[dict[str, Any]], door: str) -> dict[str, Any]:
    """The ledger's rows, one per scored record, each saying what the records file says."""
    ledger = Ledger.open(url)
    try:
        rows = {row.prediction_id: row for row in ledger.rows()}
    finally:
        ledger.close()
    assert sorted(rows) == sorted(r["prediction_id"] for r in scored)
    for record in scored:
        row = rows[record["prediction_id"]]
        receipt = Receipt.from_text(row.receipt)
        assert verify_signature(receipt, row.signature, PUBLIC_KEY)
        assert row.door == door and row.caller == "cli"
        assert json.loads(row.answer) == json.loads(record["prediction"])
        assert row.p_yes == pytest.approx(record["p_yes"])
        assert row.original_tokens == record["original_tokens"]
    return rows


def first_meds_run(
    service_files: tuple[Path, Path], tmp_path: Path, ledger_url: str
) -> tuple[Path, Any, Job, LedgerSettings, Path]:
    """A MEDS run of four subjects on the instant engine, recorded in `ledger_url`: its dataset,
    model configuration, job, ledger settings and output folder, for a second run after it."""
    meds = write_meds_dataset(tmp_path / "meds", subjects=(1, 2, 3, 4), hours=8)
    config = engine_test_config(service_files, meds, max_new_tokens=8)
    labels = meds / "labels" / "icu_mortality.parquet"
    job = Job(meds, TASK, labels=labels, sampling=Sampling(max_new_tokens=8), concurrency=2)
    settings = LedgerSettings(ledger_url, "digest", SEED)
    out = tmp_path / "out"
    run_local(config, job, out, InstantEngine.factory(), settings)
    return meds, config, job, settings, out


def test_a_meds_run_records_each_answer_once_and_a_resumed_run_none_twice(
    service_files: tuple[Path, Path], tmp_path: Path, ledger_url: str
) -> None:
    _, config, job, settings, out = first_meds_run(service_files, tmp_path, ledger_url)
    first = records(out)
    assert len(first) == 4 and all(r["error"] is None for r in first)
    rows = checked_rows(ledger_url, first, "batch_meds")
    assert sorted(row.subject_id for row in rows.values()) == ["1", "2", "3", "4"]

    # a run that died after shard 1's rows were committed, before its files: scored again
    (out / "train" / "1.parquet").unlink()
    (out / "train" / "1.records.pq").unlink()
    run_local(config, job, out, InstantEngine.factory(), settings)
    again = records(out)
    assert [r["prediction_id"] for r in again] == [r["prediction_id"] for r in first]
    assert checked_rows(ledger_url, again, "batch_meds").keys() == rows.keys()


def test_a_rerun_over_changed_data_gives_changed_records_rows_of_their_own(
    service_files: tuple[Path, Path], tmp_path: Path, ledger_url: str
) -> None:
    """Subject 1 replaced by subject 11 at the same label row, between a run and a rerun into
    the same folder (shard 0 scored again, as after a run stopped before its files): subject 11
    gets a row of its own, never subject 1's, and the unchanged records keep theirs."""
    meds, config, job, settings, out = first_meds_run(service_files, tmp_path, ledger_url)
    first = {r["subject_id"]: r["prediction_id"] for r in records(out)}

    write_meds_dataset(meds, subjects=(11, 2, 3, 4), hours=8)  # same paths, new data
    (out / "train" / "0.parquet").unlink()
    (out / "train" / "0.records.pq").unlink()
    run_local(config, job, out, InstantEngine.factory(), settings)
    again = records(out)
    assert [r["subject_id"] for r in again] == [11, 2, 3, 4]
    ledger = Ledger.open(ledger_url)
    try:
        rows = {row.prediction_id: row for row in ledger.rows()}
    finally:
        ledger.close()
    for record in again:  # each id names a row about the records file's subject
        assert rows[record["prediction_id"]].subject_id == str(record["subject_id"])
    now = {r["subject_id"]: r["prediction_id"] for r in again}
    assert now[11] not in first.values()
    assert {s: now[s] for s in (2, 3, 4)} == {s: first[s] for s in (2, 3, 4)}
    assert sorted(row.subject_id for row in rows.values()) == ["1", "11", "2", "3", "4"]


def test_a_record_twice_in_a_run_is_one_prediction(
    service_files: tuple[Path, Path], tmp_path: Path
) -> None:
    meds = write_meds_dataset(tmp_path / "meds", subjects=(1, 2), hours=8)
    labels = pq.read_table(meds / "labels" / "icu_mortality.parquet")
    repeated = tmp_path / "labels.parquet"
    pq.write_table(pa.concat_tables([labels, labels.slice(0, 1)]), repeated)  # subject 1 again
    config = engine_test_config(service_files, meds, max_new_tokens=8)
    job = Job(meds, TASK, labels=repeated, sampling=Sampling(max_new_tokens=8), concurrency=2)
    url = f"sqlite:///{tmp_path / 'ledger.sqlite3'}"
    run_local(
        config, job, tmp_path / "out", InstantEngine.factory(), LedgerSettings(url, "digest", SEED)
    )
    scored = records(tmp_path / "out")
    assert [r["subject_id"] for r in scored] == [1, 2, 1]
    assert scored[0]["prediction_id"] == scored[2]["prediction_id"] != scored[1]["prediction_id"]
    ledger = Ledger.open(url)
    try:
        rows = list(ledger.rows())
    finally:
        ledger.close()
    assert sorted((row.prediction_id, row.subject_id) for row in rows) == sorted(
        {(r["prediction_id"], str(r["subject_id"])) for r in scored}
    )


def test_a_fhir_run_records_each_patient_by_its_fhir_id(
    service_files: tuple[Path, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    bundles = fixture_bundles()
    export = fixture_export(tmp_path / "export", bundles)
    url = f"sqlite:///{tmp_path / 'ledger.sqlite3'}"
    monkeypatch.setenv("MEDTPE_LEDGER_URL", url)
    monkeypatch.setenv("MEDTPE_LEDGER_SIGNING_KEY", SEED)
    job = Job(tmp_path, TASK, times=(None,), sampling=Sampling(max_new_tokens=8), concurrency=1)
    out = tmp_path / "out"
    config = instant_settings(service_files).model()
    run_fhir(config, job, FhirInput((export,)), out, engine_factory=InstantEngine.factory())
    scored = records(out)
    assert len(scored) == len(bundles)
    rows = checked_rows(url, scored, "batch_fhir")
    patients = {
        e["resource"]["id"]
        for b in bundles
        for e in b["entry"]
        if e["resource"]["resourceType"] == "Patient"
    }
    assert {row.subject_id for row in rows.values()} == patients


def test_a_ledger_that_cannot_be_opened_stops_the_job_before_it_scores(
    service_files: tuple[Path, Path], tmp_path: Path
) -> None:
    meds = write_meds_dataset(tmp_path / "meds", subjects=(1, 2), hours=8)
    config = engine_test_config(service_files, meds, max_new_tokens=8)
    job = Job(meds, TASK, times=(None,), sampling=Sampling(max_new_tokens=8))
    down = LedgerSettings(f"postgresql://medtpe@127.0.0.1:{free_port()}/ledger", "digest", SEED)
    out = tmp_path / "out"
    with pytest.raises(LedgerUnavailable):
        run_local(config, job, out, InstantEngine.factory(), down)
    assert not list(out.rglob("*.parquet")) and not list(out.rglob("*.pq"))
