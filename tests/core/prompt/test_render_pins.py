"""The columnar renderer writes byte for byte what the per-event renderer wrote: the same text,
token count, ids and events kept, per record and budget (pins recorded before the rewrite by
`tests/support/render_pins.py`), on the project's fixture records and every ICU record of the shared
MEDS data."""

from __future__ import annotations

import json

import pytest

from tests.support.render_pins import (
    PINS_FILE,
    SHARED_MEDS,
    SHARED_PINS_FILE,
    compute_fixture_pins,
    compute_shared_pins,
)


def _diff(expected: dict, actual: dict) -> list[str]:
    return [
        f"{record} {key}: {actual.get(record, {}).get(key)} != {pin}"
        for record, pins in expected.items()
        for key, pin in pins.items()
        if actual.get(record, {}).get(key) != pin
    ]


def test_fixture_records_render_as_pinned():
    expected = json.loads(PINS_FILE.read_text())
    actual = compute_fixture_pins()
    assert actual.keys() == expected.keys()
    assert _diff(expected, actual) == []


@pytest.mark.skipif(
    not SHARED_MEDS.is_dir(), reason=f"the shared MEDS data ({SHARED_MEDS}) is not on this machine"
)
@pytest.mark.slow
def test_every_shared_icu_record_renders_as_pinned():
    expected = json.loads(SHARED_PINS_FILE.read_text())
    actual = compute_shared_pins(SHARED_MEDS)
    assert len(expected) == 93
    assert actual.keys() == expected.keys()
    assert _diff(expected, actual) == []
