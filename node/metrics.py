"""Prometheus metrics of one node: per-RPC counts and latencies, component health, library version."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from typing import Any
from wsgiref.simple_server import WSGIServer

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, Info, start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from zoo.node.lifecycle import State, Status


class NodeMetrics:
    """The node's metrics, in a registry of its own (so several nodes in one process never collide)."""

    def __init__(self, version: str) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        Info("zoo_node", "zoo-node build information", registry=r).info({"version": version})
        self._add_rpc_metrics(r)
        self._add_component_metrics(r)
        self._add_library_metrics(r)
        self._add_credit_metrics(r)
        self._add_job_metrics(r)
        self._add_p2p_metrics(r)
        self._add_serving_metrics(r)
        self._server: WSGIServer | None = None
        self._thread: threading.Thread | None = None

    def component_changed(self, status: Status) -> None:
        self.component_up.labels(status.name).set(1 if status.state.usable else 0)
        for state in State:
            self.component_state.labels(status.name, state.value).set(1 if state is status.state else 0)

    def watch_serving(self, stats: Callable[[], Any]) -> None:
        """Export the generation load read from `stats()` (a ServingStats proto) at each scrape."""
        self.registry.register(_ServingCollector(stats))

    def serve(self, host: str, port: int) -> int:
        """Start the HTTP endpoint in a thread; returns the bound port."""
        self._server, self._thread = start_http_server(port, addr=host, registry=self.registry)
        return int(self._server.server_port)

    def shutdown(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def _add_rpc_metrics(self, r: CollectorRegistry) -> None:
        """gRPC: requests by method and code, handling time, refusals before running."""
        self.rpc_requests = Counter(
            "zoo_rpc_requests",
            "gRPC requests handled, by method and status code",
            ["method", "code"],
            registry=r,
        )
        self.rpc_latency = Histogram(
            "zoo_rpc_latency_seconds",
            "gRPC handling time by method",
            ["method"],
            buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60),
            registry=r,
        )
        self.rpc_rejected = Counter(
            "zoo_rpc_rejected",
            "RPCs refused before running (auth, overload)",
            ["method", "reason"],
            registry=r,
        )

    def _add_component_metrics(self, r: CollectorRegistry) -> None:
        """Each component's health: usable or not, and its current state."""
        self.component_up = Gauge(
            "zoo_component_up",
            "1 when the component is serving or degraded, else 0",
            ["component"],
            registry=r,
        )
        self.component_state = Gauge(
            "zoo_component_state",
            "1 for the component's current state (starting, serving, degraded, failed, disabled), else 0",
            ["component", "state"],
            registry=r,
        )

    def _add_library_metrics(self, r: CollectorRegistry) -> None:
        """The active library: its version and size, versions refused, experiences placed in prompts."""
        self.library_version = Gauge(
            "zoo_library_version", "Version number of the active library", registry=r
        )
        self.library_experiences = Gauge(
            "zoo_library_experiences", "Experiences in the active library", registry=r
        )
        self.library_model_mismatch = Gauge(
            "zoo_library_model_mismatch",
            "1 while the active library names other model weights (by SHA-256) than this node serves: its "
            "experiences stay out of prompts",
            registry=r,
        )
        self.library_refused = Counter(
            "zoo_library_refused",
            "Approved library versions refused by verification, by reason",
            ["reason"],
            registry=r,
        )
        self.experiences_served = Counter(
            "zoo_experiences_served",
            "Experiences placed in prompts (per-id counts are in GetStatus)",
            registry=r,
        )

    def _add_credit_metrics(self, r: CollectorRegistry) -> None:
        """Credits: signed requests by outcome, failed settlement rounds, usage units credited."""
        self.signed_requests = Counter(
            "zoo_signed_requests",
            "Requests carrying a zoo-signature header, by outcome (accepted, malformed, stale, replayed, "
            "forged, busy)",
            ["outcome"],
            registry=r,
        )
        self.settlement_failures = Counter(
            "zoo_settlement_failures", "Settlement rounds that failed (and will be tried again)", registry=r
        )
        self.metered_units = Counter(
            "zoo_metered_units", "Usage units (answer tokens) credited to experience authors", registry=r
        )

    def _add_job_metrics(self, r: CollectorRegistry) -> None:
        """Learning jobs: those that ended, their steps, their LLM calls."""
        self.jobs_finished = Counter(
            "zoo_jobs_finished",
            "Learning jobs that ended, by kind and final state",
            ["kind", "state"],
            registry=r,
        )
        self.job_steps = Counter("zoo_job_steps", "Completed learning-job steps", ["kind"], registry=r)
        self.job_llm_calls = Counter(
            "zoo_job_llm_calls",
            "LLM calls made by learning jobs (rollouts, critique, validation)",
            ["kind"],
            registry=r,
        )

    def _add_p2p_metrics(self, r: CollectorRegistry) -> None:
        """Gossip: messages by topic and outcome, connected peers."""
        self.p2p_messages = Counter(
            "zoo_p2p_messages",
            "Gossip messages received, by topic and outcome (accepted, oversized, malformed, invalid, "
            "rate_limited, banned, other_network, bad_hint)",
            ["topic", "outcome"],
            registry=r,
        )
        self.p2p_peers = Gauge("zoo_p2p_peers", "Peers connected over libp2p", registry=r)

    def _add_serving_metrics(self, r: CollectorRegistry) -> None:
        """Serving: the wait for a generation slot, and the OpenAI-compatible HTTP requests and their time."""
        self.queue_wait = Histogram(
            "zoo_inference_queue_wait_seconds",
            "Time generation requests waited for a slot before running",
            buckets=(0.001, 0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120),
            registry=r,
        )
        self.http_requests = Counter(
            "zoo_http_requests",
            "OpenAI-compatible HTTP requests, by route and status",
            ["route", "status"],
            registry=r,
        )
        self.http_latency = Histogram(
            "zoo_http_latency_seconds",
            "OpenAI-compatible HTTP handling time by route (to the last byte of a stream)",
            ["route"],
            buckets=(0.001, 0.005, 0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60),
            registry=r,
        )


class _ServingCollector(Collector):
    """Batch and queue figures read at scrape time from the admission and the batcher."""

    def __init__(self, stats: Callable[[], Any]) -> None:
        self.stats = stats

    def collect(self) -> Iterator[Metric]:
        s = self.stats()
        yield GaugeMetricFamily("zoo_inference_running", "Generation requests holding a slot", s.running)
        yield GaugeMetricFamily("zoo_inference_waiting", "Generation requests waiting for a slot", s.waiting)
        yield GaugeMetricFamily(
            "zoo_inference_batch_size", "Rows in the model's last decode step", s.last_batch_size
        )
        refused = CounterMetricFamily(
            "zoo_inference_refused", "Generation requests refused by admission", labels=["reason"]
        )
        refused.add_metric(["queue_full"], s.refused_queue_full)
        refused.add_metric(["wait_timeout"], s.refused_wait_timeout)
        yield refused
        yield CounterMetricFamily(
            "zoo_inference_decode_steps", "Batched decode steps run by the model", value=s.decode_steps
        )
        yield CounterMetricFamily(
            "zoo_inference_decoded_tokens", "Tokens generated by batched decoding", value=s.decoded_tokens
        )
