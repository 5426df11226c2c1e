"""The service's own stop: uvicorn's server with a drain in front of its shutdown.

On SIGTERM/SIGINT uvicorn would stop listening, wait `timeout_graceful_shutdown` for the
requests in flight, then cancel the rest, which their clients get as a bare `500 Internal Server
Error` in plain text. Here, first: the listener stays open and every new API request is answered
`503 shutting_down` with `Retry-After` (readiness turns red), the requests in flight get up to
`MEDTPE_SHUTDOWN_GRACE_S` to finish, and those still running then are answered `503
shutting_down` by the service itself (their generations aborted in the engine); both counted in
`/metrics`. Then uvicorn's own shutdown closes the listener and connections and stops the app
(the engine last).
"""

from __future__ import annotations

import asyncio
import logging
import socket
import time

import uvicorn
from fastapi import FastAPI

from medtpe.service.plumbing.state import ServiceState

logger = logging.getLogger("medtpe.service")

POLL_S = 0.05
ANSWER_S = 5.0
"""How long the requests cut at the end of the grace period get to send their 503s."""


def stop_within_s(grace_s: float) -> float:
    """The longest a drained stop of one API process takes: the grace period, the cut
    requests' 503s, uvicorn's own wait for its connections."""
    return grace_s + 2 * ANSWER_S


class DrainingServer(uvicorn.Server):
    """`uvicorn.Server` whose shutdown drains the service first (module docstring)."""

    def __init__(self, config: uvicorn.Config, state: ServiceState) -> None:
        super().__init__(config)
        self.state = state

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        """Drain (refuse new requests, wait up to the grace period, answer the rest 503), then
        uvicorn's shutdown. A second signal (`force_exit`) ends the wait."""
        state = self.state
        grace = state.settings.shutdown_grace_s
        state.begin_drain()
        logger.info("draining: %d request(s) in flight, up to %.0f s", state.in_flight, grace)
        await self._wait_idle(grace)
        if state.in_flight:
            cut = state.expire_in_flight()
            logger.warning("grace period over: %d request(s) answered 503 shutting_down", cut)
            await self._wait_idle(ANSWER_S)
        await super().shutdown(sockets)

    async def _wait_idle(self, timeout_s: float) -> None:
        """Until no request is in flight, `timeout_s` passed, or a second signal came."""
        deadline = time.monotonic() + timeout_s
        while self.state.in_flight and time.monotonic() < deadline and not self.force_exit:
            await asyncio.sleep(POLL_S)


def draining_server(app: FastAPI, **config: object) -> DrainingServer:
    """A `DrainingServer` for the service `app` (`medtpe.service.app.create_app`); `config` goes to
    `uvicorn.Config` (host, port, log level, ...)."""
    state: ServiceState = app.state.service
    options = uvicorn.Config(app, timeout_graceful_shutdown=int(ANSWER_S), **config)  # type: ignore[arg-type]
    return DrainingServer(options, state)
