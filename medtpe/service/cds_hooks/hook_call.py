"""One hook call from request to card: check the call against its service, then, served as one
request (`medtpe.service.plumbing.serving.served`: admission control, the request deadline, the
latency metric), gather the FHIR resources as JSON text (`medtpe.service.cds_hooks.prefetch`: what
the client left out is fetched from its FHIR server), then the score:

- from the score cache when the same caller sent the very same resources before (a digest of
  their text: nothing is decoded or mapped); the cache is in the state every API process and
  replica shares (medtpe/service/cds_hooks/state_store.py), and a store that does not answer, or
  an entry without the service's MAC, is a miss;
- else map them to MEDS events and the prompt (`medtpe.inference.record.FhirResources`, in a worker
  thread: every resource gets the first pass, only those the prompt can reach are validated and
  read; the process's `ResourceCache` holds what each resource seen before
  gave, so a record that grew by a few observations looks only at those), and from the score
  cache when the same caller asked about the same events before;
- else from the model through the path every door shares
  (`medtpe.service.plumbing.serving.predict_record`, on the async engine: the event loop never waits
  on it); the card is built from the inference layer's answer (`RecordAnswer`), never from
  `/predict`'s response.

The score becomes the call's card in one place (`_issued_card`), which keeps the card's id as
issued to the caller (`medtpe.service.cds_hooks.state_store.IssuedCards`: feedback is taken for
those only). A service running silent (`MEDTPE_CDS_SILENT`) records the row (`silent`) and answers
no card; a score the model computed now may be shadowed (`medtpe.service.plumbing.shadow`) once
the call is answered.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from functools import partial

import meds
import numpy as np
from starlette.requests import Request

from medtpe.core.cds.cards import Score, card_text
from medtpe.core.cds.score_cache import record_digest, texts_digest
from medtpe.core.cds.services import HOOK_CONTEXT, PATIENT_ID, CdsService
from medtpe.core.fhir import ResourceCache, SiteMapping
from medtpe.core.tasks import Task, get_task
from medtpe.inference.model import LoadedModel
from medtpe.inference.predictor import RecordAnswer
from medtpe.inference.receipt_facts import answer_facts
from medtpe.inference.record import FhirResources
from medtpe.ledger.answers import ReceiptBasis
from medtpe.ledger.store import PredictionRow
from medtpe.service.cds_hooks.audit import AuditEntry
from medtpe.service.cds_hooks.jwt_auth import Caller, HookAuthenticator, JwksCache, ReplayCache
from medtpe.service.cds_hooks.prefetch import gather_resources
from medtpe.service.cds_hooks.responses import risk_card
from medtpe.service.cds_hooks.schemas import Card, CdsResponse, HookRequest
from medtpe.service.cds_hooks.state_store import IssuedCards, LocalStore, ScoreStore, open_store
from medtpe.service.cds_hooks.system_actions import check_patient_id, risk_assessment_actions
from medtpe.service.plumbing.errors import ApiError, field_error
from medtpe.service.plumbing.serving import predict_record, prepare, served, served_sampling
from medtpe.service.plumbing.shadow import ShadowJob
from medtpe.service.plumbing.state import ServiceState
from medtpe.service.settings import ServiceSettings


@dataclass(frozen=True)
class CdsHooks:
    """What the hook routes hold: the JWT check, the score cache, the issued cards and the
    resource cache."""

    auth: HookAuthenticator
    scores: ScoreStore
    cards: IssuedCards
    base_url: str | None
    max_resource_bytes: int
    _resources: dict[int, ResourceCache] = field(default_factory=dict)

    @classmethod
    def from_settings(
        cls,
        settings: ServiceSettings,
        state_key: bytes,
        on_state_failure: Callable[[str], None] | None = None,
        on_score_rejected: Callable[[str], None] | None = None,
    ) -> CdsHooks:
        """The hooks of one API process: the replay and score caches in the state store of
        `state_url` (unset: this process's memory), each failed store operation told to
        `on_state_failure`; the score cache's entries authenticated with `state_key`, each
        refused one told to `on_score_rejected`; the issued cards there too (unset: at most
        `cds_issued_cards` in this process's memory)."""
        store = open_store(settings.state_url, settings.cds_score_cache_size, on_state_failure)
        cards = store if settings.state_url else LocalStore(settings.cds_issued_cards)
        enabled = settings.cds_score_cache_size > 0
        return cls(
            HookAuthenticator(
                settings.cds_issuers,
                settings.cds_jwt_max_lifetime_s,
                JwksCache(settings.cds_jwks_grace_s),
                ReplayCache(store),
            ),
            ScoreStore(
                store, state_key, settings.cds_score_cache_ttl_s, enabled, on_score_rejected
            ),
            IssuedCards(cards, settings.cds_card_ttl_s),
            str(settings.cds_base_url).rstrip("/") if settings.cds_base_url else None,
            settings.cds_resource_cache_bytes,
        )

    async def aclose(self) -> None:
        """Close the state store's connections (at shutdown)."""
        await self.scores.store.aclose()

    def resource_cache(self, mapping: SiteMapping) -> ResourceCache:
        """The process's resource cache of the site mapping (loaded at start-up)."""
        cache = self._resources.get(id(mapping))
        if cache is None or cache.mapping is not mapping:
            self._resources.clear()
            cache = self._resources[id(mapping)] = ResourceCache(mapping, self.max_resource_bytes)
        return cache

    def audience(self, request: Request) -> str:
        """The URL called, as a JWT's `aud` must name it: the configured public base URL and
        the path as sent (percent-encoding kept), never the request's Host header. The base URL
        is required with issuers (`ServiceSettings`); without issuers no call is accepted,
        whatever its `aud`."""
        raw = request.scope.get("raw_path")
        path = raw.decode("latin-1") if raw is not None else request.url.path
        return f"{self.base_url or ''}{path}"


async def answer_hook(
    state: ServiceState,
    hooks: CdsHooks,
    service: CdsService,
    body: HookRequest,
    caller: Caller,
    audit: AuditEntry,
) -> CdsResponse:
    """The call's card (`audit` gets the model, the card and the outcome): the whole call, the
    FHIR fetch and the mapping included, served as one request (`served`: refused at once when
    admission control has no room, cut at the request deadline, timed in the latency metric)."""
    _check_call(service, body)
    if state.settings.cds_system_actions:
        check_patient_id(body)
    model = state.loaded(need_engine=True)
    audit.model, audit.artefact = model.identity.name, model.identity.artefact_id
    task = get_task(service.task)
    start = time.perf_counter()
    silent = state.settings.silent(service.id, caller.tenant)  # MEDTPE_CDS_SILENT
    async with served(state, "cds_hook", task.name, 1):
        await state.ledger.require()
        score, cached, shadow = await _scored(state, hooks, model, task, service, body, caller)
        scored = (score, cached)
        card, row = await _issued_card(state, hooks, model, service, caller, scored, start, silent)
    if shadow is not None and row is not None:  # after the answer left admission control
        state.shadows.offer(state, [shadow(row)])
    audit.card, audit.outcome = card.uuid, "cached" if cached else "card"
    if silent:  # recorded (the row says silent), not shown
        audit.outcome = "silent"
        return CdsResponse(cards=[])
    actions = None
    if state.settings.cds_system_actions and row is not None and not cached:
        # a card from the score cache repeats an answer whose action went with its first card
        actions = risk_assessment_actions(state, task, str(body.context[PATIENT_ID]), row)
    return CdsResponse(cards=[card], systemActions=actions or None)


async def _scored(
    state: ServiceState,
    hooks: CdsHooks,
    model: LoadedModel,
    task: Task,
    service: CdsService,
    body: HookRequest,
    caller: Caller,
) -> tuple[Score, bool, Callable[[PredictionRow], ShadowJob] | None]:
    """The score of the call's record, whether it came from the score cache, and for a score
    the model computed now, its fidelity shadow once its row is known."""
    gathered = await gather_resources(service, body, caller, state.settings)
    if gathered.fetch_s:
        state.metrics.cds_fhir_fetch.observe(gathered.fetch_s)
    patient = str(body.context[PATIENT_ID])
    salt = state.salts.of(f"cds-hooks\x1f{caller.issuer}\x1f{caller.tenant or ''}")
    caller_key = _caller_key(caller)  # the same in every replica
    identity = model.identity
    parts = (task.name, identity.artefact_id, identity.mode, str(model.predictor.max_input_tokens))
    sent = await asyncio.to_thread(texts_digest, gathered.resources, patient, *parts)
    score = _recordable(state, await hooks.scores.get(*caller_key, "sent", sent))
    if score is not None:
        return score, True, None
    mapping = state.site_mapping()
    cache = hooks.resource_cache(mapping)
    resources = FhirResources(gathered.resources, mapping, patient_id=patient, cache=cache)
    prepared = await prepare(model.predictor, task, resources, gathered.locate)
    digest = record_digest(prepared.events, None, *parts)
    key = (*caller_key, "events", task.name, patient, digest)
    score = _recordable(state, await hooks.scores.get(*key))
    cached = score is not None
    shadow = None
    if score is None:
        sampling = served_sampling(state.settings)  # p(yes) asked for: the card shows it
        answered = await predict_record(state, model, prepared, sampling, salt, site=service.id)
        engine = state.running_engine()
        facts = answer_facts(model, engine, prepared, sampling, answered.answer, answered.total_s)
        basis = None if state.ledger.off else state.ledger.basis(facts).to_json()
        score = replace(_score(model, answered), receipt=basis)
        shadow = partial(ShadowJob, model, prepared, sampling, salt)
    kept = [(*caller_key, "sent", sent), *([] if cached else [key])]
    await hooks.scores.put(score, *kept)  # one round trip to a shared store
    return score, cached, shadow


async def _issued_card(
    state: ServiceState,
    hooks: CdsHooks,
    model: LoadedModel,
    service: CdsService,
    caller: Caller,
    scored: tuple[Score, bool],
    start: float,
    silent: bool = False,
) -> tuple[Card, PredictionRow | None]:
    """The card of a score (and whether it came from the cache) and its ledger row, committed
    (a new prediction on the score's receipt basis: a card from the cache is shown again, so
    it is a row of its own), kept as issued to `caller` by `service` (for its feedback);
    `start`: when the call's work began; `silent`: the row says so, the card is not issued
    (never shown). Its indicator: the task's bands at the service (`card_bands`)."""
    score, cached = scored
    bands = state.card_bands(service.task, service.id)
    row = None
    if score.receipt is not None:
        row = state.ledger.row(
            ReceiptBasis.from_json(score.receipt),
            door="cds_hook",
            caller=_ledger_caller(caller),
            site=service.id,
            latency_ms=(time.perf_counter() - start) * 1e3,
            silent=silent,
        )
        await state.ledger.commit([row])
    card = risk_card(card_text(score, bands, cached=cached), model.identity, state.settings, row)
    if not silent:
        await hooks.cards.issue(_caller_key(caller), service.id, card.uuid)
    return card, row


def _recordable(state: ServiceState, score: Score | None) -> Score | None:
    """A cached score, unless the ledger is on and it has no receipt basis to record (a miss)."""
    if score is None or (score.receipt is None and not state.ledger.off):
        return None
    return score


def _ledger_caller(caller: Caller) -> str:
    """Who asked, as the ledger names a hook's caller: the issuer and the tenant."""
    return f"{caller.issuer} tenant={caller.tenant or '-'}"[:200]


def _caller_key(caller: Caller) -> tuple[str, str]:
    """Who the call is from, as the shared state keys it: issuer and tenant."""
    return caller.issuer, caller.tenant or ""


def _check_call(service: CdsService, body: HookRequest) -> None:
    """The hook is the service's and the context has the hook's fields (422 otherwise)."""
    if body.hook != service.hook:
        raise ApiError(
            422,
            "invalid_request",
            field_error(("body", "hook"), f"service {service.id} answers {service.hook}", "hook"),
        )
    for name in HOOK_CONTEXT[service.hook]:
        value = body.context.get(name)
        if not isinstance(value, str) or not value:
            raise ApiError(
                422,
                "invalid_request",
                field_error(("body", "context", name), f"{service.hook} needs {name}", "missing"),
            )


def _score(model: LoadedModel, answered: RecordAnswer) -> Score:
    """What the card reports of one answer to a FHIR record."""
    record, answer = answered.record, answered.answer
    task, events, fhir = record.task, record.events, record.fhir
    assert fhir is not None  # a hook's record is FHIR resources
    option = task.positive_option
    p_yes = answer.probabilities.get(option) if answer.probabilities and option else None
    clinical = ~np.isnat(events.times) & (np.asarray(events.codes) != meds.birth_code)
    times = events.times[clinical]
    first, last = (_datetime(times.min()), _datetime(times.max())) if len(times) else (None, None)
    totals = {"resources": fhir.counts.n_resources}
    for name in ("mapped", "unmapped", "skipped"):
        totals[name] = sum(getattr(c, name) for c in fhir.counts.by_type.values())
    seg = record.segmentation
    return Score(
        task_title=task.title,
        question=task.question,
        p_yes=p_yes,
        prediction_time=record.prediction_time,
        events_total=record.prompt.n_events_total,
        events_kept=record.prompt.n_events_kept,
        first_event=first,
        last_event=last,
        input_budget=model.predictor.max_input_tokens,
        original_tokens=len(seg.original_ids),
        medtpe_tokens=len(seg.medtpe_ids),
        compression_rate=seg.compression_rate,
        model=model.identity.name,
        mode=model.identity.mode,
        artefact_id=model.identity.artefact_id,
        computed_at=datetime.now(UTC),
        mapping=totals,
    )


def _datetime(value: np.datetime64) -> datetime:
    return value.astype("datetime64[us]").item()
