"""The ledger's settings from the environment, and `medtpe ledger upgrade|public-key`."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from medtpe.cli.main import cli
from medtpe.ledger.migrate import head
from medtpe.ledger.settings import LedgerSettings
from tests.support.ledger_rows import RFC8037_SEED_B64, RFC8037_THUMBPRINT


def test_the_settings_read_the_environment_and_default_to_a_local_sqlite_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MEDTPE_CACHE_DIR", str(tmp_path))
    default = LedgerSettings.from_environ({})
    assert default.ledger_url == f"sqlite:///{tmp_path / 'ledger.sqlite3'}"
    assert (default.ledger_records, default.ledger_off) == ("digest", False)
    given = LedgerSettings.from_environ(
        {
            "MEDTPE_LEDGER_URL": "postgresql://db/ledger",
            "MEDTPE_LEDGER_RECORDS": "store",
            "MEDTPE_LEDGER_SIGNING_KEY": RFC8037_SEED_B64,
            "MEDTPE_LEDGER_OFF": "true",
        }
    )
    assert (given.ledger_records, given.ledger_off) == ("store", True)
    assert given.signer().key_id == RFC8037_THUMBPRINT
    assert RFC8037_SEED_B64 not in repr(given)
    with pytest.raises(ValueError, match="MEDTPE_LEDGER_RECORDS='all': expected digest or store"):
        LedgerSettings.from_environ({"MEDTPE_LEDGER_RECORDS": "all"})
    assert "PHI" in LedgerSettings.declared("ledger_records").help


def test_the_commands_upgrade_the_ledger_and_print_its_public_key(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MEDTPE_CACHE_DIR", str(tmp_path))
    done = CliRunner().invoke(cli, ["ledger", "upgrade"])
    assert done.exit_code == 0, done.output
    assert f"ledger at schema {head()} (newest: {head()})" in done.output
    assert (tmp_path / "ledger.sqlite3").is_file()
    jwk = json.loads(CliRunner().invoke(cli, ["ledger", "public-key"]).output)
    assert (jwk["kty"], jwk["crv"]) == ("OKP", "Ed25519")
    monkeypatch.setenv("MEDTPE_LEDGER_URL", "postgresql://nobody@127.0.0.1:1/none")
    refused = CliRunner().invoke(cli, ["ledger", "public-key"])
    assert refused.exit_code == 1 and "MEDTPE_LEDGER_SIGNING_KEY is required" in refused.output
    down = CliRunner().invoke(cli, ["ledger", "upgrade"])
    assert down.exit_code == 1 and "the ledger cannot be opened" in down.output


@pytest.mark.parametrize(
    ("variable", "value", "expected"),
    [
        ("MEDTPE_LEDGER_OFF", "maybe", "expected a boolean (true/false, 1/0, yes/no, on/off"),
        ("MEDTPE_LEDGER_OFF", " true", "expected a boolean"),
        ("MEDTPE_LEDGER_URL", "ledger.sqlite3", "expected sqlite:///PATH or postgresql://"),
        ("MEDTPE_LEDGER_URL", "mysql://db/ledger", "expected sqlite:///PATH or postgresql://"),
        ("MEDTPE_LEDGER_RECORDS", "all", "expected digest or store"),
    ],
)
def test_a_value_the_ledger_does_not_accept_is_an_error_naming_its_variable(
    variable: str, value: str, expected: str
) -> None:
    with pytest.raises(ValueError) as refused:
        LedgerSettings.from_environ({variable: value})
    assert str(refused.value).startswith(f"{variable}={value!r}: ") and expected in str(
        refused.value
    )


def test_booleans_read_as_every_settings_and_names_in_any_case() -> None:
    for text, value in [("t", True), ("YES", True), ("on", True), ("0", False), ("Off", False)]:
        assert LedgerSettings.from_environ({"MEDTPE_LEDGER_OFF": text}).ledger_off is value
    read = LedgerSettings.from_environ(
        {"medtpe_ledger_url": "postgresql://db/ledger", "MEDTPE_LEDGER_SIGNING_KEY": "none"}
    )
    assert (read.ledger_url, read.ledger_signing_key) == ("postgresql://db/ledger", None)
    assert LedgerSettings.from_environ({"MEDTPE_LEDGER_OFF": ""}).ledger_off is False
    given = LedgerSettings.from_environ(
        {"MEDTPE_LEDGER_URL": "postgresql://db/a"}, ledger_url="sqlite:///b.sqlite3"
    )
    assert given.ledger_url == "sqlite:///b.sqlite3"


def test_a_password_in_the_url_is_masked_where_the_settings_are_shown() -> None:
    settings = LedgerSettings("postgresql://medtpe:s3cret@db/ledger", "digest", RFC8037_SEED_B64)
    assert "s3cret" not in repr(settings) and RFC8037_SEED_B64 not in repr(settings)
    assert {"s3cret", RFC8037_SEED_B64} <= set(settings.secrets())
    with pytest.raises(ValueError) as refused:
        LedgerSettings("mysql://medtpe:s3cret@db/ledger")
    assert "s3cret" not in str(refused.value) and "mysql://***@db/ledger" in str(refused.value)


def test_a_command_stops_on_a_ledger_variable_it_refuses(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MEDTPE_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("MEDTPE_LEDGER_RECORDS", "all")
    refused = CliRunner().invoke(cli, ["ledger", "upgrade"])
    assert refused.exit_code == 1 and "Traceback" not in refused.output
    assert "Error: MEDTPE_LEDGER_RECORDS='all': expected digest or store" in refused.output
    assert not (tmp_path / "ledger.sqlite3").exists()
