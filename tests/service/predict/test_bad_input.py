"""Input that once passed silently or answered 500, through the HTTP layer (in-process app on an
engine that answers at once): a time in the year 0 and several subjects are 422s naming the
field; an input budget below the prompt's fixed part fails the start naming the setting, and at
that minimum every request is answered; a last event in the calendar's last minute is answered;
`medtpe serve` listening beyond loopback without API keys, or with CDS issuers but no public base
URL, stops naming the setting."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from starlette.testclient import TestClient

from medtpe.core.paths import default_model_dir
from medtpe.core.prompt import ChatTemplate
from medtpe.core.prompt.task_prompt import min_input_tokens
from medtpe.core.tokenizer import BaseTokenizer
from tests.support.service_support import (
    SERVICE_API_KEY,
    free_port,
    instant_client,
    instant_settings,
    service_env,
    synthetic_events,
)

pytestmark = [pytest.mark.timeout(600)]
AUTH = {"Authorization": f"Bearer {SERVICE_API_KEY}"}


def post(client: TestClient, path: str, body: dict) -> dict:
    response = client.post(path, json=body, headers=AUTH)
    return {"status": response.status_code, **response.json()}


def year_zero_record() -> dict:
    events = synthetic_events(4, 3)
    events.append({"subject_id": 4, "time": "0000-01-01T00:00:00", "code": "X"})
    return {"task": "icu_mortality", "events": events}


def two_subject_record() -> dict:
    events = [*synthetic_events(4, 3), {"subject_id": 5, "time": None, "code": "X"}]
    return {"task": "icu_mortality", "events": events}


@pytest.mark.parametrize(
    ("record", "field", "type_"),
    [
        (year_zero_record, ["events", 6, "time"], "datetime_parsing"),
        (two_subject_record, ["events", 6, "subject_id"], "several_subjects"),
    ],
    ids=["year-0", "two-subjects"],
)
def test_bad_events_are_422_at_their_field(instant_api: TestClient, record, field, type_) -> None:
    for path, body, loc in [
        ("/predict", record(), ["body", *field]),
        ("/tokenize", record(), ["body", *field]),
        ("/predict/batch", {"records": [record(), record()]}, None),
    ]:
        out = post(instant_api, path, body)
        assert out["status"] == 422, (path, out)
        assert out["error"] == "invalid_request"
        locs = [(item["loc"], item["type"]) for item in out["detail"]]
        if loc is None:  # each record of the batch is located
            loc = ["body", "records", 0, *field]
            assert (["body", "records", 1, *field], type_) in locs
        assert (loc, type_) in locs, (path, locs)


@pytest.fixture(scope="module")
def minimum() -> int:
    model_dir = default_model_dir()
    return min_input_tokens(BaseTokenizer.load(model_dir), ChatTemplate.from_model_dir(model_dir))


def test_a_budget_below_the_prompt_fails_the_start(
    service_files: tuple[Path, Path], minimum: int
) -> None:
    settings = instant_settings(service_files, max_input_tokens=minimum - 1)
    with pytest.raises(RuntimeError) as failed, instant_client(settings):
        pass
    readiness = str(failed.value)
    assert "'status': 'failed'" in readiness
    assert f"MEDTPE_MAX_INPUT_TOKENS={minimum - 1} is below the {minimum} tokens" in readiness
    assert f"at least {minimum}" in readiness


@pytest.mark.slow
def test_the_api_processes_supervisor_stops_on_a_budget_below_the_prompt(
    service_files: tuple[Path, Path], minimum: int
) -> None:
    """With several API processes the check runs before the shared engine starts."""
    env = service_env(
        service_files,
        MEDTPE_API_WORKERS="2",
        MEDTPE_MAX_INPUT_TOKENS=str(minimum - 1),
        MEDTPE_PORT=str(free_port()),
    )
    medtpe = Path(sys.executable).with_name("medtpe")
    out = subprocess.run(
        [str(medtpe), "serve", "--host", "127.0.0.1"],
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode != 0
    assert f"MEDTPE_MAX_INPUT_TOKENS={minimum - 1} is below the {minimum} tokens" in out.stderr
    assert "EngineCore" not in out.stderr


def test_every_request_is_answered_at_the_minimum_budget(
    service_files: tuple[Path, Path], minimum: int
) -> None:
    settings = instant_settings(service_files, max_input_tokens=minimum)
    with instant_client(settings) as client:
        for task in ("phenotyping", "icu_mortality"):
            record = {"task": task, "events": synthetic_events(9, 2000)}
            predicted = post(client, "/predict", record)
            assert predicted["status"] == 200, predicted
            assert predicted["tokens"]["original"] <= minimum
            assert post(client, "/tokenize", record)["status"] == 200


def test_a_last_event_in_the_calendars_last_minute_is_answered(instant_api: TestClient) -> None:
    """The default prediction time (a minute after the last event) would overflow the calendar:
    it is the last event's own time instead, so every event is shown (200, not 500)."""
    events = [*synthetic_events(4, 3), {"subject_id": 4, "time": "9999-12-31T23:59", "code": "X"}]
    record = {"task": "icu_mortality", "events": events}
    predicted = post(instant_api, "/predict", record)
    assert predicted["status"] == 200, predicted
    assert predicted["prediction_time"] == "9999-12-31T23:59:00Z"
    assert predicted["events"] == {"total": len(events), "kept": len(events)}
    assert post(instant_api, "/tokenize", record)["status"] == 200


@pytest.mark.slow
@pytest.mark.parametrize(
    ("args", "env", "named"),
    [
        (["--host", "0.0.0.0"], {}, "MEDTPE_API_KEYS"),
        (
            [],
            {
                "MEDTPE_API_KEYS": "secret-key-1",
                "MEDTPE_CDS_ISSUERS": '{"https://ehr.test.invalid": {"jwks_url": '
                '"https://ehr.test.invalid/jwks", "fhir_servers": "*"}}',
            },
            "MEDTPE_CDS_BASE_URL",
        ),
    ],
    ids=["listening-beyond-loopback-without-keys", "issuers-without-base-url"],
)
def test_medtpe_serve_refuses_an_unsafe_start_naming_the_setting(
    args: list[str], env: dict[str, str], named: str
) -> None:
    """Before any model file is read: the setting named, no traceback, no key printed."""
    clean = {n: v for n, v in os.environ.items() if not n.upper().startswith("MEDTPE_")}
    medtpe = Path(sys.executable).with_name("medtpe")
    out = subprocess.run(
        [str(medtpe), "serve", *args],
        env=clean | env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 1
    assert "Error: invalid settings" in out.stderr and named in out.stderr
    assert "Traceback" not in out.stderr
    assert "secret-key-1" not in out.stdout + out.stderr
