"""Prometheus metrics of the service (names fixed in docs/architecture.md).

Each app instance owns its registries, so several instances (tests, side-by-side modes) never
share counters. Labels carry only endpoint, task, mode, tokenizer, result, reason, site (a
configured CDS service's id, or `api`), door and prefix (`Prefix`): no patient data. The counter
`medtpe_prompt_tokens_total` and the histogram `medtpe_prompt_tokens` share a base name, which
one registry refuses: the counter lives in a second registry and `_created`
series are off, so the text exposition (0.0.4) holds each name once.

With several API processes on one engine (`MEDTPE_API_WORKERS` > 1, medtpe/service/api_processes.py)
`PROMETHEUS_MULTIPROC_DIR` is set before any of them starts: every process writes its values
there and `/metrics`, whichever process answers it, reports the sums over all of them (the
in-flight gauge summed over the live processes, `medtpe_engine_ready` one series per process,
labelled `pid`).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Literal

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    REGISTRY,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    disable_created_metrics,
    generate_latest,
)
from prometheus_client.metrics_core import Metric
from prometheus_client.multiprocess import MultiProcessCollector

from medtpe.inference.drift import build_compression_rate, drift_figures
from medtpe.inference.model import LoadedModel
from medtpe.inference.predictor import Answer, PreparedRecord, Segmentation
from medtpe.ledger.store import PredictionRow

disable_created_metrics()

LATENCY_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 20, 40, 80, 160, 320)
TOKEN_BUCKETS = (64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384)
RATE_BUCKETS = tuple(round(0.05 * i, 2) for i in range(0, 21))
ABS_DP_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0)
API_SITE = "api"
"""The `site` label of the drift counters for answers of `/predict` and `/predict/batch`."""
MIXED_TASKS = "mixed"
"""The `task` label of a request's latency when it asks several tasks."""

Prefix = Literal["alone", "reused"]
"""The `prefix` label of the generation latency: a task's prompt answered `alone`, or one of
several tasks' prompts about one record (`reused`: the part they share, the head and the record,
prefilled once for all of them and read from the engine's prefix cache; each task's latency
counts that prefill)."""


def prefix_part(n_tasks: int) -> Prefix:
    """The `prefix` label of each of `n_tasks` prompts about one record answered together
    (`Predictor.answer_all`)."""
    return "alone" if n_tasks == 1 else "reused"


ENGINE_METRIC_PREFIX = "vllm:"
"""The engine's own metrics (vLLM registers them in the process's default registry)."""
SERVICE_METRIC_PREFIX = "medtpe_"
MULTIPROCESS_DIR_ENV = "PROMETHEUS_MULTIPROC_DIR"
"""prometheus_client's directory of per-process value files (multiprocess mode)."""


class Families:
    """A collector of the families `source()` yields whose names start with one of `prefixes`."""

    def __init__(self, source: Callable[[], Iterable[Metric]], *prefixes: str) -> None:
        self._source = source
        self._prefixes = prefixes

    def collect(self) -> Iterator[Metric]:
        """The selected families."""
        return (m for m in self._source() if m.name.startswith(self._prefixes))


def multiprocess_exposition(directory: Path) -> bytes:
    """The `medtpe_*` and `vllm:*` families of every process writing to `directory`, merged;
    counters apart from the rest, so `medtpe_prompt_tokens` (a counter and a histogram) never
    merge into one family."""
    files = [str(f) for f in sorted(directory.glob("*.db"))]
    counters = [f for f in files if Path(f).name.startswith("counter_")]
    others = [f for f in files if f not in counters]
    prefixes = (SERVICE_METRIC_PREFIX, ENGINE_METRIC_PREFIX)
    return b"".join(
        generate_latest(Families(lambda g=group: MultiProcessCollector.merge(g), *prefixes))  # type: ignore[arg-type]
        for group in (others, counters)
    )


