"""Prometheus metrics of the service (names fixed in docs/architecture.md).

Each app instance owns its registries, so several instances (tests, side-by-side modes) never
share counters. Labels carry only endpoint, task, mode, tokenizer, result and reason: no patient
data. The counter `medtpe_prompt_tokens_total` and the histogram `medtpe_prompt_tokens` share a
base name, which one registry refuses: the counter lives in a second registry and `_created`
series are off, so the text exposition (0.0.4) holds each name once.
"""

from __future__ import annotations

from collections.abc import Iterator

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

from inference.predictor import Answer, Segmentation

disable_created_metrics()

LATENCY_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 20, 40, 80, 160, 320)
TOKEN_BUCKETS = (64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384)
RATE_BUCKETS = tuple(round(0.05 * i, 2) for i in range(0, 21))


ENGINE_METRIC_PREFIX = "vllm:"
"""The engine's own metrics (vLLM registers them in the process's default registry)."""


class EngineFamilies:
    """The `vllm:*` families of the default registry, without its process and GC metrics."""

    def collect(self) -> Iterator[Metric]:
        """The default registry's families whose name starts with `vllm:`."""
        return (m for m in REGISTRY.collect() if m.name.startswith(ENGINE_METRIC_PREFIX))


class ServiceMetrics:
    """The `medtpe_*` metrics, registered in a registry of their own."""

    content_type = CONTENT_TYPE_LATEST

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self._counter_registry = CollectorRegistry()
        reg = self.registry
        self.request_latency = Histogram(
            "medtpe_request_latency_seconds",
            "End-to-end request latency.",
            ["endpoint", "task"],
            buckets=LATENCY_BUCKETS,
            registry=reg,
        )
        self.generation_latency = Histogram(
            "medtpe_generation_latency_seconds",
            "Engine generation latency per record.",
            ["task", "mode"],
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
        self.inflight = Gauge(
            "medtpe_inflight_requests", "Prediction requests being served.", registry=reg
        )
        self.rejections = Counter(
            "medtpe_rejections", "Requests rejected before generation.", ["reason"], registry=reg
        )
        self.errors = Counter("medtpe_errors", "Failed requests.", ["reason"], registry=reg)
        self.engine_ready = Gauge(
            "medtpe_engine_ready", "1 when the engine is loaded, warmed up and alive.", registry=reg
        )

    def observe_answer(self, task: str, mode: str, seg: Segmentation, answer: Answer) -> None:
        """Record the generation time, token counts, compression and format compliance of one
        answered record."""
        self.generation_latency.labels(task, mode).observe(answer.generate_s)
        for tokenizer, ids in (("original", seg.original_ids), ("medtpe", seg.medtpe_ids)):
            self.prompt_tokens_total.labels(tokenizer, task).inc(len(ids))
            self.prompt_tokens.labels(tokenizer, task).observe(len(ids))
        self.compression_rate.labels(task).observe(seg.compression_rate)
        self.format_compliance.labels(task, "ok" if answer.format_ok else "fail").inc()

    def render(self) -> bytes:
        """The exposition text: the service's metrics, then the engine's (`vllm:*`)."""
        own = generate_latest(self.registry) + generate_latest(self._counter_registry)
        return own + generate_latest(EngineFamilies())  # type: ignore[arg-type]
