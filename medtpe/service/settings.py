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

from pydantic import Field, ValidationInfo, field_validator, model_validator
from pydantic_settings import NoDecode, SettingsConfigDict

from medtpe.core.prompt import PromptLayout, WindowPolicy
from medtpe.core.secret_masking import mask_secrets, url_secrets
from medtpe.core.tasks import TASKS_DIR_ENV
from medtpe.core.thresholds import Thresholds, ThresholdsError
from medtpe.inference.engines.protocol import DistributedBackend, Dtype
from medtpe.inference.model import ModelConfig
from medtpe.inference.predictor import Mode
from medtpe.ledger.settings import LedgerSettings
from medtpe.ledger.signing import SigningKeyError
from medtpe.service.cds_hooks.jwt_auth import CdsIssuer
from medtpe.service.cds_settings import CdsHooksSettings

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


class ServiceSettings(CdsHooksSettings):
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
