"""`medtpe predict --fhir-server URL --write-back` end to end on the instant engine: the records
exported from a FHIR server of the tests' own (Bulk Data and transactions over real HTTP,
SMART Backend Services: tests/support/transaction_server.py), scored, recorded in the ledger,
then written back to the same server: one RiskAssessment and one Provenance per answer, each
RiskAssessment identified by its ledger row's prediction id, every resource valid R4B, and a
rerun creates nothing."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner
from cryptography.hazmat.primitives.asymmetric import ec
from fhir.resources.R4B import get_fhir_model_class

from medtpe.batch import fhir_job
from medtpe.batch.smart_backend import ClientKey, public_jwks
from medtpe.batch.write_back import WRITE_BACK_SCOPE
from medtpe.cli.predict_commands import predict
from medtpe.core.fhir.from_meds import fhir_bundle_from_meds
from medtpe.core.meds import MedsDataset
from medtpe.fhir_resources.bundles import PREDICTION_ID_SYSTEM, provenance_id
from medtpe.inference.engines.instant import InstantEngine
from medtpe.ledger.store import Ledger
from tests.support.bulk_server import pem, resources_by_type
from tests.support.mimic_fhir_fixture import FIXTURE
from tests.support.service_support import TEST_SIGNING_KEY
from tests.support.transaction_server import TransactionServer, serving_transactions

CLIENT = "medtpe-night-job"


@pytest.fixture
def server() -> Iterator[tuple[TransactionServer, ClientKey]]:
    """The EHR: the fixture's patients for Bulk export, transactions accepted, one client."""
    key = ClientKey.from_pem(pem(ec.generate_private_key(ec.SECP384R1())))
    dataset = MedsDataset.load(FIXTURE)
    bundles = [fhir_bundle_from_meds(dataset.events(s)) for s in dataset.subject_ids]
    ehr = TransactionServer(resources_by_type(bundles), clients={CLIENT: public_jwks(key)})
    with serving_transactions(ehr) as served:
        yield served, key


def test_the_night_job_writes_each_answer_back_once(
    server: tuple[TransactionServer, ClientKey],
    service_files: tuple[Path, Path],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    ehr, key = server
    artefact, export = service_files
    key_file = tmp_path / "client.pem"
    key_file.write_bytes(pem(key.key))
    ledger_url = f"sqlite:///{tmp_path / 'ledger.sqlite3'}"
    monkeypatch.setenv("MEDTPE_LEDGER_URL", ledger_url)
    monkeypatch.setenv("MEDTPE_LEDGER_SIGNING_KEY", TEST_SIGNING_KEY)
    monkeypatch.setitem(fhir_job.run_fhir.__kwdefaults__, "engine_factory", InstantEngine.factory())
    arguments = [
        *("--fhir-server", ehr.base, "--client-id", CLIENT, "--client-key", str(key_file)),
        *("--write-back", "--model-card-url", "https://cds.example.org/model-card.xml"),
        *("--task", "icu_mortality", "--times", "last", "--out", str(tmp_path / "out")),
        *("--artefact", str(artefact), "--export-dir", str(export)),
        *("--max-input-tokens", "1024", "--max-new-tokens", "8"),
    ]
    first = CliRunner().invoke(predict, arguments)
    assert first.exit_code == 0, first.output

    ledger = Ledger.open(ledger_url)
    try:
        rows = list(ledger.rows())
    finally:
        ledger.close()
    n = len(rows)
    assert n == len(MedsDataset.load(FIXTURE).subject_ids)
    risks = ehr.of_type("RiskAssessment")
    provenances = ehr.of_type("Provenance")
    assert len(risks) == len(provenances) == n
    # each RiskAssessment is a ledger row's answer, about that row's patient
    by_id = {row.prediction_id: row for row in rows}
    for risk in risks:
        (identifier,) = risk["identifier"]
        assert identifier["system"] == PREDICTION_ID_SYSTEM
        row = by_id.pop(identifier["value"])
        assert risk["subject"] == {"reference": f"Patient/{row.subject_id}"}
        probability = risk["prediction"][0].get("probabilityDecimal")
        assert probability == (None if row.p_yes is None else round(row.p_yes, 6))
    assert by_id == {}
    assert {p["id"] for p in provenances} == {provenance_id(r.prediction_id) for r in rows}
    # every resource stored is valid R4B (the server validated each transaction as well)
    (device,) = ehr.of_type("Device")
    (card,) = ehr.of_type("DocumentReference")
    for resource in [*risks, *provenances, device, card]:
        get_fhir_model_class(resource["resourceType"]).model_validate(resource)
    assert card["content"][0]["attachment"]["url"] == "https://cds.example.org/model-card.xml"
    assert f"{n} RiskAssessments and {n} Provenances created" in first.output
    # the writes went with a token of the write scopes, to the configured server only
    posts = [r for r in ehr.requests if r["method"] == "POST" and r["path"] == "/fhir"]
    assert posts and all(r["token"] for r in posts)
    tokens = {r["headers"]["Authorization"].removeprefix("Bearer ") for r in posts}
    assert {ehr.scopes[t] for t in tokens} == {WRITE_BACK_SCOPE}

    again = CliRunner().invoke(predict, arguments)
    assert again.exit_code == 0, again.output
    assert f"0 RiskAssessments and 0 Provenances created, {n} RiskAssessments" in again.output
    assert len(ehr.of_type("RiskAssessment")) == len(ehr.of_type("Provenance")) == n
    # a server that refuses the writes fails the command with its reason, the outputs kept
    ehr.redirect_to = "http://127.0.0.1:9/fhir"
    refused = CliRunner().invoke(predict, arguments)
    assert refused.exit_code == 1
    assert "write-back: the FHIR server answered the transaction with a redirect" in refused.output
    assert (tmp_path / "out" / "summary.json").is_file()


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        (
            ["--fhir", "EXPORT", "--write-back"],
            "--write-back writes to the server of --fhir-server",
        ),
        (["--fhir", "EXPORT", "--model-card-url", "https://x"], "--model-card-url names the card"),
        (
            ["--fhir-server", "https://ehr.test.invalid/fhir", "--write-back", "LEDGER_OFF"],
            "--write-back writes the answers the ledger holds: not with MEDTPE_LEDGER_OFF=true",
        ),
    ],
)
def test_write_back_needs_the_fhir_server_and_the_ledger(
    tmp_path: Path, arguments: list[str], message: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    export = tmp_path / "export"
    export.mkdir()
    if "LEDGER_OFF" in arguments:
        monkeypatch.setenv("MEDTPE_LEDGER_OFF", "true")
    arguments = [str(export) if a == "EXPORT" else a for a in arguments if a != "LEDGER_OFF"]
    result = CliRunner().invoke(
        predict, [*arguments, "--task", "icu_mortality", "--times", "last", "--out", str(tmp_path)]
    )
    assert result.exit_code == 2 and message in result.output
