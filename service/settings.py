"""Service settings, read from the environment (prefix `MEDTPE_`); docs/configuration.md lists them.

Every setting has a default, so `medtpe serve` runs the default model with the default artefact
without any configuration.
"""

from __future__ import annotations

import difflib
import math
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated

from pydantic import Field, field_validator, model_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from inference.engine import DistributedBackend, EngineOptions
from inference.model import ModelConfig
from inference.predictor import Mode
from medtpe_core.paths import default_artefact_dir, default_export_dir, default_model_dir
from medtpe_core.tasks import TASKS_DIR_ENV
from medtpe_core.windowing import DEFAULT_GRID_HOURS, Windowing, WindowPolicy

ENV_PREFIX = "MEDTPE_"
API_KEYS_ENV = "MEDTPE_API_KEYS"
CACHE_DIR_ENV = "MEDTPE_CACHE_DIR"
TASK_ENV = "MEDTPE_TASK"
FUZZ_EXAMPLES_ENV = "MEDTPE_FUZZ_EXAMPLES"
OTHER_VARIABLES: Mapping[str, str] = {
    CACHE_DIR_ENV: "where `.cache` lives (medtpe_core/paths.py)",
    TASKS_DIR_ENV: "a directory of extra task files (medtpe_core/tasks/)",
    TASK_ENV: "the default task of `medtpe evaluate` (MEDS-DEV's model.yaml sets it)",
    FUZZ_EXAMPLES_ENV: "examples per operation of the API contract test (tests/)",
}
"""The `MEDTPE_*` environment variables read outside these settings, with what they set."""


