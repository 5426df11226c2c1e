"""Service-test material: synthetic MEDS records (no patient data, no ../shared needed) and a
small MedTPE artefact for the default model, used only while no default artefact exists."""

from __future__ import annotations

import atexit
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime, timedelta
from functools import cache
from pathlib import Path
from typing import Any, Protocol

import httpx
import psutil
import pytest
from starlette.testclient import TestClient

from medtpe.inference.engines.instant import InstantEngine
from medtpe.inference.engines.protocol import EngineFactory
from medtpe.service.app import create_app
from medtpe.service.drain import DrainingServer, draining_server
from medtpe.service.settings import ServiceSettings
from tests.support.ledger_rows import RFC8037_SEED_B64

# (code, low, high): ICU chart items and labs in MIMIC-IV MEDS spelling, without descriptions.
_MEASUREMENTS = [
    ("LAB//220045//bpm", 55, 140),
    ("LAB//220179//mmHg", 75, 170),
    ("LAB//220180//mmHg", 35, 100),
    ("LAB//220210//insp/min", 8, 35),
    ("LAB//220277//%", 84, 100),
    ("LAB//50931//mg/dL", 65, 320),
    ("LAB//50971//mEq/L", 2.8, 6.2),
    ("LAB//50912//mg/dL", 0.4, 4.5),
    ("LAB//223761//°F", 96, 103.5),
    ("LAB//51222//g/dL", 6.5, 16),
]
_EVENTS = [
    "INFUSION_START//225158",
    "MEDICATION//START//Heparin",
    "DIAGNOSIS//ICD//9//4019",
    "DIAGNOSIS//ICD//10//I10",
    "PROCEDURE//START//225792",
]


def meds_event(
    subject_id: int, time: datetime | None, code: str, value: float | None = None
) -> dict[str, Any]:
    """One MEDS JSON event: `time` as ISO text (None: a static event), a `numeric_value` only
    when `value` is given."""
    event: dict[str, Any] = {
        "subject_id": subject_id,
        "time": None if time is None else time.isoformat(),
        "code": code,
    }
    if value is not None:
        event["numeric_value"] = value
    return event


def synthetic_events(subject_id: int, n_events: int = 60, seed: int | None = None) -> list[dict]:
    """A plausible ICU record as MEDS JSON events: birth, admission, then measurements."""
    rng = random.Random(subject_id if seed is None else seed)
    start = datetime(2150, 1, 1) + timedelta(days=rng.randint(0, 3000), hours=rng.randint(0, 23))
    events = [
        meds_event(subject_id, None, "GENDER//F"),
        meds_event(subject_id, start - timedelta(days=365 * rng.randint(25, 90)), "MEDS_BIRTH"),
        meds_event(subject_id, start, "ICU_ADMISSION//MICU"),
    ]
    time = start
    for _ in range(n_events):
        time += timedelta(minutes=rng.randint(0, 45))
        if rng.random() < 0.15:
            events.append(meds_event(subject_id, time, rng.choice(_EVENTS)))
        else:
            code, low, high = rng.choice(_MEASUREMENTS)
            events.append(meds_event(subject_id, time, code, round(rng.uniform(low, high), 1)))
    return events


def build_test_artefact(model_dir: Path, out_dir: Path, budget: int = 400) -> Path:
    """A MedTPE artefact for `model_dir`, mined from synthetic prompts, with mean-initialised rows
    (no SSFT): a stand-in with the default artefact's layout."""
    from transformers import AutoModelForCausalLM

    from medtpe.core.meds import MedsEvent
    from medtpe.core.prompt import ChatTemplate, build_prompt
    from medtpe.core.tasks import get_task, list_tasks
    from medtpe.core.tokenizer import BaseTokenizer
    from medtpe.core.tokenizer.build import build_tokenizer
    from medtpe.training.embedding_init import init_new_rows
    from medtpe.training.export import model_fingerprint, save_rows

    base = BaseTokenizer.load(model_dir)
    template = ChatTemplate.from_model_dir(model_dir)
    task = get_task("icu_mortality")
    texts = [
        build_prompt(
            task,
            [MedsEvent.model_validate(e) for e in synthetic_events(i, 150)],
            None,
            base,
            template,
            4096,
        ).text
        for i in range(60)
    ]
    protected = [build_prompt(name, [], None, base, template, 4096).text for name in list_tasks()]
    tokenizer = build_tokenizer(base, texts, budget, 2, "static", protected, progress=False)
    tokenizer.save(out_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype="auto")
    save_rows(out_dir, init_new_rows(model, tokenizer.new_tokens), model_fingerprint(model))
    return out_dir


