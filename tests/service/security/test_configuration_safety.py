"""Careless configuration does not pass silently: secrets never reach a log line whatever their
form (a Redis URL's password in its user information or its query, a PostgreSQL URL or
key=value DSN, API and metrics keys, the state store's MAC key, bearer tokens), the settings'
`repr` shows no key, a shared state store without its MAC key and a plain-http JWK Set URL are
refused at start (the latter unless it is on this machine)."""

from __future__ import annotations

import asyncio
import io
import json
import logging
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from pydantic import ValidationError

from medtpe.core.secret_masking import install_log_masking, mask_secrets
from medtpe.service.cds_hooks.state_store import RedisStore, StateUnavailable
from medtpe.service.settings import ServiceSettings

PASSWORD = "Str0ng-Pa55word"
KEY = "api-key-0123456789"
SCRAPE = "scrape-token-98765"
STATE_KEY = "state-key-0123456789abcdef0123456789"


@pytest.fixture
def clean_environment(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    """No `MEDTPE_*` variable of the caller's environment leaks into the settings."""
    for name in [n for n in os.environ if n.upper().startswith("MEDTPE_")]:
        monkeypatch.delenv(name)
    return monkeypatch


@pytest.fixture
def log() -> Iterator[io.StringIO]:
    """What the `medtpe` loggers write, as a handler of the process would see it."""
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(logging.Formatter("%(levelname)s %(name)s %(message)s"))
    logger = logging.getLogger("medtpe")
    logger.addHandler(handler)
    level = logger.level
    logger.setLevel(logging.INFO)
    try:
        yield stream
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)


@pytest.mark.parametrize(
    "text",
    [
        f"redis://:{PASSWORD}@store:6379/0",
        f"rediss://medtpe:{PASSWORD}@store:6380/1",
        f"redis://store:6379/0?password={PASSWORD}",
        f"redis://store/0?db=0&password={PASSWORD}&ssl=true",
        f"postgresql+psycopg://ledger:{PASSWORD}@db:5432/ledger?sslmode=require",
        f"host=db port=5432 user=ledger password={PASSWORD} dbname=ledger",
        f'{{"url": "https://x", "client_secret": "{PASSWORD}"}}',
        f"Authorization: Bearer {PASSWORD}",
        f"X-API-Key: {PASSWORD}",
        f"https://fhir.example/token?access_token={PASSWORD}",
    ],
)
def test_every_form_of_a_secret_is_masked(text: str) -> None:
    masked = mask_secrets(text)
    assert PASSWORD not in masked and "***" in masked
    assert masked.startswith(text[:8])  # what surrounds the secret stays readable


def test_text_without_secrets_is_unchanged() -> None:
    for text in ("https://jwks.example.org/keys", "ready: /data/model", "password reset failed"):
        assert mask_secrets(text) == text


def test_every_log_line_of_the_service_is_masked(clean_environment, log: io.StringIO) -> None:
    """The settings' secrets registered as the app does (`create_app`): a line quoting a
    password or key on its own, a URL, an exception's text, all masked."""
    settings = ServiceSettings(
        state_url=f"redis://:{PASSWORD}@store:6379/0",
        state_key=STATE_KEY,
        api_keys=[KEY],
        metrics_keys=[SCRAPE],
    )
    install_log_masking(settings.secrets())
    logger = logging.getLogger("medtpe.service")
    logger.info("state store %s", settings.state_url)
    logger.warning("AUTH failed: WRONGPASS invalid password %s for the default user", PASSWORD)
    logger.info("keys %s, %s and %s", KEY, SCRAPE, STATE_KEY)
    try:
        raise ConnectionError(f"cannot reach redis://:{PASSWORD}@store:6379/0")
    except ConnectionError:
        logger.exception("start-up failed")
    written = log.getvalue()
    assert written.count("\n") >= 5 and "ConnectionError" in written
    for secret in (PASSWORD, KEY, SCRAPE, STATE_KEY):
        assert secret not in written
    assert "redis://***@store:6379/0" in written


def test_uvicorn_access_lines_keep_their_arguments(clean_environment) -> None:
    """uvicorn's access formatter unpacks a record's five arguments: masking keeps them (and
    masks a secret among them), so every request's access line is written."""
    from uvicorn.logging import AccessFormatter

    install_log_masking([PASSWORD])
    path = f"/x?token={PASSWORD}"
    record = logging.getLogger("uvicorn.access").makeRecord(
        "uvicorn.access",
        logging.INFO,
        __file__,
        1,
        '%s - "%s %s HTTP/%s" %d',
        ("127.0.0.1:5000", "GET", path, "1.1", 200),
        None,
    )
    line = AccessFormatter("%(client_addr)s %(request_line)s %(status_code)s").format(record)
    assert line == "127.0.0.1:5000 GET /x?token=*** HTTP/1.1 200 OK"
    assert PASSWORD not in line


