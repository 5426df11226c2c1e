"""Service settings that would pass silently are start-up errors naming the setting: API keys
made only of separators, unknown (misspelt) `MEDTPE_*` variables."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from pydantic import ValidationError

from medtpe.core.paths import project_root
from medtpe.service.settings import (
    OTHER_VARIABLES,
    ServiceSettings,
    known_variables,
    setting_variables,
)


@pytest.fixture(autouse=True)
def clean_environment(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    """No `MEDTPE_*` variable of the caller's environment leaks into these tests."""
    for name in [n for n in os.environ if n.upper().startswith("MEDTPE_")]:
        monkeypatch.delenv(name)
    return monkeypatch


@pytest.mark.parametrize("value", [",", " , ", ",,", " ,\t, ", "  "])
def test_api_keys_of_separators_only_are_refused(
    clean_environment: pytest.MonkeyPatch, value: str
) -> None:
    clean_environment.setenv("MEDTPE_API_KEYS", value)
    with pytest.raises(
        ValidationError, match=r"MEDTPE_API_KEYS=.* holds separators or blanks but no key"
    ):
        ServiceSettings()


@pytest.mark.parametrize(("value", "keys"), [("", []), ("k1,,k2,", ["k1", "k2"])])
def test_api_keys_empty_or_with_keys(
    clean_environment: pytest.MonkeyPatch, value: str, keys: list[str]
) -> None:
    clean_environment.setenv("MEDTPE_API_KEYS", value)
    assert ServiceSettings().api_keys == keys


@pytest.mark.parametrize(
    ("name", "closest"),
    [
        ("MEDTPE_MAX_INPUT_TOKEN", "MEDTPE_MAX_INPUT_TOKENS"),
        ("MEDTPE_APIKEYS", "MEDTPE_API_KEYS"),
        ("medtpe_kv_cache", "MEDTPE_KV_CACHE_GIB"),
        ("MEDTPE_CACHEDIR", "MEDTPE_CACHE_DIR"),
    ],
)
def test_a_misspelt_variable_is_refused_naming_the_closest_setting(
    clean_environment: pytest.MonkeyPatch, name: str, closest: str
) -> None:
    clean_environment.setenv(name, "1")
    with pytest.raises(ValidationError) as refused:
        ServiceSettings()
    assert f"unknown environment variable {name}: did you mean {closest}?" in str(refused.value)


def test_a_variable_like_no_setting_is_refused(clean_environment: pytest.MonkeyPatch) -> None:
    clean_environment.setenv("MEDTPE_FOO", "1")
    with pytest.raises(ValidationError, match="unknown environment variable MEDTPE_FOO: no such"):
        ServiceSettings()


