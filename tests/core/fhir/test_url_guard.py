"""The one rule of the FHIR clients for where an access token may go
(medtpe/core/fhir/url_guard.py): a table of URLs, each allowed or refused with its reason, for the
transport (HTTPS; plain HTTP never, to the loopback, or anywhere), the batch's scope (the FHIR
server's origin) and the hook's (under its base URL's path); both parsers (urllib's and httpx's)
give the same parts of the URLs the clients request."""

from __future__ import annotations

import re

import httpx
import pytest

from medtpe.core.fhir.url_guard import PlainHttp, Refusal, TokenScope, Url, transport_refusal
from medtpe.service.cds_hooks.fhir_fetch import url_parts

BASE = "https://ehr.example/fhir/r4"

TRANSPORT = [
    ("https://ehr.example/fhir", PlainHttp.NEVER, None),
    ("https://ehr.example/fhir", PlainHttp.LOOPBACK, None),
    ("http://ehr.example/fhir", PlainHttp.NEVER, Refusal.PLAIN_HTTP),
    ("http://ehr.example/fhir", PlainHttp.LOOPBACK, Refusal.PLAIN_HTTP),
    ("http://ehr.example/fhir", PlainHttp.ANY, None),
    ("http://127.0.0.1:8080/fhir", PlainHttp.LOOPBACK, None),
    ("http://LOCALHOST/fhir", PlainHttp.LOOPBACK, None),
    ("http://[::1]:8080/fhir", PlainHttp.LOOPBACK, None),
    ("http://127.0.0.1:8080/fhir", PlainHttp.NEVER, Refusal.PLAIN_HTTP),  # the hook's own host
    ("http://127.0.0.2/fhir", PlainHttp.LOOPBACK, Refusal.PLAIN_HTTP),
    ("http://localhost.ehr.example/fhir", PlainHttp.LOOPBACK, Refusal.PLAIN_HTTP),
    ("ftp://ehr.example/fhir", PlainHttp.ANY, Refusal.NOT_HTTP),
    ("file:///etc/passwd", PlainHttp.ANY, Refusal.NOT_HTTP),
    ("/fhir/Patient", PlainHttp.ANY, Refusal.NOT_HTTP),
]


@pytest.mark.parametrize(("url", "plain_http", "refusal"), TRANSPORT)
def test_the_transport_is_https_or_plain_http_as_the_client_allows(
    url: str, plain_http: PlainHttp, refusal: Refusal | None
) -> None:
    assert transport_refusal(Url.split(url), plain_http) == refusal
    assert transport_refusal(url_parts(httpx.URL(url)), plain_http) == refusal


SCOPES = [
    # (url, refusal on the base's origin (batch), refusal under the base's path (hook))
    (f"{BASE}/Patient/1", None, None),
    (BASE, None, None),
    (f"{BASE}/", None, None),
    ("https://EHR.example:443/fhir/r4/Observation?patient=1", None, None),
    ("https://ehr.example/bulk/files/Patient.ndjson", None, Refusal.OUTSIDE_BASE),
    ("https://ehr.example/fhir/r4x/Patient", None, Refusal.OUTSIDE_BASE),
    ("https://ehr.example/fhir/r4/%2e%2E/admin", None, Refusal.DOT_SEGMENT),
    ("https://ehr.example/fhir/r4/%2E/Patient", None, Refusal.DOT_SEGMENT),
    ("https://ehr.example:8443/fhir/r4/Patient", Refusal.OTHER_ORIGIN, Refusal.OTHER_ORIGIN),
    ("http://ehr.example/fhir/r4/Patient", Refusal.OTHER_ORIGIN, Refusal.OTHER_ORIGIN),
    ("https://files.example/fhir/r4/Patient", Refusal.OTHER_ORIGIN, Refusal.OTHER_ORIGIN),
    ("https://ehr.example.evil/fhir/r4", Refusal.OTHER_ORIGIN, Refusal.OTHER_ORIGIN),
    ("https://ehr.example@evil.example/fhir/r4", Refusal.USER_INFO, Refusal.USER_INFO),
    ("https://user:pw@ehr.example/fhir/r4", Refusal.USER_INFO, Refusal.USER_INFO),
    ("ftp://ehr.example/fhir/r4", Refusal.NOT_HTTP, Refusal.NOT_HTTP),
    ("Patient/1", Refusal.NOT_HTTP, Refusal.NOT_HTTP),
]


@pytest.mark.parametrize(("url", "on_origin", "under_base"), SCOPES)
def test_the_token_goes_to_the_servers_origin_or_under_its_base(
    url: str, on_origin: Refusal | None, under_base: Refusal | None
) -> None:
    for parse in (Url.split, lambda text: url_parts(httpx.URL(text))):
        base = parse(BASE)
        assert TokenScope.on_origin(base).refusal(parse(url)) == on_origin
        assert TokenScope.under_base(base).refusal(parse(url)) == under_base
        assert TokenScope.under_base(base).admits(parse(url)) is (under_base is None)


@pytest.mark.parametrize(
    ("base", "refusal"),
    [
        ("https://user@ehr.example/fhir", Refusal.USER_INFO),
        ("https://ehr.example/fhir?x=1", Refusal.BASE_WITH_QUERY),
        ("https://ehr.example/fhir#top", Refusal.BASE_WITH_QUERY),
        ("https://ehr.example/fhir/%2E%2e/admin", Refusal.DOT_SEGMENT),
        ("ftp://ehr.example/fhir", Refusal.NOT_HTTP),
        ("https:///fhir", Refusal.NOT_HTTP),
    ],
)
def test_a_base_url_with_more_than_a_server_and_a_path_is_refused(
    base: str, refusal: Refusal
) -> None:
    with pytest.raises(ValueError, match=f"^{re.escape(refusal.value)}$"):
        TokenScope.under_base(Url.split(base))


def test_the_origin_fills_in_the_default_port_and_lower_cases_the_host() -> None:
    assert Url.split("HTTPS://EHR.Example/fhir").origin() == ("https", "ehr.example", 443)
    assert Url.split("http://ehr.example:0/").origin() == ("http", "ehr.example", 0)
    assert url_parts(httpx.URL("http://EHR.example/")).origin() == ("http", "ehr.example", 80)
    with pytest.raises(ValueError, match=re.escape(Refusal.NOT_HTTP.value)):
        Url.split("mailto:someone@ehr.example").origin()
