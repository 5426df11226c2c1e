"""One hook call from request to cards, one per task of the service (`MEDTPE_CDS_SERVICE_TASKS`,
else its own task): check the call against its service, then, served as one request
(`medtpe.service.plumbing.serving.served`: admission control, the request deadline, the latency
metric), gather the FHIR resources once as JSON text (`medtpe.service.cds_hooks.prefetch`: what
the client left out is fetched from its FHIR server), then each task's score:

- from the score cache when the same caller sent the very same resources before (a digest of
  their text: nothing is decoded or mapped); the cache is in the state every API process and
  replica shares (medtpe/service/cds_hooks/state_store.py), and a store that does not answer, or
  an entry without the service's MAC, is a miss;
- else map them to MEDS events and the tasks' prompts (`medtpe.inference.record.FhirResources`,
  in a worker thread, the record rendered once for every task: every resource gets the first
  pass, only those the prompts can reach are validated and read; the process's `ResourceCache`
  holds what each resource seen before gave, so a record that grew by a few observations looks
  only at those), and from the score cache when the same caller asked about the same events
  before;
- else from the model through the path every door shares
  (`medtpe.service.plumbing.serving.predict_all`, on the async engine: the event loop never waits
  on it; the record, which every task's prompt shares, prefilled once, then every task
  together, each reading it from the engine's prefix cache: `medtpe_prefill_reused_tokens_total`);
  each card is built from the inference layer's answer (`RecordAnswer`), never from `/predict`'s
  response.

The scores become the call's cards in one place (`_issued_cards`): each its own ledger row
(prediction id, receipt) and kept as issued to the caller
(`medtpe.service.cds_hooks.state_store.IssuedCards`: feedback is taken for those only). A
service running silent (`MEDTPE_CDS_SILENT`) records the rows (`silent`) and answers no card; a
score the model computed now may be shadowed (`medtpe.service.plumbing.shadow`) once the call is
answered.
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
from medtpe.service.plumbing.metrics import MIXED_TASKS
from medtpe.service.plumbing.serving import predict_all, prepare_all, served, served_sampling
from medtpe.service.plumbing.shadow import ShadowJob
from medtpe.service.plumbing.state import ServiceState
from medtpe.service.settings import ServiceSettings

DOOR = "cds-hooks"
"""The door label of the hooks' answers in `medtpe_prefill_reused_tokens_total`."""


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


@dataclass(frozen=True)
class TaskScore:
    """One task's score in a hook call: whether it came from the score cache, and for a score
    the model computed now, its fidelity shadow once its row is known."""

    task: Task
    score: Score
    cached: bool
    shadow: Callable[[PredictionRow], ShadowJob] | None = None


async def answer_hook(
    state: ServiceState,
    hooks: CdsHooks,
    service: CdsService,
    body: HookRequest,
    caller: Caller,
    audit: AuditEntry,
) -> CdsResponse:
    """The call's cards, one per task of the service (`ServiceSettings.cds_tasks`), in its
    order (`audit` gets the model, the cards and the outcome): the whole call, the FHIR fetch
    and the mapping included, served as one request (`served`: refused at once when admission
    control has no room, cut at the request deadline, timed in the latency metric under its
    task, or `MIXED_TASKS` for several; admitted as one record per task)."""
    _check_call(service, body)
    if state.settings.cds_system_actions:
        check_patient_id(body)
    model = state.loaded(need_engine=True)
    audit.model, audit.artefact = model.identity.name, model.identity.artefact_id
    tasks = [get_task(name) for name in state.settings.cds_tasks(service)]
    start = time.perf_counter()
    silent = state.settings.silent(service.id, caller.tenant)  # MEDTPE_CDS_SILENT
    label = tasks[0].name if len(tasks) == 1 else MIXED_TASKS
    async with served(state, "cds_hook", label, len(tasks)):
        await state.ledger.require()
        scores = await _scored(state, hooks, model, tasks, service, body, caller)
        issued = await _issued_cards(state, hooks, model, service, caller, scores, start, silent)
    # after the answer left admission control
    state.shadows.offer(
        state,
        [s.shadow(row) for s, (_, row) in zip(scores, issued, strict=True) if s.shadow and row],
    )
    audit.card = " ".join(card.uuid for card, _ in issued)
    audit.outcome = "cached" if all(s.cached for s in scores) else "card"
    if silent:  # recorded (the rows say silent), not shown
        audit.outcome = "silent"
        return CdsResponse(cards=[])
    actions = []
    if state.settings.cds_system_actions:
        patient = str(body.context[PATIENT_ID])
        for scored, (_, row) in zip(scores, issued, strict=True):
            # a card from the score cache repeats an answer whose action went with its first card
            if row is not None and not scored.cached:
                actions += risk_assessment_actions(state, scored.task, patient, row)
    return CdsResponse(cards=[card for card, _ in issued], systemActions=actions or None)


