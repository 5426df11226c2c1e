"""Service settings, read from the environment (prefix `MEDTPE_`); docs/configuration.md lists them.

Every setting has a default, so `medtpe serve` runs the default model with the default artefact
without any configuration.
"""

from __future__ import annotations

import difflib
import ipaddress
import math
import os
from collections.abc import Iterator, Mapping
from dataclasses import asdict, fields
from pathlib import Path
from typing import Annotated, Any

from pydantic import AnyHttpUrl, Field, ValidationInfo, field_validator, model_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from medtpe.core.cds.risk import DEFAULT_TASK_BANDS, RiskBands
from medtpe.core.cds.services import SERVICES, CdsService
from medtpe.core.prompt import PromptLayout, WindowPolicy
from medtpe.core.secret_masking import mask_secrets, url_secrets
from medtpe.core.tasks import TASKS_DIR_ENV, UnknownTaskError, get_task
from medtpe.core.thresholds import Thresholds, ThresholdsError
from medtpe.inference.engines.protocol import DistributedBackend, Dtype
from medtpe.inference.model import ModelConfig
from medtpe.inference.predictor import Mode
from medtpe.ledger.settings import LedgerSettings
from medtpe.ledger.signing import SigningKeyError
from medtpe.service.cds_hooks.jwt_auth import JWKS_GRACE_S, CdsIssuer
from medtpe.service.cds_hooks.state_store import STATE_URL_SCHEMES

ENV_PREFIX = "MEDTPE_"
API_KEYS_ENV = "MEDTPE_API_KEYS"
CACHE_DIR_ENV = "MEDTPE_CACHE_DIR"
TASK_ENV = "MEDTPE_TASK"
FUZZ_EXAMPLES_ENV = "MEDTPE_FUZZ_EXAMPLES"
OTHER_VARIABLES: Mapping[str, str] = {
    CACHE_DIR_ENV: "where `.cache` lives (medtpe/core/paths.py)",
    TASKS_DIR_ENV: "a directory of extra task files (medtpe/core/tasks/)",
    TASK_ENV: "the default task of `medtpe evaluate` (MEDS-DEV's model.yaml sets it)",
    FUZZ_EXAMPLES_ENV: "examples per operation of the API contract test (tests/)",
    "MEDTPE_FHIR_CLIENT_ID": "`medtpe predict --fhir-server`'s SMART Backend Services client id",
    "MEDTPE_FHIR_CLIENT_KEY": "that client's private key, PEM text (never logged)",
    "MEDTPE_FHIR_CLIENT_KEY_FILE": "that client's private key, a PEM file",
    "MEDTPE_FHIR_CLIENT_KID": "the `kid` of that key in the client's registered JWK Set",
    "MEDTPE_FHIR_SCOPE": "the scopes `medtpe predict --fhir-server` asks for",
}
"""The `MEDTPE_*` environment variables read outside these settings, with what they set."""


def declared_setting(
    name: str, description: str | None = None, note: str = "", **constraints: Any
) -> Any:
    """A setting whose default (and, unless `description` is given, help, with `note` after it)
    is the model or engine option `name` (`ModelConfig.declared`): declared once, not copied."""
    option = ModelConfig.declared(name)
    help_text = (description or option.help) + note
    if option.factory is not None:
        return Field(default_factory=option.factory, description=help_text, **constraints)
    return Field(option.default, description=help_text, **constraints)