def test_a_state_store_outage_is_logged_without_its_password(
    clean_environment, log: io.StringIO
) -> None:
    """A real client to a closed port, the password in the URL's query: the warning of the
    outage names the store, never the password."""
    url = f"redis://127.0.0.1:1/0?password={PASSWORD}"
    install_log_masking(ServiceSettings(state_url=url, state_key=STATE_KEY).secrets())
    store = RedisStore(url, timeout_s=0.5)

    async def claim() -> None:
        try:
            with pytest.raises(StateUnavailable):
                await store.claim("k", 1.0)
        finally:
            await store.aclose()

    asyncio.run(claim())
    written = log.getvalue()
    assert "unavailable" in written and "127.0.0.1:1" in written
    assert PASSWORD not in written


def test_the_settings_repr_shows_no_secret(clean_environment) -> None:
    settings = ServiceSettings(
        state_url=f"redis://store/0?password={PASSWORD}",
        state_key=STATE_KEY,
        api_keys=[KEY],
        metrics_keys=[SCRAPE],
    )
    shown = repr(settings) + str(settings)
    assert "state_url=" in shown
    for secret in (PASSWORD, KEY, SCRAPE, STATE_KEY):
        assert secret not in shown


def test_a_shared_state_store_needs_a_mac_key_of_32_characters(clean_environment) -> None:
    """Whoever writes to a shared store could forge scores the service signs: its entries are
    authenticated with `MEDTPE_STATE_KEY`, which the start requires with the store's URL."""
    with pytest.raises(ValidationError, match="MEDTPE_STATE_KEY is unset"):
        ServiceSettings(state_url="redis://store:6379/0")
    with pytest.raises(ValidationError, match="at least 32 characters"):
        ServiceSettings(state_url="redis://store:6379/0", state_key="short")
    assert ServiceSettings(state_url="redis://store:6379/0", state_key=STATE_KEY).state_key
    assert ServiceSettings().state_key is None  # in memory: drawn when the instance starts


def _issuers(jwks_url: str) -> dict[str, object]:
    return {"https://ehr.example": {"jwks_url": jwks_url, "fhir_servers": "*"}}


@pytest.mark.parametrize(
    "jwks_url", ["http://ehr.example/jwks", "http://10.0.0.5/jwks", "http://ehr.example:443/k"]
)
def test_a_plain_http_jwk_set_url_is_refused(clean_environment, jwks_url: str) -> None:
    with pytest.raises(ValidationError) as refused:
        ServiceSettings(cds_issuers=_issuers(jwks_url), cds_base_url="https://cds.example")
    message = str(refused.value)
    assert "MEDTPE_CDS_ISSUERS" in message and "https://" in message
    assert "'https://ehr.example'" in message  # the issuer named


@pytest.mark.parametrize(
    "jwks_url",
    [
        "https://ehr.example/jwks",
        "http://127.0.0.1:8080/jwks",
        "http://localhost/j",
        "http://[::1]/j",
    ],
)
def test_an_https_or_loopback_jwk_set_url_is_accepted(clean_environment, jwks_url: str) -> None:
    settings = ServiceSettings(cds_issuers=_issuers(jwks_url), cds_base_url="https://cds.example")
    assert str(next(iter(settings.cds_issuers.values())).jwks_url).startswith(jwks_url[:12])


def test_the_environment_form_is_refused_too(clean_environment) -> None:
    clean_environment.setenv("MEDTPE_CDS_ISSUERS", json.dumps(_issuers("http://ehr.example/k")))
    clean_environment.setenv("MEDTPE_CDS_BASE_URL", "https://cds.example")
    with pytest.raises(ValidationError, match="must be https://"):
        ServiceSettings()


@pytest.mark.slow
def test_medtpe_serve_refuses_a_plain_http_jwk_set_naming_no_secret() -> None:
    """The real start: it stops with the issuer named, and its message quotes neither the API
    key nor the state store's password it was given."""
    env = {n: v for n, v in os.environ.items() if not n.upper().startswith("MEDTPE_")}
    env |= {
        "MEDTPE_CDS_ISSUERS": json.dumps(_issuers("http://ehr.example/jwks")),
        "MEDTPE_CDS_BASE_URL": "https://cds.example",
        "MEDTPE_API_KEYS": KEY,
        "MEDTPE_STATE_URL": f"redis://:{PASSWORD}@store:6379/0",
        "MEDTPE_STATE_KEY": STATE_KEY,
    }
    medtpe = Path(sys.executable).with_name("medtpe")
    out = subprocess.run(
        [str(medtpe), "serve"], env=env, capture_output=True, text=True, timeout=300
    )
    assert out.returncode == 1 and "Traceback" not in out.stderr
    assert "MEDTPE_CDS_ISSUERS" in out.stderr and "must be https://" in out.stderr
    for secret in (KEY, PASSWORD, STATE_KEY):
        assert secret not in out.stdout + out.stderr
