"""Silent mode, thresholds per site and the live fidelity shadow, on the instant engine in-process
with a SQLite ledger: a silent CDS service answers no card and records its row as silent; a
site's operating threshold sets its cards' indicator; a shadow answers the original tokenizer's
ids (evicted tokens decomposed) on the same engine after the response, as a row linked to the
answer, without delaying it, and is dropped (counted) when live records hold every slot."""

from __future__ import annotations

import json
import re
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from pydantic import ValidationError

from medtpe.cli.ledger_commands import RecordSource
from medtpe.core.cds.risk import DEFAULT_TASK_BANDS
from medtpe.core.cds.services import get_service
from medtpe.inference.engines.instant import InstantEngine
from medtpe.inference.engines.protocol import Completion, EngineConfig, GenerationParams
from medtpe.ledger.store import Ledger, PredictionRow
from medtpe.service.settings import ServiceSettings
from tests.support.cds_support import ICU_PATIENT, hook_request, load_bundle, prefetch_of
from tests.support.ehr import Ehr
from tests.support.ledger_rows import RFC8037_SEED_B64 as SEED
from tests.support.rederived import rederived_checks, service_model_files
from tests.support.service_support import AUTH, instant_client, instant_settings, post, record

ICU = get_service("medtpe-icu-mortality-patient-view")
ICU_START = get_service("medtpe-icu-mortality-encounter-start")
BASE = "http://testserver"
HOLD_S = 60.0


def sqlite_settings(
    service_files: tuple[Path, Path], tmp_path: Path, **extra: Any
) -> tuple[ServiceSettings, str]:
    """Instant-engine settings on a new SQLite ledger, and its URL."""
    url = f"sqlite:///{tmp_path / 'ledger.sqlite3'}"
    return instant_settings(service_files, ledger_url=url, ledger_signing_key=SEED, **extra), url


def ledger_rows(url: str) -> list[PredictionRow]:
    ledger = Ledger.open(url)
    try:
        return list(ledger.rows())
    finally:
        ledger.close()


def wait_for_rows(url: str, n: int) -> list[PredictionRow]:
    """The ledger's rows once it holds `n` (shadows are written after their answers), at most
    30 s."""
    deadline = time.monotonic() + 30
    while len(rows := ledger_rows(url)) < n and time.monotonic() < deadline:
        time.sleep(0.05)
    return rows


def metric(client: TestClient, name: str, **labels: str) -> float:
    """The value of one series of `/metrics` (0 when absent)."""
    text = client.get("/metrics", headers=AUTH).text
    wanted = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
    for line in text.splitlines():
        match = re.fullmatch(rf"{re.escape(name)}(?:\{{(.*)\}})? (\S+)", line)
        if match and ",".join(sorted((match.group(1) or "").split(","))) == wanted:
            return float(match.group(2))
    return 0.0


def test_a_silent_service_records_without_a_card_and_a_site_threshold_sets_the_indicator(
    service_files: tuple[Path, Path], ehr: Ehr, tmp_path: Path
) -> None:
    thresholds = tmp_path / "thresholds.yaml"
    thresholds.write_text(f"tasks:\n  icu_mortality:\n    sites: {{{ICU.id}: 0.9}}\n")
    settings, url = sqlite_settings(
        service_files,
        tmp_path,
        cds_silent=ICU_START.id,
        thresholds_file=thresholds,
        shadow_rate=1.0,
        cds_base_url=BASE,
        cds_issuers=json.loads(ehr.issuers_setting(["http://127.0.0.1:9"])),
    )
    bundle = load_bundle()
    with instant_client(settings) as client:
        calls = {}
        for service in (ICU, ICU_START):
            path = f"/cds-services/{service.id}"
            body = hook_request(
                service, ICU_PATIENT, prefetch=prefetch_of(service, bundle, ICU_PATIENT)
            )
            calls[service.id] = client.post(path, json=body, headers=ehr.authorization(BASE + path))
        wait_for_rows(url, 3)
        silent_calls = metric(
            client, "medtpe_cds_hook_calls_total", service=ICU_START.id, outcome="silent"
        )
    assert calls[ICU_START.id].status_code == 200 and calls[ICU_START.id].json() == {"cards": []}
    assert silent_calls == 1
    recorded = ledger_rows(url)
    rows = {row.site: row for row in recorded if row.shadow_of is None}
    assert rows[ICU_START.id].silent and not rows[ICU.id].silent
    # the first call's score was computed, and shadowed on the hook's door and site; the silent
    # call's came from the score cache (the same record): not answered again
    (shadow,) = (row for row in recorded if row.shadow_of is not None)
    assert shadow.shadow_of == rows[ICU.id].prediction_id
    assert (shadow.door, shadow.site, shadow.silent) == ("cds_hook", ICU.id, True)
    # the instant engine's p(yes) 0.75 is critical in the task's default bands; at the patient
    # view's site threshold 0.9 it is not flagged: an informational card
    card = calls[ICU.id].json()["cards"][0]
    p = rows[ICU.id].p_yes
    assert (
        p == pytest.approx(0.75)
        and DEFAULT_TASK_BANDS["icu_mortality"].band(p).indicator == "critical"
    )
    assert card["indicator"] == "info" and card["uuid"] == rows[ICU.id].prediction_id


