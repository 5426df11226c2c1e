"""The service app on the instant engine in a process of its own, for tests that need several
API processes at once (`medtpe serve` starts a real engine): `python -m tests.support.instant_app
PORT` serves `create_app(ServiceSettings(), InstantEngine.factory())` with uvicorn on
127.0.0.1:PORT, its settings from the `MEDTPE_*` environment, which names its ledger."""

from __future__ import annotations

import os
import sys

import uvicorn

from medtpe.inference.engines.instant import InstantEngine
from medtpe.service.app import create_app
from medtpe.service.settings import ServiceSettings


def main(port: int) -> None:
    """Serve until stopped (SIGTERM, SIGINT) or killed; refused without `MEDTPE_LEDGER_URL`
    (a test service never writes to the checkout's default ledger)."""
    if not os.environ.get("MEDTPE_LEDGER_URL"):
        sys.exit("tests.support.instant_app: set MEDTPE_LEDGER_URL (a test ledger of its own)")
    app = create_app(ServiceSettings(), InstantEngine.factory())
    uvicorn.run(app, host="127.0.0.1", port=port, log_level="warning")


if __name__ == "__main__":
    main(int(sys.argv[1]))
