"""Prometheus metrics with vLLM's names where one exists, plus v4serve's own.

Engine counters and gauges come from the engine's snapshot (read between two steps of an
engine in this process; pushed with each step's outputs by a separate engine core, so a
scrape never waits for a step); request latencies are observed by the server as streams
progress.
"""
from __future__ import annotations

from prometheus_client import CollectorRegistry, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

LATENCY_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0,
                   2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0)


class Metrics:
    def __init__(self, engine, model_name: str):
        self.engine, self.labels = engine, {"model_name": model_name}
        self.registry = CollectorRegistry()
        names = ["model_name"]
        self.ttft = Histogram("vllm:time_to_first_token_seconds", "Time to first token",
                              names, buckets=LATENCY_BUCKETS, registry=self.registry)
        self.itl = Histogram("vllm:inter_token_latency_seconds", "Inter-token latency",
                             names, buckets=LATENCY_BUCKETS, registry=self.registry)
        self.e2e = Histogram("vllm:e2e_request_latency_seconds", "End-to-end request latency",
                             names, buckets=LATENCY_BUCKETS, registry=self.registry)
        self.registry.register(_EngineCollector(engine, model_name))

    def observe_first(self, seconds: float) -> None:
        self.ttft.labels(**self.labels).observe(seconds)

    def observe_gap(self, seconds: float) -> None:
        self.itl.labels(**self.labels).observe(seconds)

    def observe_end(self, seconds: float) -> None:
        self.e2e.labels(**self.labels).observe(seconds)

    def render(self) -> bytes:
        return generate_latest(self.registry)


class _EngineCollector:
    def __init__(self, engine, model_name: str):
        self.engine, self.model_name = engine, model_name

    def collect(self):
        snap, m = self.engine.snapshot(), self.model_name
        if snap is None:                     # an engine core still loading
            return []

        def gauge(name, doc, value):
            family = GaugeMetricFamily(name, doc, labels=["model_name"])
            family.add_metric([m], value)
            return family

        def counter(name, doc, value):
            family = CounterMetricFamily(name, doc, labels=["model_name"])
            family.add_metric([m], value)
            return family

        families = [
            gauge("vllm:num_requests_running", "Requests running", snap["running"]),
            gauge("vllm:num_requests_waiting", "Requests waiting", snap["waiting"]),
            gauge("vllm:kv_cache_usage_perc", "Fullest pool group on the fullest rank, 0-1",
                  snap["kv_usage"]),
            counter("vllm:prompt_tokens", "Prompt tokens prefilled", snap["prompt_tokens"]),
            counter("vllm:generation_tokens", "Tokens generated", snap["generation_tokens"]),
            counter("vllm:num_preemptions", "Preemptions", snap["preemptions"]),
            counter("vllm:spec_decode_num_drafts", "MTP drafts", snap["drafts"]),
            counter("vllm:spec_decode_num_draft_tokens", "MTP draft tokens",
                    snap["draft_tokens"]),
            counter("vllm:spec_decode_num_accepted_tokens", "MTP accepted draft tokens",
                    snap["accepted_tokens"]),
            counter("vllm:prefix_cache_queries", "Prompt tokens looked up in the prefix cache",
                    snap["prefix_cache"]["queries"]),
            counter("vllm:prefix_cache_hits", "Prompt tokens found in the prefix cache",
                    snap["prefix_cache"]["hits"]),
        ]
        dispatches = CounterMetricFamily("v4serve:dispatches", "Kernel launches by kernel",
                                         labels=["model_name", "kernel"])
        for kernel, count in sorted(snap["dispatches"].items()):
            dispatches.add_metric([m, kernel], count)
        pools = GaugeMetricFamily("v4serve:pool_usage_perc", "Used fraction of a pool group",
                                  labels=["model_name", "group", "rank"])
        for key, used in snap["pool_usage"].items():
            group, rank = key.split("/")
            pools.add_metric([m, group, rank], used)
        return families + [dispatches, pools, *_speculation(snap, m)]


def _speculation(snap: dict, m: str) -> list:
    """Drafts kept per draft position (vLLM's name) and decode steps per K (the K the
    speculation policy chose for each)."""
    per_position = CounterMetricFamily(
        "vllm:spec_decode_num_accepted_tokens_per_pos",
        "MTP draft tokens accepted at each draft position", labels=["model_name", "position"])
    for position, count in enumerate(snap.get("accepted_per_position", [])):
        per_position.add_metric([m, str(position)], count)
    by_k = CounterMetricFamily("v4serve:spec_decode_steps",
                               "Decode steps by the number of MTP drafts (K) each ran",
                               labels=["model_name", "k"])
    for k, count in snap.get("decode_steps_by_k", {}).items():
        by_k.add_metric([m, k], count)
    return [per_position, by_k]
