"""The CDS Hooks settings (`MEDTPE_CDS_*`) and the state the API processes and replicas share
(`MEDTPE_STATE_URL`, `MEDTPE_STATE_KEY`): the EHRs allowed to call and how their tokens are
checked, the FHIR fetches' limits, the cards (risk bands, tasks per service, silent services,
system actions) and the caches. `CdsHooksSettings` is the base of
`medtpe.service.settings.ServiceSettings`, which reads them from the environment with the rest;
docs/configuration.md lists them.
"""

from __future__ import annotations

from typing import Annotated

from pydantic import AnyHttpUrl, Field, field_validator, model_validator
from pydantic_settings import BaseSettings, NoDecode

from medtpe.core.cds.risk import DEFAULT_TASK_BANDS, RiskBands
from medtpe.core.cds.services import SERVICES, CdsService
from medtpe.core.tasks import UnknownTaskError, get_task
from medtpe.service.cds_hooks.jwt_auth import JWKS_GRACE_S, CdsIssuer
from medtpe.service.cds_hooks.state_store import STATE_URL_SCHEMES


class CdsHooksSettings(BaseSettings):
    """The CDS Hooks settings and the shared state's, each checked on its own; `ServiceSettings`
    splits `cds_silent`'s commas (as the keys'), keeps the JWK Set URLs to https or a loopback
    address (as the listen address) and checks what involves other settings."""

    cds_issuers: dict[str, CdsIssuer] = Field(
        default_factory=dict,
        description="CDS Hooks: the EHRs allowed to call `/cds-services`, as JSON `{issuer: "
        '{"jwks_url": URL, "fhir_servers": [URL, ...]}}`; empty: every hook call gets 401.',
    )
    cds_base_url: AnyHttpUrl | None = Field(
        None,
        description="CDS Hooks: the public base URL EHRs call (e.g. `https://cds.example.org`), "
        "of which a JWT's `aud` must be the called endpoint (never the request's Host header); "
        "required with `MEDTPE_CDS_ISSUERS`.",
    )
    cds_jwt_max_lifetime_s: float = Field(
        600.0, gt=0, description="CDS Hooks: longest accepted JWT lifetime (`exp` - `iat`)."
    )
    cds_jwks_grace_s: float = Field(
        JWKS_GRACE_S,
        ge=0,
        description="CDS Hooks: how long past its 5-minute reuse an issuer's last good JWK Set "
        "still verifies calls while its host does not answer (refetches: one at a time, at most "
        "one attempt per 10 s per issuer).",
    )
    state_url: str | None = Field(
        None,
        description="The state every API process and replica shares (the CDS Hooks replay and "
        "score caches), on a Redis or Valkey server: `redis://host:port/db` (`rediss://` for "
        "TLS, `redis://:password@host...`); unset: in each process's memory, one API process "
        "only when CDS issuers are configured (medtpe/service/cds_hooks/state_store.py).",
    )
    state_key: str | None = Field(
        None,
        repr=False,
        min_length=32,
        description="The key (at least 32 characters, e.g. `openssl rand -hex 32`) every API "
        "process and replica shares to authenticate the score cache's entries in the state "
        "store (HMAC-SHA256): an entry without its MAC is a miss, never a card. Required with "
        "`MEDTPE_STATE_URL`; unset without it: drawn when the instance starts.",
    )
    cds_fhir_timeout_s: float = Field(
        10.0, gt=0, description="CDS Hooks: deadline of all FHIR server fetches of one call."
    )
    cds_fhir_max_answer_bytes: int = Field(
        16 * 1024 * 1024,
        gt=0,
        description="CDS Hooks: largest answer (one read or search page) read from a FHIR "
        "server, counted while it arrives: reading stops there.",
    )
    cds_fhir_max_call_bytes: int = Field(
        64 * 1024 * 1024,
        gt=0,
        description="CDS Hooks: most bytes all FHIR server answers of one call may hold "
        "together, counted while they arrive.",
    )
    cds_fhir_max_resources: int = Field(
        200_000,
        gt=0,
        description="CDS Hooks: most resources the FHIR server fetches of one call may bring "
        "(MEDS: at most 200,000 events per record).",
    )
    cds_allow_http_fhir: bool = Field(
        False,
        description="CDS Hooks: accept an `http://` `fhirServer` (tests, a local FHIR server); "
        "false: https only, as the specification requires for production data.",
    )
    cds_risk_bands: dict[str, RiskBands] = Field(
        default_factory=lambda: dict(DEFAULT_TASK_BANDS),
        description='CDS Hooks: risk bands per task as JSON `{task: {"warning": p, '
        '"critical": p}}` (a card\'s indicator: info below `warning`, warning, critical from '
        "`critical`); tasks not listed use 0.2 and 0.5.",
    )
    cds_service_tasks: dict[str, list[str]] = Field(
        default_factory=dict,
        description="CDS Hooks: the tasks a service predicts, as JSON `{service_id: [task, "
        '...]}` (or `{service_id: "task"}`): a hook call reads the patient\'s record once and '
        "answers one card per task, in this order; a service not listed predicts its own task.",
    )
    cds_model_card_url: AnyHttpUrl | None = Field(
        None,
        description="CDS Hooks: the model card a card's `source.url` links to; unset: the "
        "service's own (`/model-card.xml` under `MEDTPE_CDS_BASE_URL`).",
    )
    cds_score_cache_size: int = Field(
        10_000,
        ge=0,
        description="CDS Hooks: scores kept per API process (0: no cache); with `state_url`, "
        "in the shared store, bounded by their time to live.",
    )
    cds_score_cache_ttl_s: float = Field(
        3600.0, gt=0, description="CDS Hooks: how long a kept score is reused."
    )
    cds_resource_cache_bytes: int = Field(
        128 * 1024 * 1024,
        ge=0,
        description="CDS Hooks: bytes of FHIR resource validation and mapping kept per API "
        "process, so a record asked about again only reads its new resources (about 1 KB per "
        "Observation; 0: none).",
    )
    cds_card_ttl_s: float = Field(
        86400.0,
        gt=0,
        description="CDS Hooks: how long a card's id is kept as issued: feedback is taken only "
        "for cards this service issued to the same issuer and tenant within that time.",
    )
    cds_issued_cards: int = Field(
        50_000,
        gt=0,
        description="CDS Hooks without `MEDTPE_STATE_URL`: issued card ids kept per API process "
        "(about 0.35 KB each; the oldest forgotten first).",
    )
    cds_max_feedback_items: int = Field(
        100, gt=0, description="CDS Hooks: most feedback items in one call; more: 422."
    )
    cds_system_actions: bool = Field(
        False,
        description="CDS Hooks: each card computed by the model comes with a `systemActions` "
        "create of its answer as a FHIR RiskAssessment (identified by its prediction id), which "
        "an EHR that applies system actions writes to the chart without a click; off: cards only.",
    )
    cds_silent: Annotated[list[str], NoDecode] = Field(
        default_factory=list,
        description="CDS Hooks: comma-separated services that run silent, each `SERVICE_ID` "
        "(every caller) or `SERVICE_ID/TENANT` (one tenant's calls): the answer is recorded "
        "(`silent` in the ledger), the EHR gets no card; removing a service promotes it "
        "(docs/monitoring.md).",
    )

    @field_validator("cds_silent")
    @classmethod
    def _silent_services(cls, value: list[str]) -> list[str]:
        """Each entry, `SERVICE_ID` or `SERVICE_ID/TENANT`, names a CDS service."""
        known = {service.id for service in SERVICES}
        unknown = [entry for entry in value if entry.partition("/")[0] not in known]
        if unknown:
            raise ValueError(f"MEDTPE_CDS_SILENT: no CDS service {unknown[0]!r}")
        return value

    @field_validator("cds_risk_bands")
    @classmethod
    def _known_tasks(cls, value: dict[str, RiskBands]) -> dict[str, RiskBands]:
        """Risk bands only for tasks that exist (a misspelt task would silently keep its
        defaults)."""
        for name in value:
            try:
                get_task(name)
            except UnknownTaskError as exc:
                raise ValueError(f"MEDTPE_CDS_RISK_BANDS: {exc}") from exc
        return value

    @field_validator("cds_service_tasks", mode="before")
    @classmethod
    def _one_task_alone(cls, value: object) -> object:
        """A service's single task may be given alone (`"task"` for `["task"]`)."""
        if isinstance(value, dict):
            return {k: [v] if isinstance(v, str) else v for k, v in value.items()}
        return value

    @field_validator("cds_service_tasks")
    @classmethod
    def _service_tasks(cls, value: dict[str, list[str]]) -> dict[str, list[str]]:
        """Each entry names a CDS service and at least one task, each a known task once."""
        known = {service.id for service in SERVICES}
        for service_id, tasks in value.items():
            where = f"MEDTPE_CDS_SERVICE_TASKS[{service_id!r}]"
            if service_id not in known:
                services = ", ".join(sorted(known))
                raise ValueError(f"{where}: no CDS service {service_id!r}; services: {services}")
            if not tasks:
                raise ValueError(f"{where}: names no task; leave the service out for its own")
            if len(set(tasks)) < len(tasks):
                raise ValueError(f"{where}: names a task twice ({', '.join(tasks)})")
            for name in tasks:
                try:
                    get_task(name)
                except UnknownTaskError as exc:
                    raise ValueError(f"{where}: {exc}") from exc
        return value

    @field_validator("state_url")
    @classmethod
    def _state_scheme(cls, value: str | None) -> str | None:
        """A Redis URL (a misspelt one would fail only at the first hook call)."""
        if value is not None and value.partition("://")[0] not in STATE_URL_SCHEMES:
            schemes = ", ".join(f"{scheme}://" for scheme in STATE_URL_SCHEMES)
            raise ValueError(f"MEDTPE_STATE_URL must start with one of {schemes}")
        return value

    @model_validator(mode="after")
    def _state_key_with_state_url(self) -> CdsHooksSettings:
        """Whoever can write to a shared store could forge scores: its entries need a key."""
        if self.state_url is not None and self.state_key is None:
            raise ValueError(
                "MEDTPE_STATE_URL names a shared state store and MEDTPE_STATE_KEY is unset: set "
                "it to a key every API process and replica shares (at least 32 characters, e.g. "
                "`openssl rand -hex 32`), which authenticates the score cache's entries"
            )
        return self

    def silent(self, service_id: str, tenant: str | None) -> bool:
        """Whether the CDS service `service_id` runs silent for a call of `tenant`."""
        return service_id in self.cds_silent or f"{service_id}/{tenant}" in self.cds_silent

    def cds_tasks(self, service: CdsService) -> tuple[str, ...]:
        """The tasks the CDS `service` predicts, one card each, in order: those
        `MEDTPE_CDS_SERVICE_TASKS` names for it, else its own."""
        return tuple(self.cds_service_tasks.get(service.id, (service.task,)))