async def _scored(
    state: ServiceState,
    hooks: CdsHooks,
    model: LoadedModel,
    tasks: list[Task],
    service: CdsService,
    body: HookRequest,
    caller: Caller,
) -> list[TaskScore]:
    """The score of each task about the call's record: the record gathered once, the tasks the
    score cache does not hold prepared together (the record rendered once) and answered
    together (`predict_all`: the record computed once, its reused prompt tokens counted)."""
    gathered = await gather_resources(service, body, caller, state.settings)
    if gathered.fetch_s:
        state.metrics.cds_fhir_fetch.observe(gathered.fetch_s)
    patient = str(body.context[PATIENT_ID])
    salt = state.salts.of(f"cds-hooks\x1f{caller.issuer}\x1f{caller.tenant or ''}")
    caller_key = _caller_key(caller)  # the same in every replica
    parts = [_score_parts(model, task, tasks) for task in tasks]
    sent = await asyncio.to_thread(_sent_digests, gathered.resources, patient, parts)
    sent_keys = [(*caller_key, "sent", digest) for digest in sent]
    found = await _cached_scores(state, hooks, sent_keys)
    if all(score is not None for score in found):
        return [TaskScore(task, score, True) for task, score in zip(tasks, found, strict=True)]
    mapping = state.site_mapping()
    cache = hooks.resource_cache(mapping)
    resources = FhirResources(gathered.resources, mapping, patient_id=patient, cache=cache)
    prepared = await prepare_all(model.predictor, tasks, resources, gathered.locate)
    event_keys = [
        (*caller_key, "events", task.name, patient, record_digest(p.events, None, *part))
        for task, p, part in zip(tasks, prepared, parts, strict=True)
    ]
    missing = [i for i, score in enumerate(found) if score is None]
    again = await _cached_scores(state, hooks, [event_keys[i] for i in missing])
    for i, score in zip(missing, again, strict=True):
        found[i] = score
    cached = [score is not None for score in found]
    shadows: list[Callable[[PredictionRow], ShadowJob] | None] = [None] * len(tasks)
    unanswered = [i for i, score in enumerate(found) if score is None]
    if unanswered:
        sampling = served_sampling(state.settings)  # p(yes) asked for: the card shows it
        records = [prepared[i] for i in unanswered]
        answers = await predict_all(state, model, records, sampling, salt, site=service.id)
        reused = sum(answered.answer.cached_tokens for answered in answers)
        state.metrics.prefill_reused_tokens.labels(DOOR).inc(reused)
        engine = state.running_engine()
        for i, answered in zip(unanswered, answers, strict=True):
            record, answer = answered.record, answered.answer
            facts = answer_facts(model, engine, record, sampling, answer, answered.total_s)
            basis = None if state.ledger.off else state.ledger.basis(facts).to_json()
            found[i] = replace(_score(model, answered), receipt=basis)
            shadows[i] = partial(ShadowJob, model, record, sampling, salt)
    scores: list[TaskScore] = []
    for i, (task, score) in enumerate(zip(tasks, found, strict=True)):
        assert score is not None  # from the cache or answered now
        kept = [sent_keys[i], *([] if cached[i] else [event_keys[i]])]
        await hooks.scores.put(score, *kept)  # one round trip to a shared store
        scores.append(TaskScore(task, score, cached[i], shadows[i]))
    return scores


def _score_parts(model: LoadedModel, task: Task, tasks: list[Task]) -> tuple[str, ...]:
    """What a score of `task` depends on besides the record: the task, the artefact, the mode,
    the input budget and, when the service has other tasks, all its tasks, sorted (prepared
    together, the longest of their texts bounds the record's share of the budget; their order
    decides only which prompt the engine computes first)."""
    identity = model.identity
    parts = (task.name, identity.artefact_id, identity.mode, str(model.predictor.max_input_tokens))
    return parts if len(tasks) == 1 else (*parts, ",".join(sorted(t.name for t in tasks)))


def _sent_digests(resources: list[bytes], patient: str, parts: list[tuple[str, ...]]) -> list[str]:
    """The key of the record as it was sent (`texts_digest`) for each task's `parts`."""
    return [texts_digest(resources, patient, *part) for part in parts]


async def _cached_scores(
    state: ServiceState, hooks: CdsHooks, keys: list[tuple[str, ...]]
) -> list[Score | None]:
    """The recordable score kept under each of `keys`, else None (`_recordable`)."""
    found = await asyncio.gather(*(hooks.scores.get(*key) for key in keys))
    return [_recordable(state, score) for score in found]


async def _issued_cards(
    state: ServiceState,
    hooks: CdsHooks,
    model: LoadedModel,
    service: CdsService,
    caller: Caller,
    scores: list[TaskScore],
    start: float,
    silent: bool = False,
) -> list[tuple[Card, PredictionRow | None]]:
    """The card of each task's score and its ledger row, committed together (a new prediction
    on the score's receipt basis: a card from the cache is shown again, so it is a row of its
    own), each kept as issued to `caller` by `service` (for its feedback); `start`: when the
    call's work began; `silent`: the rows say so, the cards are not issued (never shown). A
    card's indicator: its task's bands at the service (`card_bands`)."""
    rows: list[PredictionRow | None] = []
    for scored in scores:
        receipt = scored.score.receipt
        rows.append(
            None
            if receipt is None
            else state.ledger.row(
                ReceiptBasis.from_json(receipt),
                door="cds_hook",
                caller=_ledger_caller(caller),
                site=service.id,
                latency_ms=(time.perf_counter() - start) * 1e3,
                silent=silent,
            )
        )
    recorded = [row for row in rows if row is not None]
    if recorded:
        await state.ledger.commit(recorded)
    issued = []
    for scored, row in zip(scores, rows, strict=True):
        bands = state.card_bands(scored.task.name, service.id)
        text = card_text(scored.score, bands, cached=scored.cached)
        card = risk_card(text, model.identity, state.settings, row)
        if not silent:
            await hooks.cards.issue(_caller_key(caller), service.id, card.uuid)
        issued.append((card, row))
    return issued


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
