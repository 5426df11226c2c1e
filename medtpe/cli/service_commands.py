"""`medtpe serve`: the prediction service (settings from `MEDTPE_*` environment variables)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import click

if TYPE_CHECKING:
    from pydantic import ValidationError


@click.command("serve")
@click.option("--host", default=None, help="Listen address (default: setting MEDTPE_HOST).")
@click.option(
    "--port",
    type=click.IntRange(1, 65535),
    default=None,
    help="Listen port (default: setting MEDTPE_PORT).",
)
def serve(host: str | None, port: int | None) -> None:
    """Serve /predict, /predict/batch, /tokenize, /healthz, /readyz and /metrics.

        It only loads prepared files: `medtpe prepare-model` and `medtpe export` (`make serve` runs
        both) write the base and the exported checkpoint, and a missing or stale one fails the start
        with an error naming the command. `/readyz` turns green once the engine has answered a
        warm-up request. SIGTERM drains: new requests get 503 `shutting_down`, those in flight get
    `MEDTPE_SHUTDOWN_GRACE_S` to finish (then 503 `shutting_down`), then the engine stops. With
        `MEDTPE_API_WORKERS` = N > 1, N API processes share one engine
        (medtpe/service/api_processes.py). docs/configuration.md lists the settings.
    """
    import logging

    from pydantic import ValidationError

    from medtpe.service.settings import ServiceSettings

    overrides = {k: v for k, v in {"host": host, "port": port}.items() if v is not None}
    try:
        settings = ServiceSettings(**overrides)
    except ValidationError as exc:  # a start-up error naming the setting, without a traceback
        raise click.ClickException(f"invalid settings: {settings_errors(exc)}") from None
    # the app and the engine's modules only once the settings are valid: a refused start
    # imports neither torch nor vLLM
    from medtpe.service.api_processes import LOG_FORMAT, serve_api_processes
    from medtpe.service.app import create_app
    from medtpe.service.drain import draining_server

    logging.basicConfig(level=logging.INFO, format=LOG_FORMAT)
    if settings.api_workers > 1:
        serve_api_processes(settings)
        return
    app = create_app(settings)
    draining_server(app, host=settings.host, port=settings.port, log_level="info").run()


def settings_errors(exc: ValidationError) -> str:
    """What is wrong with the settings, one line per error, without the values given (an API
    key is one)."""
    return "; ".join(
        f"{'.'.join(map(str, error['loc'])) or 'settings'}: {error['msg']}"
        for error in exc.errors(include_url=False, include_input=False)
    )


commands = [serve]
