"""The ledger at the service's doors, on the instant engine in-process: every answer of
`/predict` and `/predict/batch` is one committed row carrying the response's prediction id,
answer and p("yes") under a valid signature; a ledger that cannot be written or opened is a 503
`ledger_unavailable` with `Retry-After` and no answer; `MEDTPE_LEDGER_OFF` only on loopback;
a row the service wrote re-derives through `medtpe verify`'s path."""

from __future__ import annotations

import hashlib
import json
import logging
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from click.testing import CliRunner
from fastapi.testclient import TestClient
from pydantic import ValidationError
from sqlalchemy import select

from medtpe.cli.ledger_commands import RecordSource
from medtpe.cli.main import cli
from medtpe.core.cds.services import get_service
from medtpe.inference.engines.instant import InstantEngine
from medtpe.ledger.receipt import Receipt
from medtpe.ledger.schema import Feedback
from medtpe.ledger.signing import public_key_from_jwk
from medtpe.ledger.store import Ledger, PredictionRow
from medtpe.ledger.verification import check_row
from medtpe.service.app import create_app
from medtpe.service.settings import ServiceSettings
from tests.support.cds_support import ICU_PATIENT, hook_request, load_bundle, prefetch_of
from tests.support.ehr import Ehr
from tests.support.ledger_rows import RFC8037_SEED_B64 as SEED
from tests.support.postgres import PostgresServer
from tests.support.rederived import rederived_checks, service_model_files
from tests.support.server_fixtures import fresh_database
from tests.support.service_support import (
    SERVICE_API_KEY,
    free_port,
    instant_client,
    instant_settings,
    post,
    record,
)

ICU = get_service("medtpe-icu-mortality-patient-view")
BASE = "http://testserver"


def recorded_row(client: TestClient, url: str, body: dict) -> PredictionRow:
    """The ledger row of one answer body, checked against the body and its signature."""
    ledger = Ledger.open(url)
    try:
        row = ledger.get(body["prediction_id"])
    finally:
        ledger.close()
    assert row is not None, body["prediction_id"]
    key = public_key_from_jwk(client.get("/ledger/public-key").json())
    receipt, checks = check_row(row, key)
    assert receipt is not None and all(check.ok for check in checks), checks
    assert body["receipt"]["receipt"] == json.loads(row.receipt)
    assert body["receipt"]["signature"] == row.signature
    assert json.loads(row.answer) == body["prediction"]
    assert row.p_yes == (body["probabilities"] or {}).get("yes")
    assert row.original_tokens == body["tokens"]["original"]
    assert row.medtpe_tokens == body["tokens"]["medtpe"]
    return row


def test_every_answer_of_predict_and_batch_is_one_signed_row(
    service_files: tuple[Path, Path], ledger_url: str
) -> None:
    settings = instant_settings(service_files, ledger_url=ledger_url, ledger_signing_key=SEED)
    with instant_client(settings) as client:
        single = post(client, "/predict", record(7, options={"return_probabilities": True}))
        assert single.status_code == 200, single.text
        batch = post(client, "/predict/batch", {"records": [record(8), record(9, 40)]})
        assert batch.status_code == 200, batch.text
        ready = client.get("/readyz").json()["ledger"]
    assert ready["status"] == "open" and ready["records"] == "digest"
    bodies = [single.json(), *batch.json()["results"]]
    rows = [recorded_row(client, ledger_url, body) for body in bodies]
    assert len({row.prediction_id for row in rows}) == 3 and rows[0].p_yes is not None
    assert [row.door for row in rows] == ["predict", "predict_batch", "predict_batch"]
    assert [row.subject_id for row in rows] == ["7", "8", "9"]
    key_id = hashlib.sha256(SERVICE_API_KEY.encode()).hexdigest()[:16]
    assert {row.caller for row in rows} == {f"key:{key_id}"}
    assert all(row.record is None for row in rows)
    ledger = Ledger.open(ledger_url)
    assert len(list(ledger.rows())) == 3  # nothing else, nothing twice
    ledger.close()


def test_a_row_the_service_wrote_re_derives_and_keeps_its_record_when_told(
    service_files: tuple[Path, Path], tmp_path: Path
) -> None:
    url = f"sqlite:///{tmp_path / 'ledger.sqlite3'}"
    settings = instant_settings(service_files, ledger_url=url, ledger_records="store")
    with instant_client(settings) as client:
        answer = post(client, "/predict", record(11))
        assert answer.status_code == 200, answer.text
        row = recorded_row(client, url, answer.json())
    assert row.record is not None
    receipt = Receipt.from_text(row.receipt)
    assert (settings.dtype, receipt.dtype) == ("auto", "float32")  # what the engine ran in
    checks = rederived_checks(row, RecordSource(), service_model_files(service_files))
    assert all(check.ok for check in checks.values()), checks
    assert checks["prompt"].detail == "same prompt"
    assert checks["dtype"].detail == "same dtype (float32)"


