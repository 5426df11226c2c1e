"""One audit line per CDS Hooks call (logger `medtpe.audit`, a JSON object): hookInstance,
issuer, tenant, jti, service id, model and artefact id, latency, card uuids, outcome, and for a
refused call its reason and the detail the answer leaves out (`AuditedError`: what a FHIR fetch
met, which the caller is not told).

Never the JWT, the FHIR access token or record content: only identifiers of the call and what
came of it. Unauthenticated calls are audited too (outcome `unauthorized` and the reason, with
the token's unverified `jti` if it had one).
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field

from medtpe.service.plumbing.errors import ApiError
from medtpe.service.plumbing.metrics import ServiceMetrics

audit_logger = logging.getLogger("medtpe.audit")
MAX_FIELD = 128
"""Longest value written (identifiers a client chose are cut, never trusted to be short)."""


@dataclass
class AuditEntry:
    """What one call's audit line says; the route fills it in as the call goes."""

    service: str
    event: str = "hook"
    hookInstance: str | None = None
    issuer: str | None = None
    tenant: str | None = None
    jti: str | None = None
    model: str | None = None
    artefact: str | None = None
    card: str | None = None
    """The card's uuid (a hook call's cards: their uuids, space-separated)."""
    outcome: str = "error"
    reason: str | None = None
    detail: str | None = None
    latency_ms: float = field(default=0.0)

    def line(self) -> str:
        """The JSON line (fields without a value left out)."""
        made = self.event == "hook"  # a hook line's card uuids are the service's, never cut
        values = {
            k: (v[:MAX_FIELD] if isinstance(v, str) and not (made and k == "card") else v)
            for k, v in asdict(self).items()
            if v is not None
        }
        return json.dumps(values, sort_keys=True)


class AuditedError(ApiError):
    """An `ApiError` whose `log_detail` (what exactly failed) goes to the audit line only."""

    def __init__(self, status: int, error: str, detail: str, log_detail: str) -> None:
        super().__init__(status, error, detail)
        self.log_detail = log_detail


def write(entry: AuditEntry, metrics: ServiceMetrics | None) -> None:
    """Log the line and count the call by service and outcome (not without `metrics`: a call
    naming no service of the discovery list, whose path must not become a label)."""
    audit_logger.info(entry.line())
    if entry.event == "hook" and metrics is not None:
        metrics.cds_calls.labels(entry.service, entry.outcome).inc()


@contextmanager
def audited(entry: AuditEntry, metrics: ServiceMetrics) -> Iterator[AuditEntry]:
    """Write `entry` when the block ends, with its latency; an `ApiError` sets the outcome
    from its status (412 `precondition`, 4xx `invalid`, else `error`) and its code as reason
    (an `AuditedError`'s `log_detail` as detail)."""
    start = time.perf_counter()
    try:
        yield entry
    except ApiError as exc:
        entry.outcome = _outcome(exc.status)
        entry.reason = exc.error
        if isinstance(exc, AuditedError):
            entry.detail = exc.log_detail
        raise
    except Exception as exc:
        entry.outcome, entry.reason = "error", type(exc).__name__
        raise
    finally:
        entry.latency_ms = round((time.perf_counter() - start) * 1e3, 2)
        write(entry, metrics)


def _outcome(status: int) -> str:
    if status == 412:
        return "precondition"
    return "invalid" if status < 500 else "error"
