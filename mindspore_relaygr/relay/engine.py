"""RelayEngine: the RelayGR protocol on one instance (one device, one process).

`preinfer` (retrieval time) asks the sequence-aware trigger whether the user's prefix deserves a
relay and, if so, queues its prefill in chunks on the device thread; it returns at once.
`rank` (ranking time) is served from the device cache, the DRAM tier, an in-flight prefill of the
same prefix (waited for, bounded), a partial hit (extend the new events) or, on a miss, full
inference (or the truncated production baseline when the full path would blow the SLO).
Every MindSpore call runs on one executor thread; ranks run before pending prefill chunks.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter
from collections.abc import Callable, Generator, Iterator
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass, field, replace
from functools import partial
from typing import Any

import numpy as np

from mindspore_relaygr.cache import DRAMExpander, KVCacheManager
from mindspore_relaygr.cache.hierarchy import SPILLED, CacheHit, RelayCache
from mindspore_relaygr.cache.keys import CacheKey
from mindspore_relaygr.config import RelayGRConfig
from mindspore_relaygr.model.inputs import History, PrefillChunk, validate_candidates, validate_history
from mindspore_relaygr.relay.audit import TOLERANCE as AUDIT_TOLERANCE
from mindspore_relaygr.relay.audit import ExactnessAudit
from mindspore_relaygr.relay.batching import RankForecast, batch_size, delay_of_first_ms, queue_share, unpadded_size
from mindspore_relaygr.relay.device_model import CachedRank, DeviceModel
from mindspore_relaygr.relay.executor import (
    AUDIT,
    PREFILL,
    RANK,
    DeviceExecutor,
    DeviceRequest,
    ExecutorClosed,
    Outcome,
)
from mindspore_relaygr.relay.latency import LatencyModel
from mindspore_relaygr.relay.ledger import EXTEND, PENDING, PREFETCH, Relay, RelayLedger
from mindspore_relaygr.relay.ledger import PREFILL as PREFILL_RELAY
from mindspore_relaygr.relay.stats import DeviceWorkCounts, EngineStats, RankTierCounts
from mindspore_relaygr.relay.trigger import SequenceAwareTrigger
from mindspore_relaygr.relay.types import PreinferResult, RankResult

logger = logging.getLogger(__name__)


@dataclass
class _RankItem:
    """One rank on its way to the device thread (a member of a batch of ranks)."""

    user_id: str
    hist: History
    cands: np.ndarray
    waited: bool  # it waited for its prefix's relay
    arrived: float  # engine clock, seconds
    submitted: float
    timing: dict[str, float] = field(default_factory=dict)  # queue and compute (ms), filled on the device thread
    forecast: RankForecast | None = None  # its predicted device work (when a batch's delay is bounded)


def engine_chunk_bucket(model: DeviceModel, config: RelayGRConfig) -> int:
    """Largest prefix-graph chunk the engine uses: a prefill chunk or an incremental extension."""
    from mindspore_relaygr.model.inputs import bucket_for

    chunk = config.trigger.prefill_chunk_len
    return bucket_for(min(chunk, model.prefix_buckets[-1]), model.prefix_buckets, "chunk")


def warm_up_for_engine(model: DeviceModel, config: RelayGRConfig, max_rank_batch: int | None = None,
                       progress: Callable[[str], None] | None = None) -> None:
    """Compile every graph shape an engine on `config` calls: the length buckets, its chunk and extension
    shapes, and the rank and prefill batches up to `relay.max_rank_batch` (or `max_rank_batch`) and
    `relay.max_prefill_batch`; `progress` hears how far the compiles are."""
    model.warmup(max_chunk=engine_chunk_bucket(model, config),
                 max_batch=max_rank_batch or config.relay.max_rank_batch,
                 max_prefill_batch=config.relay.max_prefill_batch, progress=progress)


def calibrate_for_engine(model: DeviceModel, config: RelayGRConfig, repeats: int = 3,
                         max_rank_batch: int | None = None) -> LatencyModel:
    """The latency model an engine on `config` predicts with, measured on `model` (warmed up): every bucket, and
    the batch factors up to `relay.max_rank_batch` (or `max_rank_batch`)."""
    from mindspore_relaygr.relay.calibrate import calibrate_latency

    return calibrate_latency(model, config.trigger.prefill_chunk_len, repeats=repeats,
                             max_batch=max_rank_batch or config.relay.max_rank_batch)


class RelayEngine:
    """Pre-infer and rank for one model instance; thread-safe for any number of callers."""

    def __init__(self, config: RelayGRConfig, model: DeviceModel, latency: LatencyModel,
                 instance_id: str = "i0", clock: Callable[[], float] = time.monotonic) -> None:
        """`clock` (seconds): what the relays' TTL (relay.ready_ttl_ms), the ranks' timings and the device steps
        are measured on."""
        self.config, self.model, self.latency, self.instance_id = config, model, latency, instance_id
        cfg = config
        self._user_tokens = 1 if cfg.model.user_feature_sizes else 0
        self._clock = clock
        self.executor = DeviceExecutor(name=f"relaygr-device-{instance_id}", clock=clock)
        manager = KVCacheManager(model.num_slots, model.layout.slot_bytes, cfg.cache.lifetime_ms)
        expander = None
        if cfg.expander.enabled:
            expander = DRAMExpander(cfg.expander.dram_bytes, cfg.expander.ttl_s, cfg.expander.spill_policy)
            # Fault the DRAM tier's memory in now, not one spill at a time on the device thread.
            seconds = model.ensure_host_arena(int(cfg.expander.dram_bytes))
            if seconds:
                logger.info("touched a %.2f GB host arena for the DRAM tier in %.1f s",
                            cfg.expander.dram_bytes / 1e9, seconds)
        self.copy_bytes_per_s = self._copy_bandwidth()
        self.cache = RelayCache(model, manager, expander, model_version=model.version,
                                max_prefix_len=model.layout.slot_len - self._user_tokens,
                                reload_is_cheaper=self._reload_is_cheaper)
        self.ledger = RelayLedger(cfg.relay.ready_ttl_ms, clock)
        self.trigger = SequenceAwareTrigger(cfg.trigger, latency, model.layout.slot_bytes, model.num_slots,
                                            user_tokens=self._user_tokens, slot_tokens=model.layout.slot_len)
        self._lock = threading.Lock()  # the counters below
        self.ranks = RankTierCounts()
        self.work = DeviceWorkCounts()
        self.audit = ExactnessAudit(cfg.relay.audit_fraction)
        self.preinfers: Counter[str] = Counter()
        self.ready = True

    def _copy_bandwidth(self) -> float:
        """expander.copy_bytes_per_s, or (null) the DRAM -> device bandwidth measured now on the device thread."""
        configured = self.config.expander.copy_bytes_per_s
        if configured is not None or not self.config.expander.enabled:
            return float(configured or 1e9)
        from mindspore_relaygr.relay import calibrate

        measured = self.executor.submit(lambda: calibrate.measure_copy_bytes_per_s(
            self.model, self.config.trigger.prefill_chunk_len), label="measure_copy").result()
        logger.info("DRAM -> device copy bandwidth: %.2f GB/s (measured)", measured / 1e9)
        return measured

    @classmethod
    def from_config(cls, config: RelayGRConfig, instance_id: str = "i0",
                    model: DeviceModel | None = None) -> RelayEngine:
        """Build the model, warm up every bucket and calibrate (or load) the latency model."""
        from mindspore_relaygr.model import RelayGRModel

        model = model or RelayGRModel(config)
        if config.relay.warmup:
            warm_up_for_engine(model, config)
        if config.trigger.latency_profile:
            latency = LatencyModel.from_json(config.trigger.latency_profile)
        else:
            latency = calibrate_for_engine(model, config)
        return cls(config, model, latency, instance_id=instance_id)

    @classmethod
    def from_bundle(cls, path: str, overrides: list[str] | None = None, instance_id: str = "i0") -> RelayEngine:
        """Build on a serving bundle (`relaygr export`): verified, with its config, weights and version."""
        from mindspore_relaygr.export import load_bundle

        config, model = load_bundle(path, overrides)
        return cls.from_config(config, instance_id=instance_id, model=model)

    @property
    def model_version(self) -> str:
        return self.model.version

    # ------------------------------------------------------------------ pre-infer
    def preinfer(self, user_id: str, history: Any, num_candidates: int | None = None) -> PreinferResult:
        """Decide at once whether to relay this prefix; an admitted prefill runs in the background."""
        hist = validate_history(self.config.model, history)
        if not self.config.relay.enabled:
            return self._count_preinfer(PreinferResult(False, "disabled", None, 0.0))
        key = self.cache.key_for(user_id, hist)
        tier, found = self.cache.locate(user_id, hist)
        # A cached (or running) prefix of this history serves it when the events since fit in the
        # rank's suffix: no new work for a returning user whose history grew a little. When they do
        # not, a cached prefix is extended by just those events if that beats a fresh prefill.
        usable = found is not None and len(hist) - found.prefix_len <= self.config.model.max_suffix_len
        # A prefix whose rank may still come is never rewritten in place: its rank may carry the older
        # history (or this history was sent by someone else under the user's id). A fresh prefill then.
        extend = (not usable and found is not None and tier in ("device", "dram")
                  and found not in self.ledger.awaited() and self._extension_pays(found, tier, len(hist)))
        num_candidates = num_candidates or self.config.model.max_candidates
        with self.ledger.lock:
            relays = [self.ledger.get(key)] + ([self.ledger.get(found)] if usable or extend else [])
            inflight = any(r is not None and r.state in PENDING for r in relays) or (tier == "inflight" and usable)
            cached = tier in ("device", "dram") and usable
            decision = self.trigger.decide(len(hist) + self._user_tokens, num_candidates, self.ledger.footprint(),
                                           cached, inflight,
                                           extension_tokens=len(hist) - found.prefix_len if extend else None)
            if (decision.reason == "already_cached" and tier == "dram" and self.config.expander.enable_prefetch
                    and self.ledger.get(found) is None):
                # Reload now, in the background: at rank time the copy would sit on the rank's path.
                # A relay like a prefill, so the user's rank waits for it (boosted) instead of missing.
                relay = self.ledger.admit(user_id, found, PREFETCH, self._predicted_copy_ms(found))
                self._submit(relay, self._promote_steps(relay), "dram_prefetch")
            if decision.admitted and extend:
                relay = self.ledger.admit(user_id, key, EXTEND, self._predicted_extension_ms(found, tier, len(hist)))
                self._submit(relay, self._extension_steps(relay, found, hist), "extend_chunk")
            elif decision.admitted:
                chunk_ms = self.latency.predict_prefill_chunks_ms(len(hist) + self._user_tokens,
                                                                  self.config.trigger.prefill_chunk_len)
                relay = self.ledger.admit(user_id, key, PREFILL_RELAY, chunk_ms)
                self._submit(relay, self._prefill_steps(relay, hist), "prefill_chunk",
                             batched=self.config.relay.max_prefill_batch > 1)
        short_key = key.prefix_hash[:16] if decision.admitted else None
        return self._count_preinfer(PreinferResult(decision.admitted, decision.reason, short_key,
                                                   decision.predicted_full_ms))

    def _submit(self, relay: Relay, steps: Generator[Any, None, Any], label: str, batched: bool = False) -> None:
        """Queue a relay's device work (ledger lock held, so nobody sees the relay without its future); `batched`:
        its chunks are DeviceRequests that the device thread runs with other relays' (relay.max_prefill_batch)."""
        if batched:
            relay.future = self.executor.submit_batched_steps(
                self._settling(steps), self._prefill_batch_on_device, self.config.relay.max_prefill_batch, PREFILL,
                label, batch_size=partial(unpadded_size, self.config.model.batch_buckets))
        else:
            relay.future = self.executor.submit_steps(self._settling(steps), PREFILL, label=label)
        relay.future.add_done_callback(lambda f, r=relay: self._relay_done(r, f))

    def _relay_done(self, relay: Relay, future: Future) -> None:
        error = future.exception() if not future.cancelled() else None
        if error is None and not future.cancelled():
            return
        logger.error("%s of %s failed: %s", relay.kind, relay.key, error or "cancelled")
        with self._lock:
            self.work.prefill_errors += 1
        with self.ledger.lock:
            if self.ledger.get(relay.key) is relay and relay.state in PENDING:
                self.ledger.drop(relay.key, "failed")

    def _prefill_steps(self, relay: Relay, hist: History) -> Iterator[Any]:
        """Device thread: reserve a slot and prefill in chunks, yielding between chunks (and after
        a spill: copying a long evicted prefix to DRAM costs about as much as a chunk)."""
        spills = self.cache.spills
        lease = self.cache.reserve(relay.user_id, hist, keep=self.ledger.awaited())
        if lease is None:
            self.ledger.drop(relay.key, "no_slot")
            self.work.prefill_no_slot += 1
            return
        self.ledger.start(relay.key)
        batched = self.config.relay.max_prefill_batch > 1
        try:
            if self.cache.spills != spills:
                yield SPILLED
            done = 0
            for end in self.model.chunk_ends(len(hist), self.config.trigger.prefill_chunk_len):
                chunk = PrefillChunk(lease.slot, hist.slice(0, end), done)
                if batched:  # the device thread runs it, with other relays' chunks, between two of our steps
                    cached = yield DeviceRequest(chunk)
                else:
                    (cached,) = self.model.prefill_batch([chunk])
                self.work.prefill_chunks += 1
                self.work.prefill_events += cached - done
                done = cached
                self.ledger.step_done(relay.key)
                if cached < len(hist) and not batched:
                    yield
        except BaseException:
            self.cache.abort(lease)
            raise
        self.cache.commit(lease, hist, keep=self.ledger.awaited())
        self.ledger.ready(relay.key)
        self.work.prefills += 1

    def _extension_steps(self, relay: Relay, found: CacheKey, hist: History) -> Iterator[Any]:
        """Device thread: extend the user's cached prefix `found` (brought back from DRAM first if it
        is only there) by the events since, in chunks, in its own slot; ranks run between chunks."""
        self.ledger.start(relay.key)
        if self.cache.manager.peek(found) is None:
            promoted = yield from self._promotion(relay, found)
            if not promoted:
                self.ledger.drop(relay.key, "no_slot")
                self.work.prefill_no_slot += 1
                return
        lease = self.cache.reopen(found, hist, keep=self.ledger.awaited())
        if lease is None:  # evicted, pinned, superseded or awaited meanwhile
            self.ledger.drop(relay.key, "no_slot")
            self.work.prefill_no_slot += 1
            return
        try:
            for _ in self.cache.extension_chunks(lease.slot, hist, found.prefix_len,
                                                 self.config.trigger.prefill_chunk_len):
                self.work.extension_chunks += 1
                self.ledger.step_done(relay.key)
                yield
        except BaseException:
            self.cache.abort(lease)
            raise
        self.cache.commit(lease, hist, keep=self.ledger.awaited())
        self.ledger.ready(relay.key)
        self.work.extensions += 1

    def _may_extend(self, num_events: int) -> bool:
        """Extension across requests is enabled and `num_events` fit a slot."""
        return self.config.cache.enable_extension and num_events <= self.cache.max_prefix_len

    def _extension_pays(self, found: CacheKey, tier: str, num_events: int) -> bool:
        """Extending `found` (on the device, or in DRAM: plus the copy back) to `num_events` is enabled,
        fits a slot and is predicted to beat a fresh prefill of all of them."""
        if not self._may_extend(num_events):
            return False
        cost = sum(self._predicted_extension_ms(found, tier, num_events))
        return cost < self.latency.predict_prefill_ms(num_events + self._user_tokens)

    def _predicted_extension_ms(self, found: CacheKey, tier: str, num_events: int) -> list[float]:
        """Predicted cost of each step of extending `found` to `num_events`: copied layers, then chunks."""
        copy = self._predicted_copy_ms(found) if tier == "dram" else []
        return copy + self.latency.predict_extend_chunks_ms(found.prefix_len + self._user_tokens,
                                                            num_events - found.prefix_len,
                                                            self.config.trigger.prefill_chunk_len)

    def _promotion(self, relay: Relay, key: CacheKey) -> Generator[Any, None, bool]:
        """Device thread: copy `key` back from DRAM one layer per step (each a step done of `relay`; a spill
        that makes room is not); returns whether it got a slot."""
        steps = self.cache.promote_steps(key, keep=self.ledger.awaited())
        while True:
            try:
                done = next(steps)
            except StopIteration as stop:
                return bool(stop.value)
            if done is not SPILLED:
                self.ledger.step_done(relay.key)
            yield done

    def _promote_steps(self, relay: Relay) -> Iterator[Any]:
        """Device thread: bring the user's DRAM copy back to a slot before their rank arrives, one
        layer per step (a long prefix's copy would otherwise block ranks for longer than a chunk)."""
        self.ledger.start(relay.key)
        promoted = yield from self._promotion(relay, relay.key)
        if promoted:
            self.ledger.ready(relay.key)
            self.work.dram_prefetches += 1
        else:
            self.ledger.drop(relay.key, "no_slot")

    def _predicted_copy_ms(self, key: CacheKey) -> list[float]:
        """Predicted cost of each layer's copy of `key`'s DRAM copy back to the device."""
        layers = self.model.layout.num_layers
        nbytes = self.model.layout.token_bytes * (key.prefix_len + self._user_tokens)
        return [nbytes / self.copy_bytes_per_s * 1e3 / layers] * layers

    def _settling(self, steps: Generator[Any, Any, Any]) -> Generator[Any, Any, Any]:
        """A relay's device steps, settling what each step dropped from the cache; what is sent or thrown in
        reaches `steps` and its return value is kept (closing it closes `steps`, as `yield from` would)."""
        try:
            sent, error = None, None
            while True:
                try:
                    step = steps.throw(error) if error is not None else steps.send(sent)
                except StopIteration as stop:
                    return stop.value
                self._settle()
                sent, error = None, None
                try:
                    sent = yield step
                except GeneratorExit:
                    raise
                except BaseException as exc:  # noqa: BLE001 - a failed device request: `steps` decides
                    error = exc
        finally:
            steps.close()
            self._settle()

    def _prefill_batch_on_device(self, chunks: list[PrefillChunk]) -> list[Outcome]:
        """Device thread: several relays' prefill chunks in one model call (relay.max_prefill_batch); the executor
        throws an error of the call into every relay of the batch."""
        return [Outcome(events) for events in self.model.prefill_batch(chunks)]

    def _settle(self) -> None:
        """Device thread: relays whose device entries the cache dropped leave the ledger (a READY relay
        dropped before its rank came is a wasted prefill)."""
        for key in self.cache.take_dropped():
            self.ledger.on_evicted(key)

    # ------------------------------------------------------------------ rank
    def rank(self, user_id: str, history: Any, candidate_ids: Any, top_k: int | None = None) -> RankResult:
        """Score every candidate (request order) and rank them; blocks until done."""
        t0 = self._clock()
        hist = validate_history(self.config.model, history)
        cands = validate_candidates(self.config.model, candidate_ids)
        wait_ms, waited = 0.0, False
        if self.config.relay.enabled:
            wait_ms, waited = self._wait_for_inflight(user_id, hist, cands)
        relay = self.config.relay
        bounded = relay.max_rank_batch > 1 and relay.max_batch_delay_ms is not None
        item = _RankItem(user_id, hist, cands, waited, arrived=t0, submitted=self._clock(),
                         forecast=self._forecast(user_id, hist, cands) if bounded else None)
        scores, tier, events = self.executor.submit_batched(item, self._rank_batch_on_device, relay.max_rank_batch,
                                                            RANK, label="rank",
                                                            may_join=self._batch_fits if bounded else None,
                                                            batch_size=partial(batch_size, self.latency)).result()
        timing = item.timing
        timing.update(wait=wait_ms, total=(self._clock() - t0) * 1e3)
        truncated = events < len(hist)
        with self._lock:
            setattr(self.ranks, tier, getattr(self.ranks, tier) + 1)
            self.work.truncations += int(truncated)
        return RankResult(scores, self._ranking(scores, top_k), tier, truncated, timing, ranked_events=events)

    def predicted_rank_ms(self, user_id: str, history: Any, candidate_ids: Any) -> float:
        """Predicted device time of this rank (latency model), for admission control: the cached path when
        a prefix of the history is on the device, being written or in DRAM (and beats a miss), else the
        miss as the miss policy would rank it. Any thread; a forecast, since the cache may change before
        the rank runs. Raises the same validation errors as `rank`."""
        hist = validate_history(self.config.model, history)
        cands = validate_candidates(self.config.model, candidate_ids)
        return self._forecast(user_id, hist, cands).alone_ms(self.latency)

    def queue_share(self, queued: int) -> float:
        """Device time of `queued` ranks as a share of their single calls, as the device thread batches them
        (relay.max_rank_batch, the latency model's batch factors): for admission control."""
        return queue_share(self.latency, queued, self.config.relay.max_rank_batch)

    def _forecast(self, user_id: str, hist: History, cands: np.ndarray) -> RankForecast:
        """Predicted device work of a rank (see `predicted_rank_ms`)."""
        if not self.config.relay.enabled:
            events = min(len(hist), self.config.relay.max_online_len)
            return RankForecast(self.latency.predict_full_ms(events + self._user_tokens, len(cands)))
        miss = RankForecast(self._predicted_miss_ms(hist, cands))
        tier, key = self.cache.locate(user_id, hist)
        if key is None or "relay" not in self.latency.kinds:  # no relay graph measured: take the miss's time
            return miss
        suffix = len(hist) - key.prefix_len
        if suffix <= self.config.model.max_suffix_len:
            copy = self._predicted_copy_ms(key) if tier == "dram" else []
            cached = RankForecast(sum(copy), (key.prefix_len + self._user_tokens, suffix, len(cands)))
        elif not self._may_extend(len(hist)):
            return miss  # `_extend` would not extend it
        else:  # extended to the whole history first, when that beats the miss
            cached = RankForecast(sum(self._predicted_extension_ms(key, tier, len(hist))),
                                  (len(hist) + self._user_tokens, 0, len(cands)))
        return cached if cached.alone_ms(self.latency) <= miss.serial_ms else miss

    def _batch_fits(self, items: list[_RankItem]) -> bool:
        """Device thread: whether ranking `items` in one step delays the first by at most
        relay.max_batch_delay_ms over ranking it alone (by their forecasts)."""
        forecasts = [item.forecast for item in items]
        if any(f is None for f in forecasts):
            return True
        return delay_of_first_ms(self.latency, forecasts) <= self.config.relay.max_batch_delay_ms

    def _wait_for_inflight(self, user_id: str, hist: History, cands: np.ndarray) -> tuple[float, bool]:
        """Wait for the running relay of the longest prefix of this history, when it should finish
        before a miss would.

        If its predicted remaining steps cost less than the miss path, it is boosted to rank priority
        and waited for up to max(relay.inflight_wait_ms, remaining + miss): a stalled relay costs at
        most one miss's worth of extra waiting. Otherwise it is waited for up to relay.inflight_wait_ms,
        and then judged again on the steps it has left: a prefill that has progressed far enough to beat
        the miss by now is boosted and waited for as above (abandoning it would spend a whole miss of
        device time while the prefill still has to finish for the user's later visits)."""
        relay = next((r for r in self.ledger.of_user(user_id)
                      if r.state in PENDING and self.cache.matches(r.key, hist)), None)
        if relay is None:
            return 0.0, False
        t0 = self._clock()
        miss_ms = self._predicted_miss_ms(hist, cands)
        boosted = relay.remaining_ms() <= miss_ms
        with self._lock:  # counted once judged: a test waiting on it knows the first judgement was made
            self.work.inflight_waits += 1
        if boosted:
            self._boost(relay)
            done = self._await(relay, max(self.config.relay.inflight_wait_ms, relay.remaining_ms() + miss_ms))
        else:
            done = self._await(relay, self.config.relay.inflight_wait_ms)
            if not done and relay.remaining_ms() <= miss_ms:
                self._boost(relay)
                done = self._await(relay, relay.remaining_ms() + miss_ms)
        if not done:
            with self._lock:
                self.work.inflight_wait_timeouts += 1
        return (self._clock() - t0) * 1e3, True

    def _boost(self, relay: Relay) -> None:
        self.executor.boost(relay.future)
        with self._lock:
            self.work.inflight_boosts += 1

    @staticmethod
    def _await(relay: Relay, patience_ms: float) -> bool:
        """Wait up to `patience_ms` for the relay; True once it has finished (failed included: the rank
        then goes on without it), False on timeout."""
        try:
            relay.future.result(timeout=patience_ms / 1e3)
        except FutureTimeout:
            return False
        except Exception:  # noqa: BLE001 - the relay failed: rank without it
            pass
        return True

    def _rank_batch_on_device(self, items: list[_RankItem]) -> list[Outcome]:
        """Device thread: the ranks queued together (up to relay.max_rank_batch). Each is planned on its
        own (cache tiers, then the miss policy, which computes what it needs at once); the ranks served from
        a device slot then run as one batched call where the model has one, else one call each."""
        start = self._clock()
        outcomes: list[Outcome | None] = [None] * len(items)
        cached: list[tuple[int, CacheHit, str]] = []
        try:
            for i, item in enumerate(items):
                item.timing["queue"] = (start - item.submitted) * 1e3
                try:
                    planned = self._plan_rank(item)
                except Exception as exc:  # noqa: BLE001 - this rank's caller gets it; the others go on
                    outcomes[i] = Outcome(error=exc)
                    continue
                if isinstance(planned, tuple) and isinstance(planned[0], CacheHit):
                    cached.append((i, *planned))
                else:
                    outcomes[i] = Outcome(planned)
            for (i, hit, tier), result in zip(cached, self._rank_cached_many(items, cached), strict=True):
                if isinstance(result, BaseException):
                    outcomes[i] = Outcome(error=result)
                    continue
                item = items[i]
                outcomes[i] = Outcome((result, tier, len(item.hist)))
                if self.audit.sample():
                    try:
                        self.executor.submit(lambda h=hit, it=item, r=result: self._audit(h.key, it.hist, it.cands, r),
                                             AUDIT, label="audit")
                    except ExecutorClosed:
                        self.audit.finished(None)
        finally:
            for _, hit, _ in cached:
                self.cache.release(hit)
            self._settle()
        compute_ms = (self._clock() - start) * 1e3  # the device step they shared
        for item in items:
            item.timing["compute"] = compute_ms
        return outcomes  # type: ignore[return-value] - every slot is filled above

    def _plan_rank(self, item: _RankItem):
        """Device thread: (cache hit, tier) when a device slot serves the rank (the caller ranks it and
        releases the hit); else the finished (scores, tier, events ranked on) of the miss policy."""
        hist, cands = item.hist, item.cands
        if not self.config.relay.enabled:
            return self._rank_truncated(hist, cands, self.config.relay.max_online_len, "bypass")
        hit = self.cache.acquire(item.user_id, hist, keep=self.ledger.awaited())
        if hit is None:
            return self._rank_miss(hist, cands, item.arrived)
        self.ledger.consume(hit.key)
        tier = "inflight" if item.waited and hit.tier == "device" else hit.tier
        if len(hist) - hit.prefix_len > self.config.model.max_suffix_len:
            hit = self._extend(hit, hist, cands)
            if hit is None:
                return self._rank_miss(hist, cands, item.arrived)
            tier = "partial"
        return hit, tier

    def _rank_cached_many(self, items: list[_RankItem], cached: list[tuple[int, CacheHit, str]]) -> list[Any]:
        """Scores (or the error) of each cached rank: one batched model call when there are several and the
        model batches, else one call each."""
        if len(cached) > 1 and self.model.batched_ranking:
            requests = [CachedRank(hit.slot, hit.prefix_len, items[i].hist.slice(hit.prefix_len), items[i].cands)
                        for i, hit, _ in cached]
            try:
                return list(self.model.rank_cached_batch(requests))
            except Exception as exc:  # noqa: BLE001 - every rank of the batch gets it
                return [exc] * len(cached)
        out: list[Any] = []
        for i, hit, _ in cached:
            try:
                out.append(self.model.rank_cached(hit.slot, hit.prefix_len, items[i].hist.slice(hit.prefix_len),
                                                  items[i].cands))
            except Exception as exc:  # noqa: BLE001 - this rank's caller gets it
                out.append(exc)
        return out

    def _audit(self, key: CacheKey, hist: History, cands: np.ndarray, cached: np.ndarray) -> None:
        """Device thread, when idle: recompute a cached rank in full; drop the entry if they differ."""
        try:
            diff = float(np.max(np.abs(np.asarray(cached, np.float64) - self.model.rank_full(hist, cands))))
        except Exception:  # noqa: BLE001 - nobody waits on an audit: log it, count it as skipped
            logger.exception("exactness audit of %s failed", key)
            self.audit.finished(None)
            return
        if self.audit.finished(diff):
            logger.error("exactness audit: ranks from cache entry %s differ from full inference by %.3g "
                         "(> %g); entry dropped", key, diff, AUDIT_TOLERANCE)
            if not self.cache.drop(key, "audit"):
                logger.error("exactness audit: could not drop %s (pinned or being written)", key)
            self._settle()

    def _extend(self, hit: CacheHit, hist: History, cands: np.ndarray) -> CacheHit | None:
        """Compute the events after the cached prefix in its slot, in chunks, when that and the rank
        are predicted to beat a miss; else release the hit and return None (a miss)."""
        # Extended to the whole history, the rank's suffix graph then runs on no events.
        ranked = self.latency.predict_relay_ms(len(hist) + self._user_tokens, 0, len(cands))
        cost = sum(self._predicted_extension_ms(hit.key, "device", len(hist))) + ranked
        if (not self._may_extend(len(hist))
                or cost >= self._predicted_miss_ms(hist, cands)):
            self.cache.release(hit)
            return None
        steps = self.cache.extend_steps(hit, hist, self.config.trigger.prefill_chunk_len, keep=self.ledger.awaited())
        while True:
            try:
                next(steps)
            except StopIteration as stop:
                if stop.value is not None:
                    self.work.extensions += 1
                return stop.value
            self.work.extension_chunks += 1

    def _rank_miss(self, hist: History, cands: np.ndarray, arrived: float):
        elapsed_ms = (self._clock() - arrived) * 1e3
        return self._rank_truncated(hist, cands, self._miss_events(hist, cands, elapsed_ms), "miss")

    def _miss_events(self, hist: History, cands: np.ndarray, elapsed_ms: float = 0.0) -> int:
        """Most recent events a miss ranks on: all of them, or, under the truncate policy when the time
        the rank has already spent (`elapsed_ms`: waits and queue) plus its predicted full path would
        blow the SLO, the most that still fit the rest of it, at most the production cap. A rank that
        nothing fits any more is late whatever it does: it ranks on the production cap."""
        relay = self.config.relay
        capacity = self.config.model.max_seq_len - self._user_tokens
        predicted = self.latency.predict_full_ms(len(hist) + self._user_tokens, len(cands))
        cap = min(relay.max_online_len, capacity)
        if relay.miss_policy == "truncate" and elapsed_ms + predicted > self.config.trigger.slo_ms:
            fit = self._events_within(self.config.trigger.slo_ms - elapsed_ms, len(cands), cap)
            return cap if fit == 0 else fit
        return capacity

    def _events_within(self, budget_ms: float, num_candidates: int, most: int) -> int:
        """The most events (0..most) whose predicted full path fits `budget_ms` (predictions grow with length)."""
        low, high = 0, most
        while low < high:
            mid = (low + high + 1) // 2
            if self.latency.predict_full_ms(mid + self._user_tokens, num_candidates) <= budget_ms:
                low = mid
            else:
                high = mid - 1
        return low

    def _predicted_miss_ms(self, hist: History, cands: np.ndarray) -> float:
        events = min(len(hist), self._miss_events(hist, cands))
        return self.latency.predict_full_ms(events + self._user_tokens, len(cands))

    def _rank_truncated(self, hist: History, cands: np.ndarray, max_events: int, tier: str):
        recent = hist.slice(len(hist) - max_events) if len(hist) > max_events else hist
        return self.model.rank_full(recent, cands), tier, len(recent)

    def _ranking(self, scores: np.ndarray, top_k: int | None) -> list[int]:
        weights = self.config.model.task_weights or [1.0] * scores.shape[1]
        combined = scores @ np.asarray(weights, np.float32)
        order = np.argsort(-combined, kind="stable")
        return order[: top_k or len(order)].tolist()

    def _reload_is_cheaper(self, nbytes: int, prefix_len: int) -> bool:
        return nbytes / self.copy_bytes_per_s * 1e3 < self.latency.predict_prefill_ms(prefix_len + self._user_tokens)

    def _count_preinfer(self, result: PreinferResult) -> PreinferResult:
        with self._lock:
            self.preinfers[result.reason] += 1
        return result

    # ------------------------------------------------------------------ admin
    def wait_prefills(self, timeout: float | None = None) -> None:
        """Block until every relay admitted so far has finished (or failed)."""
        for relay in self.ledger.pending():
            try:
                relay.future.result(timeout)
            except FutureTimeout:
                raise
            except Exception:  # noqa: BLE001 - a failed prefill is counted, not re-raised here
                pass

    def wait_audits(self, timeout: float | None = None) -> None:
        """Block until every exactness audit queued so far has run (audits queue in order)."""
        self.executor.submit(lambda: None, AUDIT, label="audit_barrier").result(timeout)

    def stats(self) -> EngineStats:
        """A typed snapshot of the engine's counters, relays, trigger and cache tiers."""
        with self._lock:
            ranks, work = replace(self.ranks), replace(self.work)
            preinfers = dict(self.preinfers)
        return EngineStats(instance=self.instance_id, model_version=self.model_version, ready=self.ready,
                           relay_enabled=self.config.relay.enabled, queue_depth=self.executor.depth(),
                           copy_bytes_per_s=self.copy_bytes_per_s,
                           slot_bytes=self.model.layout.slot_bytes, ranks=ranks, work=work,
                           relays=self.ledger.stats(), trigger=self.trigger.stats(), cache=self.cache.stats(),
                           audit=self.audit.stats(), preinfers=preinfers, device_steps=self.executor.step_stats(),
                           device_batches=self.executor.batch_stats())

    def flush(self) -> None:
        """Drop every cached prefix (device and DRAM); in-flight prefills finish normally."""
        def flush() -> None:
            try:
                self.cache.flush()
            finally:
                self._settle()

        self.executor.submit(flush, label="flush").result()

    def close(self) -> None:
        self.ready = False
        self.executor.close()