class ServiceSettings(BaseSettings):
    """Configuration of one service instance; any other `MEDTPE_*` environment variable than
    its fields' and `OTHER_VARIABLES` is refused (a misspelt setting is not ignored)."""

    model_config = SettingsConfigDict(
        env_prefix=ENV_PREFIX, extra="ignore", env_parse_none_str="none"
    )

    model_dir: Path = Field(
        default_factory=default_model_dir,
        description="Base Hugging Face checkpoint (the default one: `medtpe prepare-model`).",
    )
    artefact_dir: Path = Field(
        default_factory=default_artefact_dir, description="MedTPE artefact directory."
    )
    export_dir: Path = Field(
        default_factory=default_export_dir,
        description="Exported checkpoint (base + MedTPE rows) that vLLM loads in `medtpe` mode; "
        "written offline by `medtpe export` (missing or from another artefact: a start-up error).",
    )
    codes_dir: Path | None = Field(
        None,
        description="MEDS dataset root whose `metadata/codes.parquet` gives code descriptions "
        "for rendering (unset: the artefact directory's, if it has one).",
    )
    mode: Mode = Field("medtpe", description="`medtpe` or `original` (base tokenizer and model).")
    max_input_tokens: int = Field(
        8192,
        gt=0,
        description="Input budget in ORIGINAL-tokenizer tokens, prompt included; the newest "
        "events that fit are kept.",
    )
    allow_unvalidated_budget: bool = Field(
        False,
        description="Serve MedTPE at an input budget above those the artefact's fidelity gate "
        "passed at (its `manifest.json`), with a warning; false: such a start fails.",
    )
    window_policy: WindowPolicy = Field(
        WindowPolicy.SLIDING,
        description="Which events of a record over the budget the prompt shows: `sliding` (the "
        "newest that fit) or `stable` (a start on a grid that moves only when the record no "
        "longer fits, so hourly re-scores hit the prefix cache); medtpe_core/windowing.py.",
    )
    window_grid_hours: int = Field(
        DEFAULT_GRID_HOURS, ge=1, description="Grid of the `stable` window's start, in hours."
    )
    cache_salt_header: str | None = Field(
        None,
        description="Without API keys: the request header whose value keeps callers' cached "
        "prompt prefixes apart (e.g. `X-Tenant`); unset: one shared cache (service/tenancy.py).",
    )
    temperature: float = Field(0.0, ge=0.0, description="Default sampling temperature.")
    max_new_tokens: int = Field(64, gt=0, description="Tokens generated per answer at most.")
    max_n_samples: int = Field(9, gt=0, description="Largest `options.n_samples` accepted.")
    max_concurrency: int = Field(16, gt=0, description="Records generating at the same time.")
    queue_limit: int = Field(
        64, ge=0, description="Records waiting for a generation slot; beyond that, 503."
    )
    request_timeout_s: float = Field(
        300.0, gt=0, description="Generation deadline per request (queue wait included); 504."
    )
    max_request_bytes: int = Field(8 * 1024 * 1024, gt=0, description="Request body limit; 413.")
    api_keys: Annotated[list[str], NoDecode] = Field(
        default_factory=list,
        description="Comma-separated accepted API keys; empty turns authentication off.",
    )
    host: str = Field("0.0.0.0", description="Listen address of `medtpe serve`.")
    port: int = Field(8000, description="Listen port of `medtpe serve`.")
    kv_cache_gib: float | None = Field(
        4.0,
        gt=0,
        description="KV cache size in GiB (`none`: vLLM's default, a share of the device memory).",
    )
    seed: int = Field(0, description="Engine seed (sampling at temperature > 0).")
    enforce_eager: bool = Field(
        False,
        description="Skip torch.compile in the engine: starts about a minute sooner on CPU, "
        "decodes about 2x slower (tests).",
    )
    tensor_parallel_size: int = Field(
        1, gt=0, description="GPUs the model is split across (vLLM tensor parallelism)."
    )
    pipeline_parallel_size: int = Field(
        1, gt=0, description="Pipeline stages the model is split into (e.g. one per node)."
    )
    distributed_executor_backend: DistributedBackend | None = Field(
        None,
        description="How vLLM launches its workers for parallel runs: `mp` (one node), `ray` "
        "(several nodes), `uni`, `external_launcher`; unset: vLLM chooses.",
    )
    api_workers: int = Field(
        1,
        ge=1,
        description="API processes of `medtpe serve` in front of one engine: each reads, renders "
        "and tokenizes requests on its own core, all feed the same engine core; the concurrency "
        "and queue limits are shared out between them (service/api_processes.py).",
    )
    shutdown_grace_s: float = Field(
        60.0, gt=0, description="How long shutdown waits for in-flight requests to drain."
    )

    @field_validator("api_keys", mode="before")
    @classmethod
    def _split_keys(cls, value: object) -> object:
        """Accept `a,b,c` from the environment; separators or blanks without a key are refused
        (they would turn authentication off)."""
        if isinstance(value, str):
            keys = [key.strip() for key in value.split(",") if key.strip()]
            if value and not keys:
                raise ValueError(
                    f"{API_KEYS_ENV}={value!r} holds separators or blanks but no key; leave "
                    "it empty or unset to turn authentication off"
                )
            return keys
        return value

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

    def model(self) -> ModelConfig:
        """What to load and how to run the engine, from these settings."""
        return ModelConfig(
            model_dir=self.model_dir,
            artefact_dir=self.artefact_dir,
            export_dir=self.export_dir,
            mode=self.mode,
            codes_dir=self.codes_dir,
            max_input_tokens=self.max_input_tokens,
            max_new_tokens=self.max_new_tokens,
            windowing=Windowing(self.window_policy, self.window_grid_hours),
            engine=EngineOptions(
                max_num_seqs=self.max_concurrency,
                kv_cache_gib=self.kv_cache_gib,
                seed=self.seed,
                enforce_eager=self.enforce_eager,
                tensor_parallel_size=self.tensor_parallel_size,
                pipeline_parallel_size=self.pipeline_parallel_size,
                distributed_executor_backend=self.distributed_executor_backend,
            ),
        )

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


def known_variables() -> set[str]:
    """Every `MEDTPE_*` environment variable MedTPE reads: one per setting, and
    `OTHER_VARIABLES`."""
    fields = {f"{ENV_PREFIX}{name}".upper() for name in ServiceSettings.model_fields}
    return fields | set(OTHER_VARIABLES)
