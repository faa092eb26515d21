"""Prometheus metrics of one instance (`relaygr_*`), in a per-app registry.

Request-path metrics are observed by the HTTP layer as requests finish; cache and queue state is
read from `engine.stats()` at scrape time (`EngineStatsCollector`), so a scrape never blocks the
device thread and the numbers are never stale copies. Every counter exists from start-up, at 0
before its first event and for each of its known label values, so rates and alerts see it at once.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Iterator
from typing import Any

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Histogram,
    disable_created_metrics,
    generate_latest,
)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector

from mindspore_relaygr.relay.stats import EngineStats
from mindspore_relaygr.relay.trigger import REASONS
from mindspore_relaygr.relay.types import CACHE_TIERS, PreinferResult, RankResult
from serving.engine_holder import READY, EngineHolder

logger = logging.getLogger(__name__)

LATENCY_BUCKETS_S = (0.0005, 0.001, 0.0025, 0.005, 0.0075, 0.01, 0.015, 0.02, 0.03, 0.05, 0.075, 0.1, 0.15,
                     0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
NO_TIER = "none"  # cache label of endpoints other than /v1/rank
REJECTION_ENDPOINTS = ("/v1/rank", "/v1/preinfer")  # the routes whose 503s dashboards alert on
REJECTION_REASONS = ("overloaded", "not_ready")  # serving.errors' kinds of a 503

# Scrape-time metrics read from the typed `engine.stats()` (mindspore_relaygr.relay.stats.EngineStats):
# (name, kind, help, [(attribute path, labels)]). A path that does not resolve raises (tests check
# every path against a real engine), so a renamed field cannot silently zero a metric. A path through
# a tier that is switched off (None) is skipped for a gauge and 0 for a counter; before the engine is
# ready, every counter is 0.
STATS_METRICS: list[tuple[str, str, str, list[tuple[tuple[str, ...], dict[str, str]]]]] = [
    ("relaygr_queue_depth", "gauge", "Device-thread tasks waiting (ranks and prefill chunks).",
     [(("queue_depth",), {})]),
    ("relaygr_pending_prefills", "gauge", "Relays (prefills, DRAM prefetches) whose device work has not finished.",
     [(("relays", "pending_relays"), {})]),
    ("relaygr_cache_hits", "counter",
     "Ranks served from the cache, one per rank, by tier: device, dram (reloaded), partial (a cached prefix "
     "extended by the events since), inflight (waited for the prefix's relay).",
     [(("ranks", "device"), {"tier": "device"}), (("ranks", "dram"), {"tier": "dram"}),
      (("ranks", "partial"), {"tier": "partial"}), (("ranks", "inflight"), {"tier": "inflight"})]),
    ("relaygr_cache_misses", "counter",
     "Ranks a tier could not serve: device (served from DRAM or not cached), dram (in no tier: full inference).",
     [(("ranks", "device_misses"), {"tier": "device"}), (("ranks", "miss"), {"tier": "dram"})]),
    ("relaygr_cache_usage_bytes", "gauge", "Bytes held by cached prefixes, per tier.",
     [(("cache", "device", "bytes_in_use"), {"tier": "device"}),
      (("cache", "dram", "bytes_in_use"), {"tier": "dram"})]),
    ("relaygr_cache_device_slots", "gauge", "Device KV pool slots by state.",
     [(("cache", "device", "num_slots"), {"state": "total"}),
      (("cache", "device", "num_free_slots"), {"state": "free"}),
      (("cache", "device", "num_ready"), {"state": "ready"}),
      (("cache", "device", "num_reserved"), {"state": "reserved"})]),
    ("relaygr_cache_dram_entries", "gauge", "Prefixes held in host DRAM.",
     [(("cache", "dram", "num_entries"), {})]),
    ("relaygr_cache_evictions", "counter", "Cache evictions per tier and reason.",
     [(("cache", "device", "evictions_expired"), {"tier": "device", "reason": "expired"}),
      (("cache", "device", "evictions_lru"), {"tier": "device", "reason": "lru"}),
      (("cache", "device", "evictions_kept"), {"tier": "device", "reason": "kept"}),
      (("cache", "device", "evictions_released"), {"tier": "device", "reason": "released"}),
      (("cache", "dram", "expirations"), {"tier": "dram", "reason": "expired"}),
      (("cache", "dram", "evictions"), {"tier": "dram", "reason": "lru"})]),
    ("relaygr_cache_dram_reloads", "counter", "DRAM -> device reloads.", [(("cache", "dram", "reloads"), {})]),
    ("relaygr_cache_dram_reload_bytes", "counter", "Bytes copied from DRAM to the device.",
     [(("cache", "dram", "bytes_copied"), {})]),
    ("relaygr_cache_extended_tokens", "counter", "Events computed to extend a cached prefix.",
     [(("cache", "extended_tokens"), {})]),
    ("relaygr_trigger_inflight_slots", "gauge", "Relayed prefixes admitted and not yet consumed, expired or dropped.",
     [(("relays", "inflight_relays"), {})]),
    ("relaygr_trigger_inflight_bytes", "gauge", "Device bytes of relayed prefixes in flight.",
     [(("inflight_bytes",), {})]),
    ("relaygr_trigger_bucket_tokens", "gauge", "Pre-infer token-bucket level.", [(("trigger", "bucket_tokens"), {})]),
    ("relaygr_prefills", "counter", "Prefills that completed.", [(("work", "prefills"), {})]),
    ("relaygr_prefill_chunks", "counter", "Prefill chunks run on the device.", [(("work", "prefill_chunks"), {})]),
    ("relaygr_wasted_prefills", "counter", "Relayed prefixes evicted before any rank used them.",
     [(("relays", "dropped_evicted"), {})]),
    ("relaygr_expired_relays", "counter",
     "Relayed prefixes whose rank did not come within relay.ready_ttl_ms (they stop counting in the footprint).",
     [(("relays", "expired"), {})]),
    ("relaygr_prefill_errors", "counter", "Prefills that failed.", [(("work", "prefill_errors"), {})]),
    ("relaygr_audit_checks", "counter", "Cached ranks recomputed by full inference by the exactness audit.",
     [(("audit", "checked"), {})]),
    ("relaygr_audit_failures", "counter",
     "Audited ranks whose cached scores differed from full inference by more than 1e-5 (entry dropped).",
     [(("audit", "failures"), {})]),
    ("relaygr_audit_skipped", "counter", "Ranks sampled for the audit but not checked (audit queue full).",
     [(("audit", "skipped"), {})]),
]


def _lookup(stats: Any, path: tuple[str, ...]) -> float | None:
    """The number at `path` (attribute names) in `stats`; None through a tier that is off (None)."""
    for name in path:
        if stats is None:
            return None
        stats = getattr(stats, name)  # AttributeError: the metric names a field the stats no longer have
    return None if stats is None else float(stats)


def _stats_families(stats: EngineStats | None) -> Iterator[Metric]:
    """The STATS_METRICS families of `stats` (None: the engine is not ready yet, every counter at 0)."""
    for name, kind, doc, sources in STATS_METRICS:
        label_names = sorted({k for _, labels in sources for k in labels})
        family = (GaugeMetricFamily if kind == "gauge" else CounterMetricFamily)(name, doc, labels=label_names)
        for path, labels in sources:
            value = _lookup(stats, path)
            if value is None and kind == "counter":
                value = 0.0  # no event yet, or a tier that is off
            if value is not None:
                family.add_metric([labels[k] for k in label_names], value)
        if family.samples:
            yield family


BATCH_SIZE_BUCKETS = (1, 2, 4, 8, 16)


def _batch_sizes(batches: dict[str, dict[int, int]]) -> HistogramMetricFamily:
    """Users per device call of the batched work, per kind of work: "rank" (relay.max_rank_batch) and
    "prefill_chunk" (relay.max_prefill_batch)."""
    family = HistogramMetricFamily("relaygr_device_batch_size", "Users per device call of batched work: ranks "
                                   "served from device slots (relay.max_rank_batch), prefill chunks "
                                   "(relay.max_prefill_batch).", labels=["work"])
    for work, sizes in batches.items():
        cumulative = [(str(b), float(sum(n for size, n in sizes.items() if size <= b))) for b in BATCH_SIZE_BUCKETS]
        cumulative.append(("+Inf", float(sum(sizes.values()))))
        family.add_metric([work], cumulative, float(sum(size * n for size, n in sizes.items())))
    return family


class EngineStatsCollector(Collector):
    """Turns `engine.stats()` into gauges and counters when Prometheus scrapes."""

    def __init__(self, holder: EngineHolder, instance_id: str) -> None:
        self.holder = holder
        self.instance_id = instance_id

    def collect(self) -> Iterator[Metric]:
        ready = self.holder.state == READY
        yield GaugeMetricFamily("relaygr_engine_ready", "1 once the engine is warmed up and calibrated.",
                                value=1.0 if ready else 0.0)
        engine = self.holder.peek()
        info = GaugeMetricFamily("relaygr_instance_info", "Instance identity (value is always 1).",
                                 labels=["instance", "model_version", "pid"])
        info.add_metric([self.instance_id, engine.model_version if engine else "", str(os.getpid())], 1.0)
        yield info
        if not self.holder.serving or engine is None:  # a draining engine still has its stats
            yield from _stats_families(None)
            return
        try:
            stats = engine.stats()
        except Exception:  # noqa: BLE001 - a failing stats() must not fail the scrape
            logger.exception("engine.stats() failed during a metrics scrape")
            return
        yield from _stats_families(stats)
        yield _batch_sizes(stats.device_batches)
        yield HistogramMetricFamily("relaygr_audit_max_abs_diff",
                                    "Max |cached - full| score difference of each audited rank.",
                                    buckets=stats.audit.histogram(), sum_value=stats.audit.diff_sum)


class ServingMetrics:
    """Every metric of one app, registered in its own CollectorRegistry."""

    def __init__(self, holder: EngineHolder, instance_id: str) -> None:
        disable_created_metrics()  # no *_created series (process-wide, as vLLM does)
        r = self.registry = CollectorRegistry()
        self.requests = Counter("relaygr_http_requests", "HTTP requests by endpoint, method and status.",
                                ["endpoint", "method", "status"], registry=r)
        self.latency = Histogram("relaygr_request_latency_seconds",
                                 "End-to-end handling time per endpoint and cache tier (tier 'none' off /v1/rank).",
                                 ["endpoint", "cache"], buckets=LATENCY_BUCKETS_S, registry=r)
        self.rank_phase = Histogram("relaygr_rank_phase_seconds",
                                    "Engine-reported phases of a rank (wait, queue, compute, total).",
                                    ["phase"], buckets=LATENCY_BUCKETS_S, registry=r)
        self.rank_tiers = Counter("relaygr_rank_requests", "Ranks served, by the cache tier that served them.",
                                  ["cache"], registry=r)
        self.trigger = Counter("relaygr_trigger_decisions", "Pre-infer decisions of the trigger, by reason.",
                               ["reason"], registry=r)
        self.rejections = Counter("relaygr_rejections", "Requests answered 503 (overloaded or not ready).",
                                  ["endpoint", "reason"], registry=r)
        self.truncations = Counter("relaygr_truncations", "Ranks computed on a truncated history.", registry=r)
        self.no_affinity = Counter("relaygr_ranks_without_affinity",
                                   "Ranks served without an X-RelayGR-Affinity header (behind nginx: round-robined, "
                                   "so they cannot meet their pre-infer's prefix).", registry=r)
        self._no_affinity_lock = threading.Lock()
        self._no_affinity_count = 0
        for tier in CACHE_TIERS:
            self.rank_tiers.labels(tier)
        for reason in (*REASONS, "disabled"):
            self.trigger.labels(reason)
        for endpoint in REJECTION_ENDPOINTS:
            for reason in REJECTION_REASONS:
                self.rejections.labels(endpoint, reason)
        r.register(EngineStatsCollector(holder, instance_id))

    def observe_request(self, endpoint: str, method: str, status: int, seconds: float, cache: str | None) -> None:
        self.requests.labels(endpoint, method, str(status)).inc()
        self.latency.labels(endpoint, cache or NO_TIER).observe(seconds)

    def observe_rank(self, result: RankResult, with_affinity: bool = True) -> None:
        self.rank_tiers.labels(result.cache).inc()
        if not with_affinity:
            self.no_affinity.inc()
            with self._no_affinity_lock:
                self._no_affinity_count += 1
        if result.truncated:
            self.truncations.inc()
        for phase, ms in result.timings_ms.items():
            self.rank_phase.labels(phase).observe(ms / 1e3)

    @property
    def ranks_without_affinity(self) -> int:
        """Ranks served without the affinity header (the relaygr_ranks_without_affinity counter)."""
        with self._no_affinity_lock:
            return self._no_affinity_count

    def observe_preinfer(self, result: PreinferResult) -> None:
        self.trigger.labels(result.reason).inc()

    def observe_rejection(self, endpoint: str, reason: str) -> None:
        self.rejections.labels(endpoint, reason).inc()

    def render(self) -> tuple[bytes, str]:
        """Prometheus text exposition of the registry and its content type."""
        return generate_latest(self.registry), CONTENT_TYPE_LATEST
