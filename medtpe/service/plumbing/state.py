"""Runtime state of one service instance: settings, metrics, limits, and once started the loaded
model and the engine (started in the background, so health probes answer at once)."""

from __future__ import annotations

import asyncio
import gc
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import replace

from medtpe.core.cds.risk import DEFAULT_BANDS, RiskBands
from medtpe.core.fhir import SiteMapping, load_site_mapping
from medtpe.core.prompt.task_prompt import min_input_tokens
from medtpe.core.thresholds import Thresholds
from medtpe.inference.engines.factories import start_vllm
from medtpe.inference.engines.protocol import Engine, EngineFactory
from medtpe.inference.model import LoadedModel, load_model
from medtpe.inference.predictor import Predictor
from medtpe.service.plumbing.errors import ApiError
from medtpe.service.plumbing.ledger_writes import ServiceLedger
from medtpe.service.plumbing.limits import Admission
from medtpe.service.plumbing.metrics import ServiceMetrics
from medtpe.service.plumbing.shadow import Shadows
from medtpe.service.plumbing.tenancy import CacheSalts, new_secret
from medtpe.service.settings import ServiceSettings

logger = logging.getLogger("medtpe.service")

SHUTDOWN_RETRY_AFTER_S = 10
"""`Retry-After` of a request refused or cut off by a stop: long enough for a restart; a load
balancer sends the retry to another replica at once."""