def service_artefact(cache: Path) -> tuple[Path, Path]:
    """(artefact dir, export dir) for service tests: the default artefact once it is trained,
    else a stand-in built here; the base model is prepared and the checkpoint exported first,
    so service processes started afterwards only load files."""
    from medtpe.core.paths import default_artefact_dir, default_export_dir, default_model_dir
    from medtpe.training.default_model import ensure_base_model
    from medtpe.training.export import ensure_export

    model_dir = ensure_base_model(default_model_dir())
    artefact, export = default_artefact_dir(), default_export_dir()
    if not (artefact / "embeddings.safetensors").is_file():
        artefact, export = cache / "service-artefact", cache / "service-export"
        if not (artefact / "embeddings.safetensors").is_file():
            build_test_artefact(model_dir, artefact)
    ensure_export(model_dir, artefact, export)
    return artefact, export


READY_POLL_S = 0.25
"""How often a test asks a starting server whether it is ready: each start waits half of it on
average past the moment it is."""

ENGINE_DTYPE = "float32"
"""The test engines' dtype. The development and CI machines' CPUs (AVX2, no native bfloat16)
compute vLLM's default bfloat16 through a slow fallback: one thread, a 300 x 576 by 576 x 1536
matmul took 279 ms in bfloat16 against 35 ms in float32 (2026-11-25). Same model and weights;
the answers' assertions do not depend on the dtype."""


def engine_test_config(service_files: tuple[Path, Path], meds: Path, max_new_tokens: int) -> Any:
    """The `ModelConfig` of an engine test in `medtpe` mode: the test artefact, `meds`'s code
    descriptions, a 512-token budget, a 1 GiB KV cache, eager (no torch.compile), float32,
    seed 1."""
    from medtpe.core.paths import default_model_dir
    from medtpe.inference.engines.protocol import EngineOptions
    from medtpe.inference.model import ModelConfig

    artefact, export = service_files
    return ModelConfig(
        model_dir=default_model_dir(),
        artefact_dir=artefact,
        export_dir=export,
        mode="medtpe",
        codes_dir=meds,
        max_input_tokens=512,
        max_new_tokens=max_new_tokens,
        engine=EngineOptions(kv_cache_gib=1.0, seed=1, enforce_eager=True, dtype=ENGINE_DTYPE),
    )


SERVICE_API_KEY = "test-key-1"
SHUTDOWN_GRACE_S = 5
"""The session service's grace period (`MEDTPE_SHUTDOWN_GRACE_S`): shorter than the request its
stop test leaves in flight."""


@cache
def _ledgers_dir() -> Path:
    """This process's folder of test ledgers (each pytest-xdist worker has its own), removed
    when the process exits."""
    folder = Path(tempfile.mkdtemp(prefix="medtpe-test-ledgers-"))
    atexit.register(shutil.rmtree, folder, True)
    return folder


def own_ledger_url() -> str:
    """A new, empty SQLite ledger for one test service: a test never writes to the checkout's
    default ledger (`.cache/ledger.sqlite3`), and no two pytest-xdist workers share a file."""
    return f"sqlite:///{Path(tempfile.mkdtemp(dir=_ledgers_dir())) / 'ledger.sqlite3'}"


TEST_SIGNING_KEY = RFC8037_SEED_B64
"""The receipts' signing key of the test services and batch runs (RFC 8037's test seed): none
of them generates the checkout's `.cache/ledger-signing-key`."""


def own_ledger_settings() -> dict[str, str]:
    """The `ServiceSettings` fields of an in-process test app's ledger: a ledger of its own
    (`own_ledger_url`), signed with the test key (the defaults name the checkout's `.cache/`)."""
    return {"ledger_url": own_ledger_url(), "ledger_signing_key": TEST_SIGNING_KEY}


def own_ledger_environment() -> Iterator[str]:
    """A module fixture's body (`pytest.fixture(scope="module", autouse=True)(...)`): while the
    module runs, `MEDTPE_LEDGER_URL` names a ledger of its own (`own_ledger_url`) and
    `MEDTPE_LEDGER_SIGNING_KEY` the test key, for the batch runs and commands that read them
    (`run_local`, `run_fhir`, `medtpe predict`); yields the ledger's URL."""
    with pytest.MonkeyPatch.context() as patch:
        url = own_ledger_url()
        patch.setenv("MEDTPE_LEDGER_URL", url)
        patch.setenv("MEDTPE_LEDGER_SIGNING_KEY", TEST_SIGNING_KEY)
        yield url


