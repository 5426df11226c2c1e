"""Predictions written back to the EHR's FHIR server: one RiskAssessment and its Provenance per
prediction (`medtpe.fhir_resources.bundles`), POSTed as transaction Bundles of at most `max_entries`
entries to the server's base URL with the SMART Backend Services token
(`medtpe.batch.smart_backend`).

The HTTP rules are the Bulk Data client's (`medtpe.batch.fhir_http`): HTTPS (loopback: HTTP), the
token only to the FHIR server's origin (the base URL is the one URL posted to; a redirect is
refused, never followed), connect and read timeouts, `Retry-After` on 429 / 503, one new token
after a 401. The server's answers are not trusted either: each must arrive whole within
`MAX_ANSWER_S` seconds (headers and body: a server dripping it is left at the deadline), its body
under `MAX_RESPONSE_BYTES` bytes, its JSON no deeper than `medtpe.batch.ndjson_lines.MAX_JSON_DEPTH`
levels (checked on the bytes, before the parser); another answer is a `FhirServerError` naming the
server and the bound, and the server's own text in an error is shown without control characters,
cut to `medtpe.batch.fhir_http.MAX_SERVER_TEXT` characters.

The transaction-response's entry statuses count what the server created (`201`) and what it
already had (`200`: a rerun's RiskAssessments, found by their prediction id, and its Provenances,
updated in place): a rerun creates nothing.
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from itertools import islice
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx

from medtpe.batch.bulk_client import ServerAccess
from medtpe.batch.fhir_http import FhirServerError, HttpSettings, check_secure, fetch
from medtpe.batch.rows import RecordRow, read_records
from medtpe.batch.smart_backend import ClientKey, SmartBackendAuth
from medtpe.batch.task_outputs import records_path, task_dir
from medtpe.core.tasks import Task, get_task, list_tasks
from medtpe.core.tokenizer.artefact_manifest import ArtefactBundle
from medtpe.fhir_resources.bundles import (
    MAX_BUNDLE_ENTRIES,
    SHARED_ENTRIES,
    ModelRef,
    WrittenPrediction,
    transaction_bundle,
)
from medtpe.model_card.card import build_model_card
from medtpe.model_card.xml import model_card_xml

if TYPE_CHECKING:
    from medtpe.batch.fhir_job import FhirInput, FhirShardPlan
    from medtpe.batch.job import Job
    from medtpe.ledger.store import Ledger

log = logging.getLogger(__name__)

FHIR_JSON = "application/fhir+json"
WRITE_BACK_SCOPE = (
    "system/RiskAssessment.crs system/Provenance.cu system/Device.crs system/DocumentReference.crs"
)
"""The SMART scopes the write-back asks for: create (conditional: search) and update."""
MAX_RESPONSE_BYTES = 16 * 1024 * 1024
"""The largest transaction-response read (`Prefer: return=minimal` keeps it to statuses)."""
MAX_ANSWER_S = 300.0
"""The longest a transaction's answer may take, from the request to its last byte."""


class WriteBackError(FhirServerError):
    """The FHIR server refused a transaction or answered what the client cannot read."""


@dataclass
class WriteBackResult:
    """What a write-back did, by resource type."""

    bundles: int = 0
    predictions: int = 0
    created: Counter[str] = field(default_factory=Counter)
    existing: Counter[str] = field(default_factory=Counter)
    seconds: float = 0.0

    def as_dict(self) -> dict[str, Any]:
        """The result as JSON (the job's summary)."""
        return {
            "bundles": self.bundles,
            "predictions": self.predictions,
            "created": dict(sorted(self.created.items())),
            "existing": dict(sorted(self.existing.items())),
            "seconds": round(self.seconds, 3),
        }


