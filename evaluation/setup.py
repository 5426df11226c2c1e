"""What each mode loads, exactly as the service loads it (`service.model_setup.load_model`):
the original mode the base checkpoint, the medtpe mode the exported checkpoint (base + MedTPE
rows, exported when missing or stale), each with the service's `Predictor`."""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

from service.engine import EngineConfig
from service.model_setup import ModelIdentity, load_model
from service.pipeline import Predictor
from service.settings import ServiceSettings


@dataclass(frozen=True)
class ModeSetup:
    """One mode: the engine configuration, the prompt-to-answer pipeline and the model identity."""

    mode: str
    engine_config: EngineConfig
    predictor: Predictor
    identity: ModelIdentity


def mode_setup(
    mode: str,
    *,
    model_dir: Path,
    artefact_dir: Path,
    export_dir: Path,
    codes_dir: Path,
    max_input_tokens: int,
    max_new_tokens: int,
    kv_cache_gib: float,
    seed: int,
) -> ModeSetup:
    """The service's model set-up for `mode`, with automatic prefix caching turned off so that
    every record pays its full prefill, as a first request would."""
    settings = ServiceSettings(
        mode=mode,
        model_dir=model_dir,
        artefact_dir=artefact_dir,
        export_dir=export_dir,
        codes_dir=codes_dir,
        max_input_tokens=max_input_tokens,
        max_new_tokens=max_new_tokens,
        kv_cache_gib=kv_cache_gib,
        seed=seed,
    )
    loaded = load_model(settings)
    config = replace(loaded.engine_config, enable_prefix_caching=False)
    return ModeSetup(mode, config, loaded.predictor, loaded.identity)
