"""`medtpe.core.rope_stretch`: the config.json entry of a stretched RoPE, what it refuses, and
transformers' warnings about it silenced."""

from __future__ import annotations

import logging

import pytest

from medtpe.core.rope_stretch import (
    STRETCH_WARNINGS,
    TRANSFORMERS_ROPE_LOGGER,
    StretchWarningFilter,
    quiet_stretch_warnings,
    stretched_rope,
)

PLAIN = {"rope_theta": 100000.0, "rope_type": "default"}


@pytest.mark.parametrize("stretch", [1.05, 1.88, 2.0, 3.5])
def test_the_stretch_is_yarn_with_the_ramp_of_the_models_own_context(stretch: float) -> None:
    entry = stretched_rope(PLAIN, 8192, stretch)
    assert entry["rope_type"] == "yarn"
    assert entry["factor"] == pytest.approx(1 / stretch)
    original = entry["original_max_position_embeddings"]
    # the ramp's ends (original length / beta) are those of the model's 8,192, exactly
    assert (original / entry["beta_fast"], original / entry["beta_slow"]) == (8192 / 32, 8192 / 1)
    assert original * entry["factor"] >= 8192  # vLLM's cos/sin cache covers the whole context
    assert entry["rope_theta"] == PLAIN["rope_theta"]
    assert PLAIN["rope_type"] == "default"  # the model's own entry is left as it was


@pytest.mark.parametrize("stretch", [1.0, 0.5])
def test_a_stretch_must_lengthen(stretch: float) -> None:
    with pytest.raises(ValueError, match="more than 1"):
        stretched_rope(PLAIN, 8192, stretch)


def test_an_already_scaled_rope_is_refused() -> None:
    with pytest.raises(ValueError, match="already 'llama3'"):
        stretched_rope({**PLAIN, "rope_type": "llama3", "factor": 8.0}, 131072, 1.5)


def test_transformers_stretch_warnings_are_dropped_and_no_other() -> None:
    """transformers warns twice of a stretched entry at every config load (a factor below 1, an
    original length that does not imply it); the filter drops those two, nothing else."""
    from transformers import LlamaConfig

    logger = logging.getLogger(TRANSFORMERS_ROPE_LOGGER)
    records: list[logging.LogRecord] = []
    handler = logging.Handler()
    handler.emit = records.append  # type: ignore[method-assign]
    # what transformers emits, whatever this process set before (the vLLM plugin's filter, a
    # verbosity)
    installed, level = list(logger.filters), logger.level
    for installed_filter in installed:
        logger.removeFilter(installed_filter)
    logger.setLevel(logging.WARNING)
    logger.addHandler(handler)
    try:
        # a stretch of this test's own: transformers says the second warning once per message
        # and process (`warning_once`), and the process may have loaded an export before
        entry = stretched_rope(PLAIN, 4096, 2.345)
        LlamaConfig(max_position_embeddings=4096, rope_parameters=entry)
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)
        for installed_filter in installed:
            logger.addFilter(installed_filter)
    stretch_filter = StretchWarningFilter()
    assert len(records) == len(STRETCH_WARNINGS)
    assert not any(stretch_filter.filter(record) for record in records)
    other = logging.LogRecord(TRANSFORMERS_ROPE_LOGGER, logging.WARNING, "", 0, "got 2.0", (), None)
    assert stretch_filter.filter(other)
    quiet_stretch_warnings()
    quiet_stretch_warnings()
    assert [type(f) for f in logger.filters].count(StretchWarningFilter) == 1
    registered = logger.filters[-1]
    if registered not in installed:  # leave the process as it was
        logger.removeFilter(registered)
