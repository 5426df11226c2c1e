"""The published OpenAPI document is the contract. A schema-driven fuzzer (the schemathesis CLI,
`--checks all`: no server error, documented status codes, content types and headers, response
bodies that match their schemas, schema-valid requests accepted and invalid ones rejected, ...)
runs against the app, served by uvicorn in this process on an engine that answers at once. Any
finding fails the test with the fuzzer's report."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from medtpe.core.tasks import list_tasks
from tests.support.paths import ROOT
from tests.support.service_support import instant_settings, served_in_thread

pytestmark = [pytest.mark.timeout(900)]

FUZZ_EXAMPLES = os.environ.get("MEDTPE_FUZZ_EXAMPLES", "25")
"""Generated cases per operation and phase (raise it locally for a longer hunt)."""
ERROR_CODES = {"400", "401", "408", "413", "422", "500", "503", "504"}


@pytest.fixture(scope="module")
def contract_url(service_files: tuple[Path, Path]) -> Iterator[str]:
    """The app without API keys on 127.0.0.1 (authentication is tested in test_service.py)."""
    with served_in_thread(instant_settings(service_files, api_keys=[])) as url:
        yield url


def test_the_api_keeps_its_published_contract(contract_url: str, tmp_path: Path) -> None:
    schemathesis = Path(sys.executable).with_name("schemathesis")
    command = [str(schemathesis), "run", contract_url + "/openapi.json", "--checks", "all"]
    command += ["--max-examples", FUZZ_EXAMPLES, "--seed", "1", "--no-color", "--workers", "1"]
    # the hooks are imported by module name; the fuzzer runs elsewhere, so name the repository
    hooks = "tests.support.contract_hooks"
    env = os.environ | {"PYTHONPATH": str(ROOT), "SCHEMATHESIS_HOOKS": hooks}
    # run in a scratch directory: the fuzzer keeps its cache of findings in `.schemathesis/`
    done = subprocess.run(
        command, env=env, cwd=tmp_path, capture_output=True, text=True, timeout=800
    )
    assert done.returncode == 0, done.stdout[-12000:] + done.stderr[-2000:]
    assert "No issues found" in done.stdout or " passed" in done.stdout, done.stdout[-3000:]


def test_the_document_enumerates_tasks_and_states_the_limits(contract_url: str) -> None:
    document = httpx.get(contract_url + "/openapi.json").json()
    schemas = document["components"]["schemas"]
    assert schemas["PredictRequest"]["properties"]["task"]["enum"] == list_tasks()
    assert schemas["PredictOptions"]["properties"]["n_samples"]["maximum"] == 9
    assert schemas["BatchRequest"]["properties"]["records"]["maxItems"] == 16 + 64
    assert len(schemas["TokenizeRequest"]["oneOf"]) == 2
    for path in ("/predict", "/predict/batch", "/tokenize"):
        assert set(document["paths"][path]["post"]["responses"]) == {"200"} | ERROR_CODES
    metrics = document["paths"]["/metrics"]["get"]["responses"]["200"]["content"]
    assert list(metrics) == ["text/plain; version=0.0.4; charset=utf-8"]
    assert "path" not in schemas["ModelIdentity"]["properties"]