def test_every_setting_and_other_variable_is_accepted(
    clean_environment: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    for name in OTHER_VARIABLES:
        clean_environment.setenv(name, str(tmp_path))
    clean_environment.setenv("MEDTPE_MAX_INPUT_TOKENS", "2048")
    clean_environment.setenv("medtpe_mode", "original")  # names are not case-sensitive
    settings = ServiceSettings()
    assert (settings.max_input_tokens, settings.mode) == (2048, "original")
    assert set(setting_variables()) <= known_variables()
    assert "MEDTPE_LEDGER_OFF" in setting_variables() and "MEDTPE_LEDGER" not in known_variables()


_LITERAL = re.compile(r"""["'](MEDTPE_[A-Z0-9_]+)["']""")
_NAME = re.compile(r"\bMEDTPE_[A-Z0-9_]+\b")


def test_every_medtpe_variable_the_repository_names_is_known() -> None:
    """String literals in the Python packages, tests, benchmarks and research; every name in the
    docs, the image and the deployment files."""
    root = project_root()
    found: dict[str, str] = {}
    for package in ["medtpe", "tools", "tests"]:
        for path in (root / package).rglob("*.py"):
            if path == Path(__file__):  # names misspelt settings on purpose
                continue
            found.update((name, str(path)) for name in _LITERAL.findall(path.read_text()))
    for path in [
        root / "Dockerfile",
        root / "Makefile",
        root / "README.md",
        *(root / "docs").glob("*.md"),
        *(root / "deploy").rglob("*.y*ml"),
        *(root / "meds_dev").rglob("*"),
    ]:
        if path.is_file():
            found.update((name, str(path)) for name in _NAME.findall(path.read_text()))
    assert "MEDTPE_CACHE_DIR" in found and "MEDTPE_API_WORKERS" in found
    unknown = {name: where for name, where in found.items() if name not in known_variables()}
    assert not unknown


@pytest.mark.slow
def test_medtpe_serve_stops_on_a_misspelt_setting(clean_environment: pytest.MonkeyPatch) -> None:
    env = {n: v for n, v in os.environ.items() if not n.upper().startswith("MEDTPE_")}
    medtpe = Path(sys.executable).with_name("medtpe")
    out = subprocess.run(
        [str(medtpe), "serve"],
        env={**env, "MEDTPE_MAX_INPUT_TOKEN": "512"},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 1
    assert "Traceback" not in out.stderr
    assert "Error: invalid settings" in out.stderr
    assert "did you mean MEDTPE_MAX_INPUT_TOKENS?" in out.stderr


def test_every_setting_has_its_row_in_the_configuration_doc() -> None:
    """docs/configuration.md lists every `MEDTPE_*` setting (its table's first column)."""
    table = (project_root() / "docs" / "configuration.md").read_text()
    rows = set(re.findall(r"^\| `(MEDTPE_\w+)` \|", table, flags=re.M))
    settings = set(setting_variables())
    assert not settings - rows, sorted(settings - rows)


def test_the_ledger_settings_are_the_ledgers_read_strictly(
    clean_environment: pytest.MonkeyPatch,
) -> None:
    """The service holds the ledger's own settings object, read from the same variables (any
    case, `t` a boolean as for every other setting); a value the ledger refuses stops the start
    naming the variable, a `ledger_*` keyword replaces its variable."""
    clean_environment.setenv("medtpe_ledger_records", "store")
    clean_environment.setenv("MEDTPE_LEDGER_OFF", "t")
    settings = ServiceSettings()
    assert (settings.ledger.ledger_records, settings.ledger.ledger_off) == ("store", True)
    assert ServiceSettings(ledger_off=False).ledger.ledger_off is False
    clean_environment.setenv("MEDTPE_LEDGER_OFF", "maybe")
    with pytest.raises(ValidationError, match=r"MEDTPE_LEDGER_OFF='maybe': expected a boolean"):
        ServiceSettings()
    clean_environment.delenv("MEDTPE_LEDGER_OFF")
    clean_environment.setenv("MEDTPE_LEDGER_URL", "mysql://medtpe:s3cret@db/ledger")
    with pytest.raises(ValidationError) as refused:
        ServiceSettings()
    assert "MEDTPE_LEDGER_URL='mysql://***@db/ledger': expected sqlite:///PATH" in str(
        refused.value
    )
    assert "s3cret" not in str(refused.value)
    clean_environment.delenv("MEDTPE_LEDGER_URL")
    clean_environment.setenv("MEDTPE_LEDGER", "{}")  # the composed object is no variable
    with pytest.raises(ValidationError, match="unknown environment variable MEDTPE_LEDGER: did"):
        ServiceSettings()


def test_the_ledger_urls_password_is_a_secret_kept_out_of_the_repr(
    clean_environment: pytest.MonkeyPatch,
) -> None:
    settings = ServiceSettings(ledger_url="postgresql://medtpe:s3cret@db/ledger", ledger_off=True)
    assert "s3cret" in settings.secrets() and "s3cret" not in repr(settings)
    assert "ledger_url='postgresql://***@db/ledger'" in repr(settings)