def service_env(service_files: tuple[Path, Path], **overrides: str) -> dict[str, str]:
    """Environment of a test service: small input budget and KV cache, eager float32 engine,
    a ledger of its own (`own_ledger_url`) and the test signing key."""
    artefact, export = service_files
    env = {
        "MEDTPE_LEDGER_URL": own_ledger_url(),
        "MEDTPE_LEDGER_SIGNING_KEY": TEST_SIGNING_KEY,
        "MEDTPE_ARTEFACT_DIR": str(artefact),
        "MEDTPE_EXPORT_DIR": str(export),
        "MEDTPE_MAX_INPUT_TOKENS": "1024",
        "MEDTPE_MAX_NEW_TOKENS": "16",
        "MEDTPE_KV_CACHE_GIB": "1",
        "MEDTPE_ENFORCE_EAGER": "1",
        "MEDTPE_DTYPE": ENGINE_DTYPE,
        "VLLM_CPU_KVCACHE_SPACE": "1",
        "MEDTPE_ALLOW_UNVALIDATED_BUDGET": str(not validated(artefact)).lower(),
    }
    env.update(overrides)
    return env


def validated(artefact: Path) -> bool:
    """Whether the artefact carries a manifest (the default one does; the stand-in built on a
    clone without the default's rows was never validated, so its services allow that)."""
    from medtpe.core.tokenizer.artefact_manifest import MANIFEST_FILE

    return (artefact / MANIFEST_FILE).is_file()


def free_port() -> int:
    """A TCP port nobody listens on right now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class ServiceProcess:
    """`medtpe serve` in a subprocess on 127.0.0.1, its output in a log file; its URL is its
    CDS Hooks public base URL (`MEDTPE_CDS_BASE_URL`) unless `env` names another."""

    def __init__(self, env: dict[str, str], log_path: Path) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = log_path
        self._log = log_path.open("wb")
        medtpe = Path(sys.executable).with_name("medtpe")
        self.process = subprocess.Popen(
            [str(medtpe), "serve", "--host", "127.0.0.1", "--port", str(self.port)],
            env={**os.environ, "MEDTPE_CDS_BASE_URL": self.url, **env},
            stdout=self._log,
            stderr=subprocess.STDOUT,
        )

    def log(self) -> str:
        """Everything the service printed so far."""
        return self.log_path.read_text(errors="replace")

    def wait_ready(self, timeout_s: float = 600) -> None:
        """Poll `/readyz` until it is green; fail with the log tail if the process dies. One
        client for every poll: each `httpx.get` builds a TLS context (~0.1 s of CPU), which
        four polls a second took from the engine starting on the same core."""
        deadline = time.monotonic() + timeout_s
        with httpx.Client(timeout=5) as client:
            while time.monotonic() < deadline:
                if self.process.poll() is not None:
                    raise RuntimeError(
                        f"service exited ({self.process.returncode}):\n{self.log()[-4000:]}"
                    )
                try:
                    if client.get(self.url + "/readyz").status_code == 200:
                        return
                except httpx.TransportError:
                    pass
                time.sleep(READY_POLL_S)
        raise TimeoutError(f"service not ready after {timeout_s} s:\n{self.log()[-4000:]}")

    def engine_core_pids(self) -> list[int]:
        """Pids of the vLLM engine processes this service started."""
        children = psutil.Process(self.process.pid).children(recursive=True)
        return [
            child.pid
            for child in children
            if "EngineCore" in " ".join(child.cmdline() or [child.name()])
        ]

    def stop(self, timeout_s: float = 120) -> int:
        """SIGTERM, wait for the exit; returns the exit code."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self._log.close()
        return self.process.returncode


@contextmanager
def running_service(env: dict[str, str], log_path: Path) -> Iterator[ServiceProcess]:
    """A `ServiceProcess` with `env`, once ready; stopped on exit."""
    server = ServiceProcess(env, log_path)
    try:
        server.wait_ready()
        yield server
    finally:
        server.stop()


def metric_value(text: str, name: str, **labels: str) -> float:
    """The value of one sample of a Prometheus exposition (0 when absent); text that is no
    exposition (a 401's body, say) fails, so a metric read without a key cannot pass as 0."""
    assert "# TYPE " in text, f"not a Prometheus exposition: {text[:200]!r}"
    for line in text.splitlines():
        if line.startswith("#") or not line.startswith(name):
            continue
        sample, _, value = line.rpartition(" ")
        metric, _, label_text = sample.partition("{")
        if metric != name:
            continue
        found = dict(part.split("=", 1) for part in label_text.rstrip("}").split(",") if part)
        if all(found.get(k) == f'"{v}"' for k, v in labels.items()):
            return float(value)
    return 0.0