class ServiceMetrics:
    """The `medtpe_*` metrics, registered in a registry of their own."""

    content_type = CONTENT_TYPE_LATEST

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self._counter_registry = CollectorRegistry()
        reg = self.registry
        self._answer_metrics(reg)
        self._admission_metrics(reg)
        self._cds_metrics(reg)
        self.engine_ready = Gauge(
            "medtpe_engine_ready",
            "1 when the engine is loaded, warmed up and alive.",
            registry=reg,
            multiprocess_mode="liveall",
        )
        self._drift_metrics(reg)
        self._shadow_metrics(reg)

    def _answer_metrics(self, reg: CollectorRegistry) -> None:
        """Latency of requests and generations, prompt lengths and compression, answer
        formats."""
        self.request_latency = Histogram(
            "medtpe_request_latency_seconds",
            "End-to-end request latency.",
            ["endpoint", "task"],
            buckets=LATENCY_BUCKETS,
            registry=reg,
        )
        self.generation_latency = Histogram(
            "medtpe_generation_latency_seconds",
            "Engine generation latency per record, by the part of its prompt it shared with "
            "other tasks' about the same record (alone; reused: the record prefilled once for "
            "every task and read from the prefix cache, that prefill counted in each).",
            ["task", "mode", "prefix"],
            buckets=LATENCY_BUCKETS,
            registry=reg,
        )
        self.prompt_tokens_total = Counter(
            "medtpe_prompt_tokens",
            "Prompt tokens, by tokenizer.",
            ["tokenizer", "task"],
            registry=self._counter_registry,
        )
        self.prompt_tokens = Histogram(
            "medtpe_prompt_tokens",
            "Prompt length per record, by tokenizer.",
            ["tokenizer", "task"],
            buckets=TOKEN_BUCKETS,
            registry=reg,
        )
        self.compression_rate = Histogram(
            "medtpe_compression_rate",
            "1 - medtpe tokens / original tokens, per record.",
            ["task"],
            buckets=RATE_BUCKETS,
            registry=reg,
        )
        self.format_compliance = Counter(
            "medtpe_format_compliance",
            "Answers whose format parsed (ok) or not (fail).",
            ["task", "result"],
            registry=reg,
        )
        self.trailing_text = Counter(
            "medtpe_answer_trailing_text",
            "Answer samples with text after their answer object (reported, never parsed).",
            ["task"],
            registry=reg,
        )
        self.prefill_reused_tokens = Counter(
            "medtpe_prefill_reused_tokens",
            "Prompt tokens the engine reused from its prefix cache instead of computing them.",
            ["door"],
            registry=reg,
        )

    def _admission_metrics(self, reg: CollectorRegistry) -> None:
        """Requests in flight, rejected before generation, failed."""
        self.inflight = Gauge(
            "medtpe_inflight_requests",
            "Prediction requests being served.",
            registry=reg,
            multiprocess_mode="livesum",
        )
        self.rejections = Counter(
            "medtpe_rejections", "Requests rejected before generation.", ["reason"], registry=reg
        )
        self.errors = Counter("medtpe_errors", "Failed requests.", ["reason"], registry=reg)

    def _cds_metrics(self, reg: CollectorRegistry) -> None:
        """The CDS Hooks service: calls and feedback by outcome, the state store, the fetches
        from the EHR."""
        self.cds_calls = Counter(
            "medtpe_cds_hook_calls",
            "CDS Hooks calls by service and outcome (card, cached, unauthorized, precondition, "
            "invalid, error).",
            ["service", "outcome"],
            registry=reg,
        )
        self.cds_feedback = Counter(
            "medtpe_cds_feedback",
            "CDS Hooks card feedback by service and outcome (accepted, overridden).",
            ["service", "outcome"],
            registry=reg,
        )
        self.state_failures = Counter(
            "medtpe_state_store_failures",
            "State store operations that failed (claim: the hook call got 503; get, put: the "
            "score was recomputed).",
            ["operation"],
            registry=reg,
        )
        self.score_entries_refused = Counter(
            "medtpe_state_score_entries_refused",
            "Score cache entries found in the state store and refused, by reason "
            "(unauthenticated: no valid MAC; expired: a valid one past its time to live): each "
            "a miss, the score recomputed.",
            ["reason"],
            registry=reg,
        )
        self.cds_fhir_fetch = Histogram(
            "medtpe_cds_fhir_fetch_seconds",
            "Time of one hook call's fetches from the EHR's FHIR server.",
            buckets=LATENCY_BUCKETS,
            registry=reg,
        )

    def _shadow_metrics(self, reg: CollectorRegistry) -> None:
        """The live fidelity shadow's figures by task (`medtpe.service.plumbing.shadow`)."""
        self.shadow_answers = Counter(
            "medtpe_shadow_answers",
            "Shadow answers recorded (the original tokenizer's ids on the same engine).",
            ["task"],
            registry=reg,
        )
        self.shadow_agreements = Counter(
            "medtpe_shadow_agreements",
            "Shadow answers equal to the answer they shadow.",
            ["task"],
            registry=reg,
        )
        self.shadow_abs_dp = Histogram(
            "medtpe_shadow_abs_dp",
            "|p(yes) of the answer - p(yes) of its shadow|, pairs with both.",
            ["task"],
            buckets=ABS_DP_BUCKETS,
            registry=reg,
        )
        self.shadow_dropped = Counter(
            "medtpe_shadow_dropped",
            "Shadows drawn but not recorded (busy, queue_full, failed).",
            ["task", "reason"],
            registry=reg,
        )

    def observe_shadow(self, task: str, shown: PredictionRow, shadow: PredictionRow) -> None:
        """Count a recorded shadow pair: agreement of the answers, |Δp| when both have a p."""
        self.shadow_answers.labels(task).inc()
        if shadow.answer == shown.answer:
            self.shadow_agreements.labels(task).inc()
        if shadow.p_yes is not None and shown.p_yes is not None:
            self.shadow_abs_dp.labels(task).observe(abs(shadow.p_yes - shown.p_yes))

    def _drift_metrics(self, reg: CollectorRegistry) -> None:
        """The drift counters (`medtpe.inference.drift`), by task and site: the CDS service's id for
        a hook's answers, `API_SITE` for `/predict` and `/predict/batch` (configured names only,
        never a caller's text); and the artefact's build compression, their reference."""
        labels = ["task", "site"]
        self.drift_events = Counter(
            "medtpe_drift_events",
            "Events the prompt could show (static and up to the prediction time).",
            labels,
            registry=reg,
        )
        self.drift_events_dropped = Counter(
            "medtpe_drift_events_dropped",
            "Events the input budget left out of the prompt.",
            labels,
            registry=reg,
        )
        self.drift_events_undescribed = Counter(
            "medtpe_drift_events_undescribed",
            "Shown events whose code has no description (shown as the raw code).",
            labels,
            registry=reg,
        )
        self.fhir_elements_dropped = Counter(
            "medtpe_fhir_elements_dropped",
            "Faulty FHIR elements left out of the resources read (docs/integration.md).",
            labels,
            registry=reg,
        )
        self.drift_prompt_tokens = Counter(
            "medtpe_drift_prompt_tokens",
            "Prompt tokens by tokenizer (original, medtpe).",
            [*labels, "tokenizer"],
            registry=reg,
        )
        self.drift_merged_tokens = Counter(
            "medtpe_drift_merged_tokens",
            "MedTPE prompt ids that are the artefact's merged (new) tokens.",
            labels,
            registry=reg,
        )
        self.build_compression = Gauge(
            "medtpe_artefact_build_compression_rate",
            "Prompt compression the artefact's build measured (build_report.json).",
            registry=reg,
            multiprocess_mode="max",
        )

    def observe_drift(self, site: str, model: LoadedModel, record: PreparedRecord) -> None:
        """Add the drift counts of `record`, prepared by `model`, under its task and `site`
        (and, for a FHIR record, the faulty elements its mapping left out)."""
        predictor = model.predictor
        figures = drift_figures(record, predictor.tokenizer, predictor.descriptions)
        task = record.task.name
        self.drift_events.labels(task, site).inc(figures.events)
        self.drift_events_dropped.labels(task, site).inc(figures.events_dropped)
        self.drift_events_undescribed.labels(task, site).inc(figures.events_undescribed)
        tokens = self.drift_prompt_tokens
        tokens.labels(task, site, "original").inc(figures.original_tokens)
        tokens.labels(task, site, "medtpe").inc(figures.medtpe_tokens)
        self.drift_merged_tokens.labels(task, site).inc(figures.merged_tokens)
        if record.fhir is not None and record.fhir.warnings:
            self.fhir_elements_dropped.labels(task, site).inc(len(record.fhir.warnings))
        build = build_compression_rate(model.bundle.path)
        if build is not None:
            self.build_compression.set(build)

    def observe_answer(
        self, task: str, mode: str, seg: Segmentation, answer: Answer, prefix: Prefix = "alone"
    ) -> None:
        """Record the generation time, token counts, compression, format compliance and trailing
        text of one answered record; `prefix`: the part of its prompt shared with other tasks'
        (`prefix_part`)."""
        self.generation_latency.labels(task, mode, prefix).observe(answer.generate_s)
        for tokenizer, ids in (("original", seg.original_ids), ("medtpe", seg.medtpe_ids)):
            self.prompt_tokens_total.labels(tokenizer, task).inc(len(ids))
            self.prompt_tokens.labels(tokenizer, task).observe(len(ids))
        self.compression_rate.labels(task).observe(seg.compression_rate)
        self.format_compliance.labels(task, "ok" if answer.format_ok else "fail").inc()
        if answer.n_trailing:
            self.trailing_text.labels(task).inc(answer.n_trailing)

    def render(self) -> bytes:
        """The exposition text: the service's metrics, then the engine's (`vllm:*`); in
        multiprocess mode, those of every API process."""
        if directory := os.environ.get(MULTIPROCESS_DIR_ENV):
            return multiprocess_exposition(Path(directory))
        own = generate_latest(self.registry) + generate_latest(self._counter_registry)
        engine = Families(REGISTRY.collect, ENGINE_METRIC_PREFIX)
        return own + generate_latest(engine)  # type: ignore[arg-type]
