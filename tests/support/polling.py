"""Waiting in a test for something another process or thread does, with a deadline."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest


def wait_for(
    what: str,
    probe: Callable[[], Any],
    timeout_s: float,
    log: Path | None = None,
    poll_s: float = 0.25,
) -> Any:
    """Poll `probe` every `poll_s` until it returns a truthy value (an HTTP transport error
    counts as not yet) and return that value; fail after `timeout_s`, with `log`'s tail."""
    deadline = time.monotonic() + timeout_s
    while True:
        with contextlib.suppress(httpx.TransportError):
            value = probe()
            if value:
                return value
        if time.monotonic() > deadline:
            tail = log.read_text()[-3000:] if log and log.exists() else ""
            pytest.fail(f"timed out after {timeout_s:.0f} s waiting for {what}\n{tail}")
        time.sleep(poll_s)
