"""`medtpe serve` with several API processes on one engine (`MEDTPE_API_WORKERS` = N > 1).

The supervisor (the process `medtpe serve` started):
1. loads and checks the prepared model files once (a missing one stops it before any engine);
2. points prometheus_client at a fresh multiprocess directory, so `/metrics` from any process
   reports all of them (medtpe/service/plumbing/metrics.py);
3. binds the listening socket, starts the engine core and spawns N API processes
   (`medtpe.inference.engines.shared`), then waits.

Each API process is the ordinary app (`medtpe.service.app.create_app`) on the shared socket, its
engine a client of the shared core, its admission limits a 1/N share
(`ServiceSettings.process_limits`). What must be the same in every process, the CDS Hooks replay and
score caches, is in the store `MEDTPE_STATE_URL` names (medtpe/service/cds_hooks/state_store.py:
each process its own client), its score entries authenticated with `MEDTPE_STATE_KEY` (unset: one
key drawn here for all processes, as the cache-salt secret is); with CDS issuers and no state URL
the settings refuse N > 1, before any process starts. It reports ready after its own warm-up
generation through the core. If any API process or the engine core dies, the supervisor stops the
rest and exits non-zero, so the orchestrator restarts the whole instance; SIGTERM drains every API
process, then stops the engine.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import tempfile
from dataclasses import dataclass
from typing import Any

from prometheus_client import multiprocess

from medtpe.inference.engines.factories import connect_vllm
from medtpe.inference.model import load_model
from medtpe.service.app import create_app
from medtpe.service.drain import draining_server, stop_within_s
from medtpe.service.plumbing.metrics import MULTIPROCESS_DIR_ENV
from medtpe.service.plumbing.state import require_input_budget, require_validated_budget
from medtpe.service.plumbing.tenancy import new_secret
from medtpe.service.settings import ServiceSettings

logger = logging.getLogger("medtpe.service")

LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s %(message)s"


@dataclass(frozen=True)
class ApiProcessArgs:
    """What every API process gets from the supervisor (pickled into the spawned process)."""

    settings: ServiceSettings
    salt_secret: bytes
    """One cache-salt secret for all processes of the engine
    (medtpe/service/plumbing/tenancy.py)."""
    state_key: bytes
    """Without `MEDTPE_STATE_KEY`: one key of the score cache's MACs for all processes
    (medtpe/service/cds_hooks/state_store.py)."""


def listening_socket(host: str, port: int) -> socket.socket:
    """A bound TCP socket the API processes share (each calls `listen` on it)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    return sock


def serve_api_processes(settings: ServiceSettings) -> None:
    """Run `settings.api_workers` API processes on one engine until SIGTERM (blocking)."""
    model = load_model(settings.model())
    require_input_budget(settings, model.predictor)
    require_validated_budget(settings, model)
    # torch and vLLM only once the model files and budgets passed their checks: a refused start
    # is quick
    from medtpe.inference.engines.shared import serve_shared_engine

    metrics_dir = tempfile.TemporaryDirectory(prefix="medtpe-metrics-")
    os.environ[MULTIPROCESS_DIR_ENV] = metrics_dir.name
    sock = listening_socket(settings.host, settings.port)
    try:
        serve_shared_engine(
            model.engine_config,
            settings.api_workers,
            _api_process,
            sock,
            ApiProcessArgs(settings, new_secret(), new_secret()),
            stop_within_s(settings.shutdown_grace_s),
        )
    finally:
        sock.close()
        metrics_dir.cleanup()


def _api_process(
    listen_address: str, sock: socket.socket, args: ApiProcessArgs, client: dict[str, Any]
) -> None:
    """One spawned API process: the app on the shared socket, engine = a client of the core."""
    logging.basicConfig(level=logging.INFO, format=LOG_FORMAT)
    logger.info("API process %d serving %s", client["client_index"], listen_address)
    settings = args.settings
    app = create_app(settings, connect_vllm(client), args.salt_secret, args.state_key)
    server = draining_server(app, log_level="info")
    try:
        asyncio.run(server.serve(sockets=[sock]))
    finally:
        multiprocess.mark_process_dead(os.getpid())