def test_a_receipt_names_the_dtype_set_for_the_engine(
    service_files: tuple[Path, Path], tmp_path: Path
) -> None:
    url = f"sqlite:///{tmp_path / 'ledger.sqlite3'}"
    with instant_client(instant_settings(service_files, ledger_url=url, dtype="bfloat16")) as c:
        answer = post(c, "/predict", record(12))
    assert answer.status_code == 200, answer.text
    assert answer.json()["receipt"]["receipt"]["dtype"] == "bfloat16"


def test_no_answer_leaves_while_postgresql_is_down(
    service_files: tuple[Path, Path], postgres_server: PostgresServer
) -> None:
    url = fresh_database(postgres_server)
    settings = instant_settings(service_files, ledger_url=url, ledger_signing_key=SEED)
    with instant_client(settings) as client:
        assert post(client, "/predict", record(3)).status_code == 200
        postgres_server.stop()
        try:
            for path, body in (
                ("/predict", record(4)),
                ("/predict/batch", {"records": [record(5)]}),
            ):
                refused = post(client, path, body)
                assert refused.status_code == 503, refused.text
                assert refused.headers["Retry-After"] == "5"
                assert refused.json()["error"] == "ledger_unavailable"
                assert "prediction" not in refused.text and "results" not in refused.json()
        finally:
            postgres_server.start()
        again = post(client, "/predict", record(4))
        assert again.status_code == 200, again.text
    ledger = Ledger.open(url)
    assert [row.subject_id for row in ledger.rows()] == ["3", "4"]
    ledger.close()


def test_a_ledger_that_cannot_be_opened_keeps_the_service_unready(
    service_files: tuple[Path, Path],
) -> None:
    url = f"postgresql://medtpe:secret-pw@127.0.0.1:{free_port()}/ledger"
    settings = instant_settings(service_files, ledger_url=url, ledger_signing_key=SEED)
    app = create_app(settings, InstantEngine.factory())
    with TestClient(app) as client:
        deadline = time.monotonic() + 120
        while (ready := client.get("/readyz").json())["status"] == "starting":
            assert time.monotonic() < deadline
            time.sleep(0.05)
        assert ready["status"] == "ledger_unavailable"
        assert ready["ledger"]["status"] == "unavailable"
        assert "secret-pw" not in json.dumps(ready) and "127.0.0.1" in ready["ledger"]["url"]
        refused = post(client, "/predict", record(1))
        assert refused.status_code == 503 and refused.json()["error"] == "ledger_unavailable"
        assert refused.headers["Retry-After"] == "5"


def test_readiness_opens_the_ledger_once_it_can_be(
    service_files: tuple[Path, Path], tmp_path: Path
) -> None:
    blocker = tmp_path / "ledger-dir"
    blocker.write_text("a file where the ledger's folder should be")
    url = f"sqlite:///{blocker / 'ledger.sqlite3'}"
    app = create_app(instant_settings(service_files, ledger_url=url), InstantEngine.factory())
    with TestClient(app) as client:
        deadline = time.monotonic() + 120
        while client.get("/readyz").json()["status"] != "ledger_unavailable":
            assert time.monotonic() < deadline
            time.sleep(0.05)
        blocker.unlink()  # the ledger can be opened now: readiness tries again by itself
        while (ready := client.get("/readyz")).status_code != 200:
            assert time.monotonic() < deadline, ready.json()
            time.sleep(0.2)
        assert ready.json()["ledger"]["status"] == "open"
        assert post(client, "/predict", record(5)).status_code == 200


def test_the_ledger_is_off_only_on_loopback(service_files: tuple[Path, Path]) -> None:
    with pytest.raises(ValidationError, match="MEDTPE_LEDGER_OFF"):
        instant_settings(service_files, ledger_off=True, host="0.0.0.0")
    settings = instant_settings(service_files, ledger_off=True)
    with instant_client(settings) as client:
        answer = post(client, "/predict", record(2))
        assert client.get("/ledger/public-key").status_code == 404
        assert client.get("/readyz").json()["ledger"] == {"status": "off"}
    assert answer.status_code == 200
    assert answer.json()["prediction_id"] is None and answer.json()["receipt"] is None