class ServiceState:
    """What one app instance holds: settings, metrics, limits, and once started, model + engine."""

    def __init__(
        self,
        settings: ServiceSettings,
        engine_factory: EngineFactory = start_vllm,
        salt_secret: bytes | None = None,
        state_key: bytes | None = None,
    ) -> None:
        self.settings = settings
        self.salts = CacheSalts(salt_secret)
        configured = settings.state_key.encode() if settings.state_key else None
        self.state_key = configured or state_key or new_secret()
        """The key of the score cache's MACs (medtpe/service/cds_hooks/state_store.py):
        `MEDTPE_STATE_KEY`, else `state_key` (one for all API processes of the instance), else
        drawn now (the state is this process's memory)."""
        self.engine_factory = engine_factory
        self.metrics = ServiceMetrics()
        self.admission = Admission(*settings.process_limits)
        self.model: LoadedModel | None = None
        self.other_model: LoadedModel | None = None
        """With `compare_modes`: the other mode's model, on `other_engine`."""
        self.other_engine: Engine | None = None
        self.min_input_tokens: int | None = None
        """The smallest input budget every task's prompt fits in (known before `model`)."""
        self.engine: Engine | None = None
        self.warmed_up = False
        self.stopping = False
        self.draining = False
        """Stopping: new API requests are refused (`medtpe.service.drain`)."""
        self.drain_expired = False
        """The grace period is over: requests still in flight are cut off."""
        self._deadlines: set[asyncio.Timeout] = set()
        self.failure: str | None = None
        self.fhir_mapping: SiteMapping | None = None
        self.ledger = ServiceLedger(settings.ledger)
        """Where every answer is recorded before it leaves
        (`medtpe.service.plumbing.ledger_writes`)."""
        self.shadows = Shadows(settings.shadow_rate, settings.shadow_queue, self.metrics)
        """The live fidelity shadow (`medtpe.service.plumbing.shadow`)."""
        self.thresholds = (
            Thresholds.load(settings.thresholds_file) if settings.thresholds_file else None
        )
        """The operating thresholds per task and site (`MEDTPE_THRESHOLDS_FILE`), if set."""
        self.publish_status()

    @property
    def status(self) -> str:
        """`ready`, `starting`, `stopping`, `ledger_unavailable` (the ledger cannot be opened),
        `failed` (start-up error) or `engine_dead`; the one place readiness is derived
        (`/readyz`, `/healthz`, the `medtpe_engine_ready` gauge)."""
        if self.failure is not None:
            return "failed"
        if self.stopping or self.draining:
            return "stopping"
        if any(engine.dead for engine in self._engines()):
            return "engine_dead"
        if not self.warmed_up:
            return "starting"
        return "ready" if self.ledger.ready else "ledger_unavailable"

    async def start(self) -> None:
        """Prepare the model files, start the engine, warm it up (runs in the background)."""
        try:
            await self.ledger.open()
            self.fhir_mapping = load_site_mapping(self.settings.fhir_mapping)
            model = await asyncio.to_thread(load_model, self.settings.model())
            self.min_input_tokens = await asyncio.to_thread(
                require_input_budget, self.settings, model.predictor
            )
            self.model = model
            require_validated_budget(self.settings, self.model)
            self.engine = await self._started(self.model)
            if self.settings.compare_modes:
                other = replace(self.settings.model(), mode=self.settings.modes[1])
                self.other_model = await asyncio.to_thread(load_model, other)
                self.other_engine = await self._started(self.other_model)
            self.warmed_up = True
            # what start-up loaded (tokenizers, codes metadata: millions of objects) is never
            # freed: kept out of the collector's full passes, which took 0.5-1 s on whichever
            # request crossed the threshold (docs/benchmarks.md, "CDS Hooks latency")
            gc.collect()
            gc.freeze()
            logger.info("ready: %s", self.model.engine_config.model_dir)
        except Exception as exc:
            self.failure = f"{type(exc).__name__}: {exc}"
            logger.exception("start-up failed")
        finally:
            self.publish_status()

    async def _started(self, model: LoadedModel) -> Engine:
        """An engine for `model`, started and warmed up (shut down again when the warm-up
        fails: an engine is never left to the interpreter's exit)."""
        engine = await asyncio.to_thread(self.engine_factory, model.engine_config)
        predictor = model.predictor
        try:
            await engine.warm_up(predictor.engine_ids(predictor.segment("Hello")))
        except BaseException:
            engine.shutdown()
            raise
        return engine

    def _engines(self) -> list[Engine]:
        return [e for e in (self.engine, self.other_engine) if e is not None]

    def stop(self) -> None:
        """Stop the engine processes."""
        self.stopping = True
        self.publish_status()
        self.shadows.close()
        for engine in self._engines():
            engine.shutdown()

    @property
    def in_flight(self) -> int:
        """Requests inside their deadline (`deadline`): admitted, not yet answered."""
        return len(self._deadlines)

    @asynccontextmanager
    async def deadline(self, seconds: float) -> AsyncIterator[None]:
        """`asyncio.timeout(seconds)` that a stop can bring forward (`expire_in_flight`); one
        entered after the grace period expires at once."""
        async with asyncio.timeout(0 if self.drain_expired else seconds) as timeout:
            self._deadlines.add(timeout)
            try:
                yield
            finally:
                self._deadlines.discard(timeout)

    def begin_drain(self) -> None:
        """Stop taking API requests (`refuse_if_draining`); readiness turns red."""
        self.draining = True
        self.publish_status()

    def refuse_if_draining(self) -> None:
        """503 `shutting_down` (counted) once the drain began."""
        if self.draining:
            self.metrics.rejections.labels("shutting_down").inc()
            raise self.shutting_down("the service is shutting down")

    def expire_in_flight(self) -> int:
        """End the grace period: every request in flight times out now (its generation aborted)
        and is answered 503 `shutting_down`; returns how many."""
        self.drain_expired = True
        now = asyncio.get_running_loop().time()
        for timeout in self._deadlines:
            timeout.reschedule(now)
        return len(self._deadlines)

    def shutting_down(self, detail: str) -> ApiError:
        """The 503 of a request refused or cut off by a stop, with `Retry-After`."""
        retry = {"Retry-After": str(SHUTDOWN_RETRY_AFTER_S)}
        return ApiError(503, "shutting_down", f"{detail}; retry", headers=retry)

    def publish_status(self) -> None:
        """Set the `medtpe_engine_ready` gauge from `status` (at each change of state and before
        each scrape; in multiprocess mode, this process's series)."""
        self.metrics.engine_ready.set(float(self.status == "ready"))

    def loaded(self, need_engine: bool) -> LoadedModel:
        """The loaded model (and a live engine when `need_engine`), else 503."""
        status = self.status
        serving = status in ("ready", "ledger_unavailable")  # the ledger: `ServiceLedger.require`
        if self.model is not None and (not need_engine or serving):
            return self.model
        if status == "engine_dead":
            raise ApiError(503, "engine_dead", "the engine died; this instance is not ready")
        raise ApiError(503, "not_ready", f"the service is {status}", headers={"Retry-After": "10"})

    def site_mapping(self) -> SiteMapping:
        """The FHIR site mapping (loaded at start-up), else 503."""
        if self.fhir_mapping is None:
            raise ApiError(503, "not_ready", f"the service is {self.status}", {"Retry-After": "10"})
        return self.fhir_mapping

    def card_bands(self, task: str, site: str) -> RiskBands:
        """A CDS card's risk bands for `task` at `site` (the service id): the task's configured
        bands, `warning` at the site's operating threshold with `MEDTPE_THRESHOLDS_FILE`."""
        bands = self.settings.cds_risk_bands.get(task, DEFAULT_BANDS)
        if self.thresholds is None:
            return bands
        return bands.flagged_from(self.thresholds.of(task, site))

    @property
    def budget_range(self) -> tuple[int, int] | None:
        """(smallest, largest) input budget a request may ask for: every task's prompt fits the
        smallest, the largest is the served one; None until the model is loaded."""
        if self.model is None or self.min_input_tokens is None:
            return None
        return self.min_input_tokens, self.model.predictor.max_input_tokens

    def running_engine(self, other_mode: bool = False) -> Engine:
        """The started engine, or the other mode's (callers checked readiness with
        `loaded(need_engine=True)`)."""
        engine = self.other_engine if other_mode else self.engine
        if engine is None:
            raise ApiError(503, "not_ready", "the engine has not started", {"Retry-After": "10"})
        return engine


