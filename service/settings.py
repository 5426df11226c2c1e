"""Service settings, read from the environment (prefix `MEDTPE_`); docs/configuration.md lists them.

Every setting has a default, so `medtpe serve` runs the default model with the default artefact
without any configuration.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Annotated

from pydantic import Field, field_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from inference.engine import DistributedBackend, EngineOptions
from inference.model import ModelConfig
from inference.predictor import Mode
from medtpe_core.paths import default_artefact_dir, default_export_dir, default_model_dir
from medtpe_core.windowing import DEFAULT_GRID_HOURS, Windowing, WindowPolicy


class ServiceSettings(BaseSettings):
    """Configuration of one service instance."""

    model_config = SettingsConfigDict(
        env_prefix="MEDTPE_", extra="ignore", env_parse_none_str="none"
    )

    model_dir: Path = Field(
        default_factory=default_model_dir,
        description="Base Hugging Face checkpoint (prepared on first start if it is the default).",
    )
    artefact_dir: Path = Field(
        default_factory=default_artefact_dir, description="MedTPE artefact directory."
    )
    export_dir: Path = Field(
        default_factory=default_export_dir,
        description="Exported checkpoint (base + MedTPE rows) that vLLM loads in `medtpe` mode; "
        "written on first start when missing or built from another artefact.",
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
        """Accept `a,b,c` from the environment."""
        if isinstance(value, str):
            return [key.strip() for key in value.split(",") if key.strip()]
        return value

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