def test_the_signing_key_is_a_secret(service_files: tuple[Path, Path]) -> None:
    settings: ServiceSettings = instant_settings(service_files, ledger_signing_key=SEED)
    assert SEED in settings.secrets() and SEED not in repr(settings)
    with pytest.raises(ValidationError, match="MEDTPE_LEDGER_SIGNING_KEY"):
        instant_settings(
            service_files, ledger_url="postgresql://db/ledger", ledger_signing_key=None
        )


@pytest.fixture
def cds_client(
    service_files: tuple[Path, Path], ehr: Ehr, postgres_server: PostgresServer
) -> Iterator[tuple[TestClient, str]]:
    """The app with the test EHR allowed, on a fresh PostgreSQL ledger."""
    url = fresh_database(postgres_server)
    settings = instant_settings(
        service_files,
        ledger_url=url,
        ledger_signing_key=SEED,
        cds_issuers=json.loads(ehr.issuers_setting(["http://127.0.0.1:9"])),
        cds_base_url=BASE,
    )
    with instant_client(settings) as client:
        yield client, url


def hook_call(client: TestClient, ehr: Ehr, path: str, body: dict) -> httpx.Response:
    return client.post(path, json=body, headers=ehr.authorization(BASE + path))


def test_every_card_shown_is_a_row_and_its_feedback_is_kept(
    cds_client: tuple[TestClient, str], ehr: Ehr, postgres_server: PostgresServer
) -> None:
    client, url = cds_client
    path, feedback = f"/cds-services/{ICU.id}", f"/cds-services/{ICU.id}/feedback"
    body = hook_request(ICU, ICU_PATIENT, prefetch=prefetch_of(ICU, load_bundle(), ICU_PATIENT))
    cards = [hook_call(client, ehr, path, body).json()["cards"][0] for _ in range(2)]
    assert "an earlier call's score" in cards[1]["detail"]  # the second card: from the cache
    assert cards[0]["source"]["url"] == f"{BASE}/model-card.xml"
    ledger = Ledger.open(url)
    rows = [ledger.get(card["extension"]["prediction_id"]) for card in cards]
    assert all(row is not None for row in rows) and rows[0] != rows[1]
    first, again = (Receipt.from_text(row.receipt) for row in rows)  # the cached card's row
    assert (first.record_sha256, first.prompt_ids_sha256) == (
        again.record_sha256,
        again.prompt_ids_sha256,
    )
    for card, row in zip(cards, rows, strict=True):
        assert card["uuid"] == row.prediction_id and row.door == "cds_hook"
        assert row.site == ICU.id and row.subject_id == ICU_PATIENT
        assert row.caller.startswith(ehr.issuer) and card["extension"]["receipt"]["signature"]
    overridden = {
        "card": cards[1]["uuid"],
        "outcome": "overridden",
        "overrideReason": {"reason": cards[1]["overrideReasons"][2], "userComment": "no"},
        "outcomeTimestamp": "2026-11-25T10:06:00Z",
    }
    assert hook_call(client, ehr, feedback, {"feedback": [overridden]}).status_code == 200
    with ledger.engine.connect() as connection:
        kept = connection.execute(select(Feedback)).mappings().all()
    assert [(k["prediction_id"], k["outcome"], k["override_reason"]) for k in kept] == [
        (rows[1].prediction_id, "overridden", "disagree")
    ]
    ledger.close()
    postgres_server.stop()
    try:  # the ledger down: no card, and feedback the EHR must send again
        refused = hook_call(client, ehr, path, body)
        assert refused.status_code == 503 and refused.json()["error"] == "ledger_unavailable"
        assert "cards" not in refused.json() and refused.headers["Retry-After"] == "5"
        again_feedback = hook_call(client, ehr, feedback, {"feedback": [overridden]})
        assert again_feedback.status_code == 503
    finally:
        postgres_server.start()
    ledger = Ledger.open(url)
    assert len(list(ledger.rows())) == 2
    ledger.close()


def test_every_command_masks_the_ledger_secrets_in_its_log(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    url = "postgresql://medtpe:pw-for-the-ledger@127.0.0.1:1/ledger"
    monkeypatch.setenv("MEDTPE_LEDGER_URL", url)
    monkeypatch.setenv("MEDTPE_LEDGER_SIGNING_KEY", SEED)
    shown = CliRunner().invoke(cli, ["ledger", "public-key"])
    assert shown.exit_code == 0 and SEED not in shown.output
    logging.getLogger("medtpe.test").error("signing with %s on %s", SEED, url)
    assert "signing with" in caplog.text
    assert SEED not in caplog.text and "pw-for-the-ledger" not in caplog.text
