"""The Bulk Data client and SMART Backend Services (`medtpe.batch.bulk_client`,
`medtpe.batch.smart_backend`) against a local Bulk Data server over real HTTP
(tests/support/bulk_server.py): kick-off at each level with `_type` and `_since`, polling, downloads
resumed, the server's errors and retries, and where the access token goes."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from cryptography.hazmat.primitives.asymmetric import ec, rsa

from medtpe.batch.bulk_client import (
    STATE_FILE,
    ExportFailedError,
    ExportRequest,
    ServerAccess,
    export_from_server,
)
from medtpe.batch.fhir_export import MANIFEST, export_files, patient_bundles
from medtpe.batch.fhir_http import FhirServerError
from medtpe.batch.ndjson_lines import read_lines
from medtpe.batch.smart_backend import KEY_ENV, ClientKey, SmartAuthError, public_jwks
from medtpe.cli.predict_commands import fhir_source
from tests.support.bulk_server import (
    BULK_CLIENT,
    BulkServer,
    es384_key,
    fast_export,
    heart_rate,
    pem,
    server_access,
    serving_bulk_data,
)

FAST = fast_export(retries=3)


def patient(number: int, updated: str) -> list[dict[str, Any]]:
    """A Patient and one Observation of theirs, last updated at `updated`."""
    meta = {"lastUpdated": updated}
    return [
        {"resourceType": "Patient", "id": f"p{number}", "birthDate": "2100-01-01", "meta": meta},
        heart_rate(f"o{number}", f"p{number}", 80 + number) | {"meta": meta},
    ]


@pytest.fixture(scope="module")
def es_key() -> ClientKey:
    return es384_key()


@pytest.fixture(scope="module")
def rsa_key() -> ClientKey:
    return ClientKey.from_pem(
        pem(rsa.generate_private_key(public_exponent=65537, key_size=2048)), kid="rsa-1"
    )


@pytest.fixture
def server(es_key: ClientKey, rsa_key: ClientKey) -> Iterator[BulkServer]:
    resources = [r for n in range(4) for r in patient(n, f"2026-11-2{n}T00:00:00Z")]
    by_type: dict[str, list[dict[str, Any]]] = {}
    for resource in resources:
        by_type.setdefault(resource["resourceType"], []).append(resource)
    by_type["Practitioner"] = [{"resourceType": "Practitioner", "id": "dr"}]
    bulk = BulkServer(
        by_type,
        groups={"icu": ["p1", "p2"], "broken": ["p0"]},
        clients={BULK_CLIENT: public_jwks(es_key, rsa_key)},
        fail_group="broken",
    )
    with serving_bulk_data(bulk) as served:
        yield served


def access(server: BulkServer, key: ClientKey, tmp_path: Path) -> ServerAccess:
    return server_access(server, BULK_CLIENT, key, tmp_path)


def exported_ids(directory: Path) -> dict[str, list[str]]:
    ids: dict[str, list[str]] = {}
    for file in export_files(directory):
        rows = [text for _, text in read_lines(file.path)]
        ids[str(file.resource_type)] = [json.loads(row)["id"] for row in rows]
    return ids


def test_a_group_export_with_type_and_since_through_backend_services(
    server: BulkServer, es_key: ClientKey, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    server.polls = 2
    request = ExportRequest(
        level="group", group="icu", types=("Patient", "Observation"), since="2026-11-22"
    )
    result = export_from_server(
        access(server, es_key, tmp_path), request, tmp_path / "export", FAST, progress=False
    )
    # Group/icu holds p1 and p2; only p2 changed since the 22nd
    assert exported_ids(tmp_path / "export") == {"Patient": ["p2"], "Observation": ["o2"]}
    assert result.resources == {"Observation": 1, "Patient": 1} and not result.resumed
    manifest = json.loads((tmp_path / "export" / MANIFEST).read_text())
    assert manifest["transactionTime"] == "2026-11-27T02:00:00Z"
    assert {o["url"] for o in manifest["output"]} == {
        "Patient.000.ndjson",
        "Observation.000.ndjson",
    }

    (kick_off,) = [r for r in server.requests if r["path"].split("?")[0].endswith("$export")]
    assert kick_off["path"].startswith("/fhir/Group/icu/$export?")
    assert (
        "_type=Patient%2CObservation" in kick_off["path"]
        and "_since=2026-11-22" in kick_off["path"]
    )
    assert kick_off["headers"]["Prefer"] == "respond-async"
    polls = [r for r in server.requests if r["path"].startswith("/fhir/bulkstatus/")]
    assert [r["method"] for r in polls] == ["GET", "GET", "GET", "DELETE"]  # 202, 202, 200, done
    # one token; every request but discovery and the token's carried it
    token_requests = [r for r in server.requests if r["path"] == "/auth/token"]
    assert len(token_requests) == 1
    for entry in server.requests:
        if entry["path"] not in ("/auth/token", "/fhir/.well-known/smart-configuration"):
            assert entry["token"], entry["path"]
        else:
            assert "Authorization" not in entry["headers"]
    assert (tmp_path / "export" / STATE_FILE).is_file()
    # neither the key nor the token is logged
    token = next(iter(server.tokens))
    assert token not in caplog.text and "PRIVATE KEY" not in caplog.text


def test_patient_and_system_levels_and_an_rsa_key(
    server: BulkServer, rsa_key: ClientKey, tmp_path: Path
) -> None:
    client = access(server, rsa_key, tmp_path)
    export_from_server(client, ExportRequest(), tmp_path / "patient", FAST, progress=False)
    ids = exported_ids(tmp_path / "patient")
    assert ids == {"Observation": ["o0", "o1", "o2", "o3"], "Patient": ["p0", "p1", "p2", "p3"]}
    assert [len(b["entry"]) for b in patient_bundles(tmp_path / "patient")] == [2, 2, 2, 2]
    system = ExportRequest(level="system", types=())
    export_from_server(client, system, tmp_path / "system", FAST, progress=False)
    assert exported_ids(tmp_path / "system")["Practitioner"] == ["dr"]
    # one RS384 assertion per export, each with its own jti
    assert server.algorithms_seen == ["RS384", "RS384"] and len(server.seen_jti) == 2


def test_retries_a_throttled_kick_off_and_refreshes_a_refused_token(
    server: BulkServer, es_key: ClientKey, tmp_path: Path
) -> None:
    server.throttle = 1
    server.revoke_at_next_poll = True  # the first status poll finds the token refused
    export_from_server(
        access(server, es_key, tmp_path), ExportRequest(), tmp_path / "export", FAST, progress=False
    )
    paths = [r["path"].split("?")[0] for r in server.requests]
    assert paths.count("/fhir/Patient/$export") == 2  # 429, then 202
    assert paths.count("/auth/token") == 2  # the second after the 401
    polls = [r["token"] for r in server.requests if r["path"].startswith("/fhir/bulkstatus/")]
    assert polls[:2] == [False, True]  # refused, then asked again with the new token
    assert len(exported_ids(tmp_path / "export")["Patient"]) == 4


def test_a_failed_export_gives_the_servers_operation_outcome(
    server: BulkServer, es_key: ClientKey, tmp_path: Path
) -> None:
    client = access(server, es_key, tmp_path)
    with pytest.raises(ExportFailedError, match="fatal: exception: the export of this Group"):
        request = ExportRequest(level="group", group="broken")
        export_from_server(client, request, tmp_path / "a", FAST, progress=False)
    with pytest.raises(ExportFailedError, match=r"HTTP 404: error: not-found: Group/nobody"):
        request = ExportRequest(level="group", group="nobody")
        export_from_server(client, request, tmp_path / "b", FAST, progress=False)
    server.throttle = 10
    with pytest.raises(ExportFailedError, match="HTTP 429: error: throttled"):
        export_from_server(client, ExportRequest(), tmp_path / "c", FAST, progress=False)


def test_an_unregistered_key_is_refused_with_the_oauth_error(
    server: BulkServer, tmp_path: Path
) -> None:
    stranger = es384_key()
    path = tmp_path / "k.pem"
    path.write_bytes(pem(stranger.key))
    with pytest.raises(SmartAuthError, match="invalid_client"):
        export_from_server(
            ServerAccess(server.base, BULK_CLIENT, path),
            ExportRequest(),
            tmp_path / "x",
            FAST,
            progress=False,
        )
    with pytest.raises(SmartAuthError, match="neither RSA nor EC P-384"):
        ClientKey.from_pem(pem(ec.generate_private_key(ec.SECP256R1())))
    with pytest.raises(SmartAuthError, match=KEY_ENV):
        export_from_server(
            ServerAccess(server.base, BULK_CLIENT),
            ExportRequest(),
            tmp_path / "y",
            FAST,
            environ={},
        )


def test_a_broken_download_resumes_where_it_stopped(
    server: BulkServer, es_key: ClientKey, tmp_path: Path
) -> None:
    server.gzip = True
    server.drop_after = 40
    client = access(server, es_key, tmp_path)
    with pytest.raises(FhirServerError, match="rerun to resume"):
        export_from_server(client, ExportRequest(), tmp_path / "export", FAST, progress=False)
    (part,) = (tmp_path / "export").glob("*.part")
    assert part.name.endswith(".ndjson.gz.part") and part.stat().st_size == 40
    n_kick_offs = sum(r["path"].startswith("/fhir/Patient/$export") for r in server.requests)
    result = export_from_server(client, ExportRequest(), tmp_path / "export", FAST, progress=False)
    assert result.resumed
    # no new export: the saved manifest; the broken file asked from byte 40 on
    assert (
        sum(r["path"].startswith("/fhir/Patient/$export") for r in server.requests) == n_kick_offs
    )
    ranged = [r for r in server.requests if "Range" in r["headers"]]
    assert [r["headers"]["Range"] for r in ranged] == ["bytes=40-"]
    assert exported_ids(tmp_path / "export")["Patient"] == ["p0", "p1", "p2", "p3"]
    assert all(f.path.name.endswith(".ndjson.gz") for f in export_files(tmp_path / "export"))
    # a third run finds it complete; another request in the same directory is refused
    export_from_server(client, ExportRequest(), tmp_path / "export", FAST, progress=False)
    with pytest.raises(FhirServerError, match="holds another export"):
        other = ExportRequest(since="2026-11-01")
        export_from_server(client, other, tmp_path / "export", FAST, progress=False)


def test_the_token_never_leaves_the_servers_origin(
    server: BulkServer, es_key: ClientKey, tmp_path: Path
) -> None:
    # the manifest's files on another origin (localhost is not 127.0.0.1) while they need the
    # token: refused before any request there
    manifest = server.manifest

    def elsewhere(export_id: str, export: Any) -> dict[str, Any]:
        document = manifest(export_id, export)
        for output in document["output"]:
            output["url"] = output["url"].replace("127.0.0.1", "localhost")
        return document

    server.manifest = elsewhere  # type: ignore[method-assign]
    client = access(server, es_key, tmp_path)
    with pytest.raises(FhirServerError, match="not the FHIR server's origin: refused"):
        export_from_server(client, ExportRequest(), tmp_path / "a", FAST, progress=False)
    assert not [r for r in server.requests if "/files/" in r["path"]]
    # files that need no token are fetched there without it
    server.requires_token = False
    export_from_server(client, ExportRequest(), tmp_path / "b", FAST, progress=False)
    downloads = [r for r in server.requests if "/files/" in r["path"]]
    assert downloads and all("Authorization" not in r["headers"] for r in downloads)


def test_the_commands_server_options_make_the_export_it_then_reads(
    server: BulkServer, es_key: ClientKey, tmp_path: Path
) -> None:
    client = access(server, es_key, tmp_path)
    options = {
        "fhir_dirs": (),
        "fhir_server": server.base,
        "export_level": "patient",
        "group_id": "icu",
        "export_types": ("Patient",),
        "since": None,
        "client_id": BULK_CLIENT,
        "client_key": client.key_path,
        "client_kid": es_key.kid,
        "scope": "system/Patient.rs",
        "fhir_mapping": None,
        "bucket_mib": 64,
    }
    source = fhir_source(options, tmp_path / "out")
    assert source.export_dirs == (tmp_path / "out" / "export",) and source.bucket_mib == 64
    assert exported_ids(tmp_path / "out" / "export") == {"Patient": ["p1", "p2"]}
    (kick_off,) = [r for r in server.requests if "$export" in r["path"]]
    assert kick_off["path"].startswith("/fhir/Group/icu/$export?_outputFormat=")