class Api(Protocol):
    """What the HTTP tests call: an `httpx.Client` on a served instance or a `TestClient`."""

    def get(self, url: str, **kwargs: Any) -> httpx.Response: ...

    def post(self, url: str, **kwargs: Any) -> httpx.Response: ...


AUTH = {"Authorization": f"Bearer {SERVICE_API_KEY}"}
"""The header of an authenticated request to a test service."""


def post(api: Api, path: str, body: object, **kwargs: Any) -> httpx.Response:
    """POST JSON with the API key."""
    headers = {**AUTH, **kwargs.pop("headers", {})}
    return api.post(path, json=body, headers=headers, **kwargs)


def record(subject_id: int, n_events: int = 30, **extra: Any) -> dict:
    """A predict request for a synthetic ICU record."""
    return {"task": "icu_mortality", "events": synthetic_events(subject_id, n_events), **extra}


class ServedApi(httpx.Client):
    """An `httpx.Client` on a `ServiceProcess` (its log stays reachable)."""

    def __init__(self, server: ServiceProcess) -> None:
        super().__init__(base_url=server.url, timeout=300)
        self.server = server


def instant_settings(service_files: tuple[Path, Path], **overrides: Any) -> ServiceSettings:
    """In-process settings equal to `service_env`'s (small budget, API keys, 256 KiB bodies, a
    ledger of its own, the test signing key)."""
    artefact, export = service_files
    values: dict[str, Any] = {
        **own_ledger_settings(),
        "artefact_dir": artefact,
        "export_dir": export,
        "max_input_tokens": 1024,
        "max_new_tokens": 16,
        "api_keys": [SERVICE_API_KEY, "test-key-2"],
        "max_request_bytes": 256 * 1024,
        "allow_unvalidated_budget": not validated(artefact),
    }
    return ServiceSettings(**(values | overrides))


@contextmanager
def instant_client(
    settings: ServiceSettings, delay_s: float = 0.0, engine_factory: EngineFactory | None = None
) -> Iterator[TestClient]:
    """The app in-process on an `InstantEngine` (or `engine_factory`'s engine), ready (lifespan
    run, readiness green)."""
    app = create_app(settings, engine_factory or InstantEngine.factory(delay_s))
    with TestClient(app, base_url="http://testserver") as client:
        deadline = time.monotonic() + 300
        # one probe a poll: each competes for the GIL with the start-up loading the model
        while (ready := client.get("/readyz")).status_code != 200:
            if time.monotonic() > deadline or ready.json()["status"] == "failed":
                raise RuntimeError(f"in-process app not ready: {ready.json()}")
            time.sleep(0.05)
        yield client


@dataclass(frozen=True)
class InThread:
    """A service served by `serving_in_thread`: its URL and its server (`server.state` is the
    app's state; setting `server.should_exit` starts its stop, as SIGTERM does)."""

    url: str
    server: DrainingServer


@contextmanager
def served_in_thread(
    settings: ServiceSettings, delay_s: float = 0.0, port: int | None = None
) -> Iterator[str]:
    """The app on an `InstantEngine`, served by uvicorn on 127.0.0.1 in a thread (on `port`,
    default a free one); yields its URL once ready."""
    with serving_in_thread(settings, delay_s, port) as served:
        yield served.url


@contextmanager
def serving_in_thread(
    settings: ServiceSettings, delay_s: float = 0.0, port: int | None = None
) -> Iterator[InThread]:
    """`served_in_thread`, yielding the server too: the app on an `InstantEngine`, served on
    127.0.0.1 (`port`, default a free one) in a thread by the server `medtpe serve` runs
    (`medtpe.service.drain`); stopped on exit."""
    import threading

    port = port or free_port()
    app = create_app(settings, InstantEngine.factory(delay_s))
    server = draining_server(app, host="127.0.0.1", port=port, log_level="warning")
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 300
        with httpx.Client(timeout=5) as client:  # one TLS context for every poll
            while time.monotonic() < deadline:
                try:
                    if client.get(url + "/readyz").status_code == 200:
                        break
                except httpx.TransportError:
                    pass
                time.sleep(0.1)
            else:
                raise TimeoutError("in-thread service not ready")
        yield InThread(url, server)
    finally:
        server.should_exit = True
        thread.join(30 + settings.shutdown_grace_s)


def asgi_post_scope(path: str, headers: list[tuple[bytes, bytes]]) -> dict[str, Any]:
    """The ASGI scope of a JSON `POST path` from 127.0.0.1 with raw `headers`, for tests that
    drive the app's body reading chunk by chunk."""
    return {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "query_string": b"",
        "root_path": "",
        "headers": [(b"content-type", b"application/json"), *headers],
        "client": ("127.0.0.1", 50000),
        "server": ("testserver", 80),
        "state": {},
    }