def require_validated_budget(settings: ServiceSettings, model: LoadedModel) -> None:
    """A ValueError naming `MEDTPE_MAX_INPUT_TOKENS` when MedTPE would serve a budget above
    those its artefact was validated at (a warning instead with
    `MEDTPE_ALLOW_UNVALIDATED_BUDGET=true`)."""
    why = model.unvalidated_budget()
    if why is None:
        return
    if settings.allow_unvalidated_budget:
        logger.warning("%s (MEDTPE_ALLOW_UNVALIDATED_BUDGET=true: serving it anyway)", why)
        return
    raise ValueError(
        f"{why}: set MEDTPE_MAX_INPUT_TOKENS within the validated budgets, rebuild the "
        "artefact with that serving budget (medtpe build-artefact --serving-budgets), or set "
        "MEDTPE_ALLOW_UNVALIDATED_BUDGET=true to serve it untested"
    )


def require_input_budget(settings: ServiceSettings, predictor: Predictor) -> int:
    """The smallest input budget that holds every task's prompt with any record; a ValueError
    naming `MEDTPE_MAX_INPUT_TOKENS` and that minimum when the served budget is below it (its
    requests would all fail)."""
    minimum = min_input_tokens(predictor.tokenizer.base, predictor.chat_template)
    budget = predictor.max_input_tokens
    if budget >= minimum:
        return minimum
    given = f"MEDTPE_MAX_INPUT_TOKENS={settings.max_input_tokens}"
    if budget < settings.max_input_tokens:
        given += (
            f" leaves {budget} prompt tokens in the model's context once "
            f"MEDTPE_MAX_NEW_TOKENS={settings.max_new_tokens} answer tokens fit, which"
        )
    raise ValueError(
        f"{given} is below the {minimum} tokens the longest task prompt needs with no event "
        f"shown (instruction, question, chat template, age and omitted-events lines): set "
        f"MEDTPE_MAX_INPUT_TOKENS to at least {minimum}"
    )