class HeldShadow(InstantEngine):
    """An instant engine holding every generation after the warm-up and the first answer (the
    shadow's) until `release()`."""

    async def generate(
        self, prompt_ids: Sequence[int], params: GenerationParams
    ) -> list[Completion]:
        if len(self.prompts) >= 2:
            await self._hold(HOLD_S)
        return await super().generate(prompt_ids, params)

    @classmethod
    def start(cls, config: EngineConfig) -> HeldShadow:
        return cls(config.model_dir, config.max_model_len or 8192)


def test_a_shadow_answers_the_original_ids_after_the_response_as_a_linked_row(
    service_files: tuple[Path, Path], tmp_path: Path
) -> None:
    settings, url = sqlite_settings(
        service_files, tmp_path, shadow_rate=1.0, ledger_records="store"
    )
    with instant_client(settings, engine_factory=HeldShadow.start) as client:
        state = client.app.state.service  # type: ignore[attr-defined]
        engine = state.engine
        start = time.perf_counter()
        answer = post(client, "/predict", record(7, options={"return_probabilities": True}))
        answered_s = time.perf_counter() - start
        assert answer.status_code == 200, answer.text
        assert answered_s < HOLD_S / 4  # the shadow, held, did not hold the answer
        assert [row.prediction_id for row in ledger_rows(url)] == [answer.json()["prediction_id"]]
        engine.release()
        rows = wait_for_rows(url, 2)
        agreements = metric(client, "medtpe_shadow_agreements_total", task="icu_mortality")
        answers = metric(client, "medtpe_shadow_answers_total", task="icu_mortality")
        dp_count = metric(client, "medtpe_shadow_abs_dp_count", task="icu_mortality")
    shown = next(row for row in rows if row.shadow_of is None)
    shadow = next(row for row in rows if row.shadow_of is not None)
    assert shadow.shadow_of == shown.prediction_id == answer.json()["prediction_id"]
    assert shadow.silent and not shown.silent and shadow.door == shown.door == "predict"
    assert (answers, agreements, dp_count) == (1, 1, 1)
    # the shadow's prompt: the answer's original ids with evicted tokens decomposed
    tokenizer = state.model.predictor.tokenizer
    answer_ids, shadow_ids = engine.prompts[1], engine.prompts[2]
    assert tokenizer.to_base_ids(shadow_ids) == tokenizer.to_base_ids(answer_ids)
    assert len(shadow_ids) > len(answer_ids) and shadow.medtpe_tokens == len(shadow_ids)
    assert not set(shadow_ids) & set(tokenizer.evicted)
    # `medtpe verify` re-derives the shadow's prompt (and answer) from its stored record
    checks = rederived_checks(shadow, RecordSource(), service_model_files(service_files))
    assert all(check.ok for check in checks.values()), checks
    assert checks["prompt"].detail == "same prompt"


def test_a_shadow_is_dropped_and_counted_when_live_records_hold_every_slot(
    service_files: tuple[Path, Path], tmp_path: Path
) -> None:
    settings, url = sqlite_settings(service_files, tmp_path, shadow_rate=1.0)
    with instant_client(settings) as client:
        admission = client.app.state.service.admission  # type: ignore[attr-defined]
        with admission.admit(admission.max_concurrency):  # live records in every slot
            answer = post(client, "/predict", record(7))
        assert answer.status_code == 200, answer.text
        time.sleep(0.5)  # a shadow, had it been queued, would be recorded by now
        dropped = metric(client, "medtpe_shadow_dropped_total", task="icu_mortality", reason="busy")
    assert dropped == 1
    assert [row.shadow_of for row in ledger_rows(url)] == [None]


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"cds_silent": "no-such-service/t1"}, "MEDTPE_CDS_SILENT: no CDS service"),
        ({"shadow_rate": 0.1, "mode": "original"}, "MEDTPE_SHADOW_RATE > 0 shadows MedTPE"),
        ({"shadow_rate": 1.5}, "shadow_rate\n  Input should be less than or equal to 1"),
        ({"thresholds_file": "-"}, "MEDTPE_THRESHOLDS_FILE: .*tasks.icu_mortality.default"),
    ],
)
def test_silent_shadow_and_threshold_settings_are_checked_at_start(
    service_files: tuple[Path, Path], tmp_path: Path, values: dict, message: str
) -> None:
    if "thresholds_file" in values:  # a file with a threshold outside (0, 1)
        values = {"thresholds_file": tmp_path / "thresholds.yaml"}
        values["thresholds_file"].write_text("tasks:\n  icu_mortality:\n    default: 1.5\n")
    with pytest.raises(ValidationError, match=message):
        sqlite_settings(service_files, tmp_path, **values)