class ServiceSettings(BaseSettings):
    """Configuration of one service instance; any other `MEDTPE_*` environment variable than
    its fields' and `OTHER_VARIABLES` is refused (a misspelt setting is not ignored)."""

    model_config = SettingsConfigDict(
        env_prefix=ENV_PREFIX, extra="ignore", env_parse_none_str="none"
    )

    model_dir: Path = declared_setting("model_dir")
    artefact_dir: Path = declared_setting("artefact_dir")
    export_dir: Path = declared_setting("export_dir")
    codes_dir: Path | None = declared_setting("codes_dir")
    codes_replace: bool = declared_setting("codes_replace")
    fhir_mapping: Path | None = Field(
        None,
        description="The site's FHIR R4 -> MEDS mapping file (YAML, docs/integration.md); unset: "
        "the shipped default (MIMIC-IV on FHIR + generic LOINC/SNOMED CT/RxNorm/ICD rules).",
    )
    mode: Mode = declared_setting("mode")
    max_input_tokens: int = declared_setting("max_input_tokens", gt=0)
    allow_unvalidated_budget: bool = Field(
        False,
        description="Serve MedTPE at an input budget above those the artefact's fidelity gate "
        "passed at (its `manifest.json`), with a warning; false: such a start fails.",
    )
    window_policy: WindowPolicy = declared_setting("window_policy")
    prompt_layout: PromptLayout = declared_setting("prompt_layout")
    window_grid_hours: int = declared_setting("window_grid_hours", ge=1)
    cache_salt_header: str | None = Field(
        None,
        description="Without API keys: the request header whose value keeps callers' cached "
        "prompt prefixes apart (e.g. `X-Tenant`); unset: one shared cache "
        "(medtpe/service/plumbing/tenancy.py).",
    )
    temperature: float = Field(0.0, ge=0.0, description="Default sampling temperature.")
    max_new_tokens: int = declared_setting("max_new_tokens", gt=0)
    max_n_samples: int = Field(9, gt=0, description="Largest `options.n_samples` accepted.")
    max_concurrency: int = declared_setting(
        "max_num_seqs",
        "Records generating at the same time (also the engine's `max_num_seqs`).",
        gt=0,
    )
    queue_limit: int = Field(
        64, ge=0, description="Records waiting for a generation slot; beyond that, 503."
    )
    request_timeout_s: float = Field(
        300.0, gt=0, description="Generation deadline per request (queue wait included); 504."
    )
    max_request_bytes: int = Field(
        8 * 1024 * 1024,
        gt=0,
        description="Request body limit, by `Content-Length` or as the body arrives; 413. A body "
        "not in full within `MEDTPE_REQUEST_TIMEOUT_S` of the request's start is cut: 408.",
    )
    max_tokenize_text_bytes: int = Field(
        64 * 1024,
        gt=0,
        description="Longest `text` of `/tokenize`, in UTF-8 bytes; 422 at `[body, text]` (its "
        "answer lists every token twice: about 14 times the text's size).",
    )
    api_keys: Annotated[list[str], NoDecode] = Field(
        default_factory=list,
        repr=False,
        description="Comma-separated accepted API keys; empty turns authentication off.",
    )
    metrics_keys: Annotated[list[str], NoDecode] = Field(
        default_factory=list,
        repr=False,
        description="Comma-separated bearer tokens accepted at `/metrics` only (Prometheus' "
        "scrape token), beside `MEDTPE_API_KEYS`; with either set, `/metrics` needs one.",
    )
    metrics_public: bool = Field(
        False,
        description="Serve `/metrics` without a key even when `MEDTPE_API_KEYS` or "
        "`MEDTPE_METRICS_KEYS` is set (a network only Prometheus reaches).",
    )
    public_docs: bool = Field(
        False,
        description="Serve `/openapi.json`, `/docs` and `/redoc` without a key even when "
        "`MEDTPE_API_KEYS` is set; false: they need one, as the API does.",
    )
    allow_anonymous: bool = Field(
        False,
        description="Serve the API without API keys on an address other machines reach; false: "
        "such a start fails, naming `MEDTPE_API_KEYS`.",
    )
    host: str = Field(
        "127.0.0.1",
        description="Listen address of `medtpe serve` (an address other than a loopback one "
        "needs `MEDTPE_API_KEYS`, or `MEDTPE_ALLOW_ANONYMOUS=true`).",
    )
    port: int = Field(8000, description="Listen port of `medtpe serve`.")
    kv_cache_gib: float | None = declared_setting(
        "kv_cache_gib", note=" `none`: vLLM's default, a share of the device memory.", gt=0
    )
    seed: int = declared_setting("seed")
    dtype: Dtype = declared_setting("dtype")
    enforce_eager: bool = declared_setting("enforce_eager")
    tensor_parallel_size: int = declared_setting("tensor_parallel_size", gt=0)
    pipeline_parallel_size: int = declared_setting("pipeline_parallel_size", gt=0)
    distributed_executor_backend: DistributedBackend | None = declared_setting(
        "distributed_executor_backend"
    )
    cpu_reserved_cores: int | None = declared_setting("cpu_reserved_cores", ge=0)
    api_workers: int = Field(
        1,
        ge=1,
        description="API processes of `medtpe serve` in front of one engine: each reads, renders "
        "and tokenizes requests on its own core, all feed the same engine core; the concurrency "
        "and queue limits are shared out between them (medtpe/service/api_processes.py).",
    )
    compare_modes: bool = Field(
        False,
        description="Also serve the other mode (`original` beside `medtpe`, or the reverse) on a "
        "second engine, so `/predict` answers a record in both with `options.both_modes` (the "
        "compression page's side-by-side view): twice the engine memory and start time; one API "
        "process only.",
    )
    shutdown_grace_s: float = Field(
        60.0, gt=0, description="How long shutdown waits for in-flight requests to drain."
    )
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
    thresholds_file: Path | None = Field(
        None,
        description="Operating thresholds per task and site (the YAML `medtpe monitor "
        "--thresholds` reads): a CDS card is a warning from the threshold of its task at its "
        "service on (`critical` raised to it if below); unset: the risk bands alone.",
    )
    shadow_rate: float = Field(
        0.0,
        ge=0.0,
        le=1.0,
        description="Share of answers (drawn at random) also answered from the prompt's "
        "original-tokenizer ids on the same engine, after the answer has left, as a linked "
        "ledger row (`shadow_of`); 0: none. MedTPE mode only (docs/monitoring.md).",
    )
    shadow_queue: int = Field(
        8,
        gt=0,
        description="Shadow answers waiting to run; one more is dropped (counted), as is any "
        "while live records hold every generation slot.",
    )
    ledger: Annotated[LedgerSettings, NoDecode] = Field(
        description="The prediction ledger's settings, declared and read from their "
        "`MEDTPE_LEDGER_*` variables by `medtpe.ledger.settings.LedgerSettings`."
    )

    @model_validator(mode="before")
    @classmethod
    def _ledger_settings(cls, data: Any) -> Any:
        """The ledger's settings from the environment (`LedgerSettings.from_environ`), a
        `ledger_*` keyword (`ServiceSettings(ledger_off=True)`) in place of its variable."""
        if isinstance(data, dict):
            given = {f.name: data.pop(f.name) for f in fields(LedgerSettings) if f.name in data}
            if isinstance(data.get("ledger"), LedgerSettings):  # else a `MEDTPE_LEDGER`: refused
                given = asdict(data["ledger"]) | given
            data["ledger"] = LedgerSettings.from_environ(**given)
        return data

    @field_validator("api_keys", "metrics_keys", "cds_silent", mode="before")
    @classmethod
    def _split_keys(cls, value: object, info: ValidationInfo) -> object:
        """Accept `a,b,c` from the environment; separators or blanks without a key are refused
        (they would turn authentication off)."""
        if isinstance(value, str):
            keys = [key.strip() for key in value.split(",") if key.strip()]
            if value and not keys:
                name = f"{ENV_PREFIX}{info.field_name}".upper()
                raise ValueError(
                    f"{name}={value!r} holds separators or blanks but no key; leave it empty or "
                    "unset to turn it off"
                )
            return keys
        return value

    @field_validator("cds_silent")
    @classmethod
    def _silent_services(cls, value: list[str]) -> list[str]:
        """Each entry, `SERVICE_ID` or `SERVICE_ID/TENANT`, names a CDS service."""
        known = {service.id for service in SERVICES}
        unknown = [entry for entry in value if entry.partition("/")[0] not in known]
        if unknown:
            raise ValueError(f"MEDTPE_CDS_SILENT: no CDS service {unknown[0]!r}")
        return value

    @field_validator("thresholds_file")
    @classmethod
    def _readable_thresholds(cls, value: Path | None) -> Path | None:
        """A thresholds file that loads (a malformed one fails the start, naming its entry)."""
        if value is not None:
            try:
                Thresholds.load(value)
            except (OSError, ThresholdsError) as exc:
                raise ValueError(f"MEDTPE_THRESHOLDS_FILE: {exc}") from exc
        return value

    @field_validator("cds_issuers")
    @classmethod
    def _jwks_over_https(cls, value: dict[str, CdsIssuer]) -> dict[str, CdsIssuer]:
        """An issuer's JWK Set comes over https (or from this machine): over plain http anyone
        on the path could swap the keys and mint the EHR's tokens."""
        for issuer, config in value.items():
            url = config.jwks_url
            if url.scheme != "https" and not is_loopback(url.host or ""):
                raise ValueError(
                    f"MEDTPE_CDS_ISSUERS: the JWK Set URL of {issuer!r} must be https:// (plain "
                    "http only on a loopback address): anyone between could replace its keys"
                )
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
    def _state_key_with_state_url(self) -> ServiceSettings:
        """Whoever can write to a shared store could forge scores: its entries need a key."""
        if self.state_url is not None and self.state_key is None:
            raise ValueError(
                "MEDTPE_STATE_URL names a shared state store and MEDTPE_STATE_KEY is unset: set "
                "it to a key every API process and replica shares (at least 32 characters, e.g. "
                "`openssl rand -hex 32`), which authenticates the score cache's entries"
            )
        return self

    @model_validator(mode="after")
    def _shared_replay_cache(self) -> ServiceSettings:
        """Several API processes each holding their own `jti`s would accept one token once per
        process: with CDS issuers they need the shared state."""
        if self.cds_issuers and self.api_workers > 1 and self.state_url is None:
            raise ValueError(
                f"MEDTPE_API_WORKERS={self.api_workers} with MEDTPE_CDS_ISSUERS needs "
                "MEDTPE_STATE_URL (a Redis or Valkey server the API processes share): each "
                "process alone would accept a CDS Hooks token once"
            )
        return self

    @model_validator(mode="after")
    def _keys_beyond_loopback(self) -> ServiceSettings:
        """An API other machines reach is not served without keys unless that is said."""
        if not self.api_keys and not self.allow_anonymous and not is_loopback(self.host):
            raise ValueError(
                f"MEDTPE_HOST={self.host} is reachable from other machines and "
                f"{API_KEYS_ENV} is empty: set {API_KEYS_ENV} (or listen on 127.0.0.1), or set "
                "MEDTPE_ALLOW_ANONYMOUS=true to serve without authentication"
            )
        return self

    @model_validator(mode="after")
    def _ledger_beyond_loopback(self) -> ServiceSettings:
        """Answers other machines receive are recorded: no ledger only on a loopback address."""
        if self.ledger.ledger_off and not is_loopback(self.host):
            raise ValueError(
                f"MEDTPE_HOST={self.host} is reachable from other machines and "
                "MEDTPE_LEDGER_OFF=true would answer without recording: unset MEDTPE_LEDGER_OFF "
                "(or listen on 127.0.0.1)"
            )
        return self

    @model_validator(mode="after")
    def _shared_ledger_key(self) -> ServiceSettings:
        """The signing key parses; a ledger other than a local SQLite file needs one configured
        (`LedgerSettings.require_signing_key`)."""
        if self.ledger.ledger_off:
            return self
        try:
            self.ledger.require_signing_key()
        except SigningKeyError as exc:
            raise ValueError(str(exc)) from exc
        return self

    @model_validator(mode="after")
    def _system_actions_recorded(self) -> ServiceSettings:
        """A RiskAssessment a hook has the EHR write is identified by its ledger row."""
        if self.cds_system_actions and self.ledger.ledger_off:
            raise ValueError(
                "MEDTPE_CDS_SYSTEM_ACTIONS=true has the EHR write each answer identified by its "
                "ledger row: not with MEDTPE_LEDGER_OFF=true"
            )
        return self

    @model_validator(mode="after")
    def _silent_and_shadows_recorded(self) -> ServiceSettings:
        """Silent answers and shadows exist only as ledger rows; a shadow answers a MedTPE
        answer again from the original tokenizer's ids."""
        if self.ledger.ledger_off and (self.cds_silent or self.shadow_rate > 0):
            raise ValueError(
                "MEDTPE_CDS_SILENT and MEDTPE_SHADOW_RATE > 0 record answers in the ledger: not "
                "with MEDTPE_LEDGER_OFF=true"
            )
        if self.shadow_rate > 0 and self.mode != "medtpe":
            raise ValueError("MEDTPE_SHADOW_RATE > 0 shadows MedTPE answers: MEDTPE_MODE=medtpe")
        return self

    @model_validator(mode="after")
    def _audience_configured(self) -> ServiceSettings:
        """A JWT's `aud` is checked against the configured public URL, never a request's."""
        if self.cds_issuers and self.cds_base_url is None:
            raise ValueError(
                "MEDTPE_CDS_ISSUERS names EHRs but MEDTPE_CDS_BASE_URL is unset: set it to the "
                "public base URL the EHRs call (a JWT's `aud` must be that URL plus the path)"
            )
        return self

    @model_validator(mode="after")
    def _one_process_to_compare(self) -> ServiceSettings:
        """`compare_modes` starts its second engine in the one API process."""
        if self.compare_modes and self.api_workers > 1:
            raise ValueError(
                "MEDTPE_COMPARE_MODES=true needs MEDTPE_API_WORKERS=1 (the second mode's engine "
                "runs inside the API process)"
            )
        return self

    @model_validator(mode="after")
    def _no_unknown_variables(self) -> ServiceSettings:
        """Refuse `MEDTPE_*` environment variables that are no setting, naming the closest."""
        known = known_variables()
        for name in sorted(os.environ):
            upper = name.upper()
            if upper.startswith(ENV_PREFIX) and upper not in known:
                suffixes = [k.removeprefix(ENV_PREFIX) for k in sorted(known)]
                close = difflib.get_close_matches(upper.removeprefix(ENV_PREFIX), suffixes, n=1)
                hint = f"did you mean {ENV_PREFIX}{close[0]}?" if close else "no such setting"
                raise ValueError(
                    f"unknown environment variable {name}: {hint} (docs/configuration.md "
                    "lists the settings)"
                )
        return self

    def secrets(self) -> list[str]:
        """The secret values among these settings: API and metrics keys, and the passwords and
        tokens of every URL setting and the ledger's signing key (`medtpe.core.secret_masking`
        keeps them out of the log)."""
        found = [*self.api_keys, *self.metrics_keys, *self.ledger.secrets()]
        found += [self.state_key] if self.state_key else []
        for name, value in self:
            if name.endswith("_url") and value is not None:
                found += url_secrets(str(value))
        return found

    def __repr_args__(self) -> Iterator[tuple[str | None, Any]]:
        """The fields as `repr` shows them: keys left out (`repr=False`), URLs masked."""
        for name, value in super().__repr_args__():
            yield name, mask_secrets(value) if isinstance(value, str) else value

    def model(self) -> ModelConfig:
        """What to load and how to run the engine: every setting named as a model or engine
        option (`ModelConfig.from_options`), and `max_concurrency` as the engine's batch."""
        values = self.model_dump(include=set(ModelConfig.option_names()))
        return ModelConfig.from_options(**values, max_num_seqs=self.max_concurrency)

    def silent(self, service_id: str, tenant: str | None) -> bool:
        """Whether the CDS service `service_id` runs silent for a call of `tenant`."""
        return service_id in self.cds_silent or f"{service_id}/{tenant}" in self.cds_silent

    def cds_tasks(self, service: CdsService) -> tuple[str, ...]:
        """The tasks the CDS `service` predicts, one card each, in order: those
        `MEDTPE_CDS_SERVICE_TASKS` names for it, else its own."""
        return tuple(self.cds_service_tasks.get(service.id, (service.task,)))

    @property
    def modes(self) -> tuple[Mode, ...]:
        """The modes this instance answers in: its `mode`, then with `compare_modes` the other."""
        if not self.compare_modes:
            return (self.mode,)
        return (self.mode, "original" if self.mode == "medtpe" else "medtpe")

    @property
    def process_limits(self) -> tuple[int, int]:
        """One API process's share of (`max_concurrency`, `queue_limit`), rounded up."""
        return (
            math.ceil(self.max_concurrency / self.api_workers),
            math.ceil(self.queue_limit / self.api_workers),
        )

    @property
    def capacity(self) -> int:
        """Records one API process admits at once: generating plus queued."""
        return sum(self.process_limits)


def is_loopback(host: str) -> bool:
    """Whether `host` is reachable from this machine only: `localhost` or a loopback address."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:  # a host name: it may resolve to any address
        return False


def setting_variables() -> dict[str, str]:
    """Each setting's environment variable and its help: the service's own fields', then the
    ledger's (`LedgerSettings.variables`)."""
    own = {
        f"{ENV_PREFIX}{name}".upper(): field.description or ""
        for name, field in ServiceSettings.model_fields.items()
        if name != "ledger"
    }
    return own | LedgerSettings.variables()


def known_variables() -> set[str]:
    """Every `MEDTPE_*` environment variable MedTPE reads: one per setting, and
    `OTHER_VARIABLES`."""
    return set(setting_variables()) | set(OTHER_VARIABLES)
