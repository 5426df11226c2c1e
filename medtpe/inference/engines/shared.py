"""One vLLM engine core fed by several API processes (`MEDTPE_API_WORKERS`).

The supervisor process binds one pair of ZMQ listeners per API process, starts the engine core
once, then spawns the API processes; each connects its own `AsyncLLM` client to that core
(`medtpe.inference.engines.vllm_engine.VllmEngine.connect`) and serves HTTP on the one listening
socket the supervisor opened (the kernel hands each new connection to one of them). This is what
`vllm serve --api-server-count N` does (vllm/entrypoints/cli/serve.py, `run_multi_api_server`),
with our process function as the frontend.

The supervisor then waits: when any API process or the engine core exits, or on SIGTERM/SIGINT,
it stops the API processes (SIGTERM: each drains its requests in flight) and then the engine.
"""

from __future__ import annotations

import logging
import signal
import socket
import time
from collections.abc import Callable
from types import FrameType
from typing import Any

from vllm.v1.engine.utils import bind_engine_zmq_listeners, launch_core_engines
from vllm.v1.executor import Executor
from vllm.v1.utils import APIServerProcessManager, wait_for_completion_or_failure

from medtpe.inference.engines.protocol import EngineConfig
from medtpe.inference.engines.vllm_engine import bind_cpu_cores, client_vllm_config

logger = logging.getLogger(__name__)

ApiProcess = Callable[[str, socket.socket, Any, dict[str, Any]], None]
"""`fn(listen_address, sock, payload, client)`: the body of one spawned API process; `client`
is what `VllmEngine.connect` needs to reach the shared engine core."""

SUPERVISOR_RANK = -1
"""vLLM's API-process rank of the process that launches the engine core."""


def serve_shared_engine(
    config: EngineConfig,
    n_processes: int,
    api_process: ApiProcess,
    sock: socket.socket,
    payload: Any,
    shutdown_timeout_s: float,
) -> None:
    """Start the engine core of `config` and `n_processes` spawned `api_process(listen_address,
    sock, payload, client)`; block until one of them exits or a SIGTERM/SIGINT arrives, then
    stop them all (the API processes get `shutdown_timeout_s` to drain). `payload` must pickle.

    Raises RuntimeError when a process died (non-zero exit) or the engine core failed.
    """
    stopping = False

    def request_stop(signum: int, _: FrameType | None) -> None:
        nonlocal stopping
        logger.info("signal %d: stopping the API processes and the engine", signum)
        if not stopping:
            stopping = True
            raise SystemExit

    signal.signal(signal.SIGTERM, request_stop)
    signal.signal(signal.SIGINT, request_stop)

    bind_cpu_cores(config.options)
    vllm_config = client_vllm_config(config, n_processes, SUPERVISOR_RANK)
    listeners = bind_engine_zmq_listeners(vllm_config, n_processes)
    host, port = sock.getsockname()[:2]
    with launch_core_engines(
        vllm_config,
        Executor.get_class(vllm_config),
        config.options.log_stats,
        listeners.addresses,
    ) as launch:
        processes = APIServerProcessManager(
            listen_address=f"http://{host}:{port}",
            sock=sock,
            args=payload,
            num_servers=n_processes,
            input_listeners=listeners.inputs,
            output_listeners=listeners.outputs,
            target_server_fn=api_process,
        )
        launch.watched_frontend_processes = processes.processes
    logger.info("engine core up; %d API processes on %s:%s", n_processes, host, port)
    try:
        wait_for_completion_or_failure(
            api_server_manager=processes, engine_manager=launch.engine_manager
        )
    finally:
        deadline = time.monotonic() + shutdown_timeout_s
        processes.shutdown(timeout=shutdown_timeout_s)
        if launch.engine_manager is not None:
            launch.engine_manager.shutdown(timeout=max(deadline - time.monotonic(), 5.0))
