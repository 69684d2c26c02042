"""Prometheus metrics. Labels stay low-cardinality: route names, upstream names,
causes and statuses; never a run id, a model requested by a client, a prompt or a key.

With several worker processes (``serve --workers N``) every process writes its
values to files in ``PROMETHEUS_MULTIPROC_DIR`` and ``/metrics`` sums them, so a
scrape that lands on any worker sees the whole replica (prometheus-client's
multiprocess mode; the CLI creates and wipes the directory at start).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Self

import prometheus_client
from prometheus_client import CollectorRegistry, disable_created_metrics, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from prometheus_client.metrics import MetricWrapperBase
from prometheus_client.multiprocess import MultiProcessCollector, mark_process_dead

MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"

# No ``*_created`` series: they double what is scraped and no panel or rule uses them.
disable_created_metrics()  # type: ignore[no-untyped-call]

# LLM latencies span from tens of milliseconds (cached, small models) to a minute
# (reasoning models before their first token).
LATENCY_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1, 2, 4, 8, 15, 30, 60)
# A checkpoint write is one round trip to Redis for every due run: about a millisecond
# on an idle process, tens of milliseconds behind a busy event loop.
WRITE_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2)
DURATION_BUCKETS = (0.1, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600)


class _RememberedLabels(MetricWrapperBase):
    """``labels()`` that remembers its children by label values: prometheus-client
    checks and converts the values and takes a lock on every call (about 4 µs), and a
    request makes several. The label sets are the metric's own, so bounded alike."""

    _remembered: dict[tuple[object, ...], Any]

    def labels(self, *labelvalues: object, **labelkwargs: object) -> Self:
        if labelkwargs:
            return super().labels(*labelvalues, **labelkwargs)
        try:
            remembered = self._remembered
        except AttributeError:
            remembered = self._remembered = {}
        child: Self | None = remembered.get(labelvalues)
        if child is None:
            child = remembered[labelvalues] = super().labels(*labelvalues)
        return child


class Counter(_RememberedLabels, prometheus_client.Counter):
    pass


class Gauge(_RememberedLabels, prometheus_client.Gauge):
    pass


class Histogram(_RememberedLabels, prometheus_client.Histogram):
    pass


class Metrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        r = self.registry
        self.requests = Counter(
            "gateway_requests_total",
            "Requests answered, by route, method and HTTP status. route: the configured "
            "route's match for chat completions; passthrough, runs, ops, or none otherwise.",
            ["route", "method", "status"],
            registry=r,
        )
        self.active_streams = Gauge(
            "gateway_active_streams",
            "Streaming runs currently relayed.",
            registry=r,
            multiprocess_mode="livesum",  # a dead worker's streams are not open any more
        )
        self.websockets = Gauge(
            "gateway_websockets_open",
            "Responses API WebSocket connections currently open (Codex CLI's transport).",
            registry=r,
            multiprocess_mode="livesum",
        )
        self.websocket_refusals = Counter(
            "gateway_websocket_refusals_total",
            "WebSocket upgrades answered 426 (the client falls back to HTTP), by reason: "
            "path (no WebSocket there), disabled (websocket.enabled: false), full "
            "(websocket.max_connections open).",
            ["reason"],
            registry=r,
        )
        self.ready = Gauge(
            "gateway_ready",
            "1 when this replica would answer /readyz with 200 (set at each probe and scrape).",
            registry=r,
            multiprocess_mode="livemostrecent",
        )
        self.ttfb = Histogram(
            "gateway_time_to_first_byte_seconds",
            "From request received to the first byte of the response body sent to the client.",
            ["route"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.ttft = Histogram(
            "gateway_time_to_first_token_seconds",
            "From request received to the first content delta sent to the client.",
            ["route"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.stream_duration = Histogram(
            "gateway_stream_duration_seconds",
            "From request received to the end of the client stream.",
            ["route"],
            buckets=DURATION_BUCKETS,
            registry=r,
        )
        self.interruptions = Counter(
            "gateway_interruptions_total",
            "Upstream streams that broke, by upstream and cause.",
            ["upstream", "cause"],
            registry=r,
        )
        self.attempts = Counter(
            "gateway_upstream_attempts_total",
            "Upstream requests, by upstream, leg (0: primary) and result.",
            ["upstream", "leg", "result"],
            registry=r,
        )
        self.recoveries = Counter(
            "gateway_recoveries_total",
            "Recoveries of interrupted streams, by plan and outcome.",
            ["plan", "outcome"],
            registry=r,
        )
        self.seam_trimmed = Counter(
            "gateway_seam_trimmed_characters_total",
            "Characters a continuation repeated at the seam, trimmed before the client.",
            registry=r,
        )
        self.upstream_cancels = Counter(
            "gateway_upstream_cancels_total",
            "Upstream background responses cancelled because no run would read them (a "
            "run abandoned, or recovered by another plan), by upstream and outcome.",
            ["upstream", "outcome"],
            registry=r,
        )
        self.prefill_refusals = Counter(
            "gateway_continuation_prefill_refused_total",
            "Continuations refused for ending with an assistant message (prefill), by "
            "upstream and mode; that upstream's model is continued in prompt mode from then on.",
            ["upstream", "mode"],
            registry=r,
        )
        self.seams = Counter(
            "gateway_seams_total",
            "Continuation seams by what was cut: echo (the anchor a prompt-mode model was "
            "asked to repeat, or a prefix_echo upstream's prefix), restart, none, or diverged "
            "(a reply that did not do as asked, never shown: a verified replay follows).",
            ["cut"],
            registry=r,
        )
        self.tokens = Counter(
            "gateway_tokens_total",
            "Tokens by kind (prompt, completion), leg, and source: reported by the upstream, "
            "or estimated for a leg that broke before it reported (gateway/recovery/usage.py).",
            ["kind", "leg", "source"],
            registry=r,
        )
        self.relayed_bytes = Counter(
            "gateway_relayed_bytes_total",
            "Response body bytes sent to clients, by route.",
            ["route"],
            registry=r,
        )
        self.circuit_open = Gauge(
            "gateway_circuit_open",
            "1 while an upstream's circuit is open or half-open (its legs are skipped), "
            "0 while closed; with several workers, the number of workers where it is not closed.",
            ["upstream"],
            registry=r,
            multiprocess_mode="livesum",
        )
        self.circuit_transitions = Counter(
            "gateway_circuit_transitions_total",
            "Changes of an upstream's circuit state, by upstream and the state entered "
            "(open, half_open, closed).",
            ["upstream", "state"],
            registry=r,
        )
        self.malformed_events = Counter(
            "gateway_upstream_malformed_events_total",
            "Upstream SSE events that were not JSON objects (skipped).",
            ["upstream"],
            registry=r,
        )

        self.checkpoint_writes = Counter(
            "gateway_checkpoint_writes_total",
            "Run checkpoints written to the store, by result (ok; unreplicated: no replica "
            "acknowledged in time; error; fenced: another replica took the run over; gap: "
            "the stored log ended before the write's first event, rewritten whole).",
            ["result"],
            registry=r,
        )
        self.unprotected_events = Counter(
            "gateway_unprotected_events_total",
            "Events released to clients before their checkpoint was acknowledged, because "
            "the store failed (durability: sync).",
            registry=r,
        )
        self.checkpoint_write_seconds = Histogram(
            "gateway_checkpoint_write_seconds",
            "Latency of one batched checkpoint write (all due runs in one round trip).",
            buckets=WRITE_BUCKETS,
            registry=r,
        )
        self.resumes = Counter(
            "gateway_resumes_total",
            "Client resumes, by kind (local, replay, tail, takeover) and outcome (ok; not_exact: "
            "a position beyond the stored log, refused; error; not_found).",
            ["kind", "outcome"],
            registry=r,
        )
        self.detached_cancelled = Counter(
            "gateway_detached_runs_cancelled_total",
            "Runs cancelled because no client came back within the detach grace period.",
            registry=r,
        )
        self.detached_bytes = Gauge(
            "gateway_detached_run_bytes",
            "Bytes of client events held in memory for runs no client reads (detached, "
            "left behind, or finished and kept): what state.detached_memory bounds.",
            registry=r,
            multiprocess_mode="livesum",
        )
        self.detached_evicted = Counter(
            "gateway_detached_runs_evicted_total",
            "Runs no client reads let go over state.detached_memory, by reason: finished "
            "(kept for late resumers, no store), over_budget (a detached run stopped, after "
            "a last checkpoint).",
            ["reason"],
            registry=r,
        )
        for reason in ("finished", "over_budget"):  # both exported from the start, at 0
            self.detached_evicted.labels(reason)
        self.runs_too_large = Counter(
            "gateway_runs_too_large_total",
            "Answers ended with an error (code run_too_large) because their events passed "
            "state.max_run_bytes.",
            registry=r,
        )

    def render(self) -> tuple[bytes, str]:
        if multiprocess_dir() is None:
            return generate_latest(self.registry), CONTENT_TYPE_LATEST
        # Every worker's values, summed; built per scrape, as prometheus-client advises.
        registry = CollectorRegistry()
        MultiProcessCollector(registry)  # type: ignore[no-untyped-call]
        return generate_latest(registry), CONTENT_TYPE_LATEST


def multiprocess_dir() -> str | None:
    return os.environ.get(MULTIPROC_ENV) or None


def sweep_dead_workers() -> None:
    """Drop the live gauges of workers that died without ``process_exited`` (SIGKILL,
    a crash): uvicorn replaces them, and their open streams are not open any more."""
    directory = multiprocess_dir()
    if directory is None:
        return
    for path in Path(directory).glob("gauge_live*_*.db"):
        pid = int(path.stem.rpartition("_")[2])
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            mark_process_dead(pid)  # type: ignore[no-untyped-call]
        except PermissionError:
            pass  # alive, another user's


def process_exited() -> None:
    """Drop this process's live gauges from the shared directory (multiprocess mode)."""
    if multiprocess_dir() is not None:
        mark_process_dead(os.getpid())  # type: ignore[no-untyped-call]