@dataclass(frozen=True)
class FhirWriter:
    """Transactions to one FHIR server (see the module docstring)."""

    base: str
    """The FHIR server's base URL (HTTPS; loopback: HTTP), the one URL posted to."""
    client: httpx.Client = field(repr=False)
    auth: SmartBackendAuth | None = None
    settings: HttpSettings = field(default_factory=HttpSettings)
    answer_s: float = MAX_ANSWER_S
    """The longest one answer may take in all (`medtpe.batch.fhir_http.fetch`'s deadline)."""

    def __post_init__(self) -> None:
        check_secure(self.base, "the FHIR server")

    def post(self, bundle: dict[str, Any]) -> list[str]:
        """POST one transaction Bundle; the status of each of its entries, in order."""
        body = json.dumps(bundle, separators=(",", ":")).encode()
        for attempt in range(2):
            headers = {
                "Content-Type": FHIR_JSON,
                "Accept": FHIR_JSON,
                "Prefer": "return=minimal",
            }
            if self.auth is not None:
                headers["Authorization"] = f"Bearer {self.auth.token()}"
            request = httpx.Request("POST", self.base.rstrip("/"), headers=headers, content=body)
            reply = fetch(
                self.client,
                request,
                self.settings,
                "the transaction",
                MAX_RESPONSE_BYTES,
                deadline_s=self.answer_s,
            )
            if reply.status == 401 and self.auth is not None and attempt == 0:
                self.auth.refresh()
                continue
            break
        if 300 <= reply.status < 400:
            raise WriteBackError(
                f"the FHIR server answered the transaction with a redirect (HTTP {reply.status}): "
                "not followed, the token goes to the configured server only"
            )
        if reply.status != 200:
            raise WriteBackError(
                f"the FHIR server {self.base} refused the transaction: HTTP {reply.status}: "
                f"{reply.explanation()}"
            )
        return self._statuses(reply.json(), len(bundle["entry"]))

    def _statuses(self, response: Any, expected: int) -> list[str]:
        if not (
            isinstance(response, dict)
            and response.get("resourceType") == "Bundle"
            and response.get("type") == "transaction-response"
        ):
            raise WriteBackError("the FHIR server's answer is no transaction-response Bundle")
        entries = response.get("entry")
        if not isinstance(entries, list) or len(entries) != expected:
            raise WriteBackError(
                f"the transaction-response has {len(entries or [])} entries for {expected} sent"
            )
        statuses = []
        for index, entry in enumerate(entries):
            status = (
                ((entry or {}).get("response") or {}).get("status")
                if isinstance(entry, dict)
                else None
            )
            if not isinstance(status, str) or not status[:3].isdigit():
                raise WriteBackError(f"the transaction-response's entry[{index}] has no status")
            statuses.append(status[:3])
        return statuses


def _chunks(items: Iterable[WrittenPrediction], size: int) -> Iterator[list[WrittenPrediction]]:
    iterator = iter(items)
    while chunk := list(islice(iterator, size)):
        yield chunk


