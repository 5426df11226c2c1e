"""One default per model or engine option: the service settings, the options of `medtpe predict`,
`evaluate` and `render` and the build's fidelity gate take theirs from the one declaration
(`ModelConfig.declared`: the fields of `ModelConfig`, `EngineOptions` and `Windowing`)."""

from __future__ import annotations

import os
from dataclasses import fields
from pathlib import Path

import click
import pytest

from medtpe.cli.evaluation_commands import evaluate
from medtpe.cli.meds_commands import render
from medtpe.cli.options import MODEL_OPTION_FLAGS, model_files
from medtpe.cli.predict_commands import predict
from medtpe.inference.engines.protocol import EngineOptions
from medtpe.inference.model import ModelConfig
from medtpe.service.settings import ENV_PREFIX, ServiceSettings
from medtpe.training.build_artefact import gate_model
from medtpe.training.build_config import BuildConfig
from medtpe.training.pseudo_labels import BUILD_KV_CACHE_GIB


@pytest.fixture(autouse=True)
def clean_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """No `MEDTPE_*` variable of the caller's environment changes a default."""
    for name in [n for n in os.environ if n.upper().startswith(ENV_PREFIX)]:
        monkeypatch.delenv(name)


def command_defaults(command: click.Command) -> dict[str, object]:
    """The defaults of a command's model and engine options, by option name."""
    parameters = {parameter.name: parameter for parameter in command.params}
    return {
        name: parameters[parameter].default
        for name, (_, parameter, _, _) in MODEL_OPTION_FLAGS.items()
        if parameter in parameters
    }


def test_the_service_settings_default_to_the_declared_model() -> None:
    settings = ServiceSettings()
    assert settings.model() == ModelConfig()
    assert (settings.max_input_tokens, settings.kv_cache_gib, settings.seed) == (8192, 4.0, 0)


@pytest.mark.parametrize(
    ("command", "options"),
    [
        (
            predict,
            {"mode", "max_input_tokens", "max_new_tokens", "max_num_seqs", "kv_cache_gib"}
            | {"enforce_eager", "dtype", "seed", "model_dir", "artefact_dir", "export_dir"}
            | {"prompt_layout"},
        ),
        (
            evaluate,
            {"max_input_tokens", "max_new_tokens", "window_policy", "window_grid_hours"}
            | {"kv_cache_gib", "seed", "dtype", "enforce_eager", "model_dir", "artefact_dir"}
            | {"export_dir", "prompt_layout"},
        ),
        (render, {"max_input_tokens"}),
    ],
)
def test_command_defaults_are_the_declared_ones(command: click.Command, options: set[str]) -> None:
    defaults = command_defaults(command)
    if command is evaluate:  # its --mode picks the modes compared (default both), no ModelConfig's
        del defaults["mode"]
    assert set(defaults) == options
    settings = ServiceSettings()
    for name, default in defaults.items():
        declared = ModelConfig.declared(name)
        if declared.factory is not None:  # a path: not given means the declared default
            assert default is None
        else:
            assert default == declared.default, name
        setting = MODEL_OPTION_FLAGS[name][3]
        if setting is not None:  # the service setting of the same fact agrees
            assert getattr(settings, setting.lower()) == declared.value(), name


def test_paths_not_given_are_the_declared_defaults() -> None:
    assert ModelConfig.from_options(**model_files(None, None, None)) == ModelConfig()
    given = model_files(Path("/m"), None, Path("/e"))
    assert given == {"model_dir": Path("/m"), "export_dir": Path("/e")}


def test_an_unknown_option_is_refused() -> None:
    with pytest.raises(TypeError, match="no model or engine option named kv_cache"):
        ModelConfig.from_options(kv_cache=1.0)


def test_the_build_gate_differs_from_serving_only_where_it_says(tmp_path: Path) -> None:
    """The gate passes its KV cache (beside training), seed, eager engine and dtype (float32:
    the rows' own error on any machine) explicitly; every other option, the budget included,
    is serving's."""
    config = BuildConfig(
        base=tmp_path / "base", meds=tmp_path / "meds", out=tmp_path / "out", length_mix=(8192,)
    )
    gate = gate_model(config, tmp_path / "artefact", tmp_path / "export")
    serving = ServiceSettings().model()
    differ = {
        f.name for f in fields(ModelConfig) if getattr(gate, f.name) != getattr(serving, f.name)
    }
    assert differ == {"model_dir", "artefact_dir", "export_dir", "codes_dir", "engine"}
    engine_differ = {
        f.name
        for f in fields(EngineOptions)
        if getattr(gate.engine, f.name) != getattr(serving.engine, f.name)
    }
    assert engine_differ == {"kv_cache_gib", "seed", "enforce_eager", "log_stats", "dtype"}
    assert (gate.engine.dtype, serving.engine.dtype) == ("float32", "auto")
    assert gate.engine.kv_cache_gib == BUILD_KV_CACHE_GIB < serving.engine.kv_cache_gib
    assert config.serving_budgets == (serving.max_input_tokens,)