def write_predictions(
    writer: FhirWriter,
    items: Iterable[WrittenPrediction],
    model: ModelRef,
    max_entries: int = MAX_BUNDLE_ENTRIES,
) -> WriteBackResult:
    """Write `items` (read lazily, one Bundle's worth at a time) in transaction Bundles of at
    most `max_entries` entries; what the server created and already had."""
    if max_entries < SHARED_ENTRIES + 2:
        raise ValueError(f"a Bundle needs room for {SHARED_ENTRIES + 2} entries")
    result = WriteBackResult()
    start = time.perf_counter()
    for chunk in _chunks(items, (max_entries - SHARED_ENTRIES) // 2):
        bundle = transaction_bundle(chunk, model, max_entries)
        statuses = writer.post(bundle)
        _count(result, bundle["entry"], statuses)
        result.bundles += 1
        result.predictions += len(chunk)
    result.seconds = time.perf_counter() - start
    return result


def _count(result: WriteBackResult, entries: Sequence[dict[str, Any]], statuses: list[str]):
    for entry, status in zip(entries, statuses, strict=True):
        kind = entry["resource"]["resourceType"]
        if status == "201":
            result.created[kind] += 1
        elif status == "200":
            result.existing[kind] += 1
        else:
            raise WriteBackError(f"the server answered {status} for a {kind} of the transaction")


def fhir_job_predictions(
    out_dir: Path,
    plans: Sequence[FhirShardPlan],
    task: Task,
    recorded: Callable[[Sequence[str]], Mapping[str, tuple[datetime, str]]],
) -> Iterator[WrittenPrediction]:
    """The answered records of a FHIR job's shards written under `out_dir` (`medtpe.batch.fhir_job`:
    a records file per plan), shard by shard, each written for the patient its ledger row names:
    the records file's prediction id names the row (`recorded`: prediction ids -> when each row
    the ledger holds was recorded and its subject, `medtpe.ledger.store.Ledger.recorded`), whose
    subject must be the patient the job's plan gives the record. Records without an answer or a
    probability are left out; an answered record without a ledger row, or whose row is about
    another patient (a records file of other data), is a `ValueError`: nothing is written back
    that the ledger does not hold for that patient."""
    for plan in plans:
        path = records_path(out_dir, plan.name)
        if not path.is_file():
            continue
        patients = {r.record: p for r, p in zip(plan.requests, plan.patients, strict=True)}
        rows = [RecordRow.from_row(values) for values in read_records(path).to_pylist()]
        answered = [
            row
            for row in rows
            if (row.prediction is not None or row.p_yes is not None)
            and row.prediction_time is not None
            and row.record in patients
        ]
        found = recorded([row.prediction_id for row in answered if row.prediction_id])
        for row in answered:
            if row.prediction_id is None or row.prediction_id not in found:
                raise ValueError(f"record {row.record} has no ledger row: not written back")
            at, subject = found[row.prediction_id]
            if subject != patients[row.record]:
                raise ValueError(
                    f"record {row.record}: its ledger row {row.prediction_id} is about another "
                    "patient than the job's (a records file of other data): not written back"
                )
            assert row.prediction_time is not None  # answered
            yield WrittenPrediction(
                prediction_id=row.prediction_id,
                patient_id=subject,
                prediction_time=row.prediction_time,
                task=task,
                prediction=row.prediction,
                p_yes=row.p_yes,
                recorded=at,
            )


def job_model(artefact_dir: Path, run: Mapping[str, Any], card_url: str | None) -> ModelRef:
    """The model a batch run answered with (`run`: its summary's `this_run`) and its card, built
    from the artefact as the service builds its own (every task; the same model, budget and
    `card_url` give the served card, digest included), its CHAI XML attached."""
    identity = run["model"]
    card = build_model_card(
        ArtefactBundle.from_pretrained(artefact_dir),
        model_name=identity["name"],
        mode=identity["mode"],
        max_input_tokens=run["max_input_tokens"],
        tasks=[get_task(name) for name in list_tasks()],
        card_url=card_url,
    )
    return ModelRef.of_card(card, model_card_xml(card))


def fhir_job_items(
    source: FhirInput, job: Job, out_dir: Path, ledger: Ledger
) -> Iterator[WrittenPrediction]:
    """The answered records a FHIR job (`medtpe.batch.fhir_job.run_fhir`) wrote under `out_dir`
    for each of its tasks (`task_dir`), with their patients (the job's plans, from its
    partition) and their rows in `ledger`."""
    from medtpe.batch.fhir_job import partitioned, plan_buckets

    partition, _ = partitioned(source, out_dir, progress=False)
    plans = plan_buckets(partition, job)
    for task in job.tasks:
        where = task_dir(out_dir, job.tasks, task)
        yield from fhir_job_predictions(where, plans, task, ledger.recorded)


def write_back(
    access: ServerAccess,
    items: Iterable[WrittenPrediction],
    model: ModelRef,
    *,
    settings: HttpSettings | None = None,
    max_entries: int = MAX_BUNDLE_ENTRIES,
    environ: dict[str, str] | None = None,
    answer_s: float = MAX_ANSWER_S,
) -> WriteBackResult:
    """Write `items` to the server of `access` (SMART Backend Services when it names a client;
    its `scope` should grant `WRITE_BACK_SCOPE`), each answer whole within `answer_s` seconds."""
    settings = settings or HttpSettings()
    with settings.client() as client:
        auth = None
        if access.client_id is not None:
            key = ClientKey.load(access.key_path, dict(environ or os.environ), access.kid)
            auth = SmartBackendAuth(
                access.base_url, access.client_id, key, client, access.scope, settings
            )
        else:
            log.warning("no client id: writing to %s without a token", access.base_url)
        writer = FhirWriter(access.base_url, client, auth, settings, answer_s)
        return write_predictions(writer, items, model, max_entries)
