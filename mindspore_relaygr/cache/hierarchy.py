"""The cache hierarchy of one instance: device slots (KVCacheManager) + host DRAM (DRAMExpander).

`RelayCache` decides where a user's prefix is served from and does the copies:
  device hit   -> rank from the slot;
  DRAM hit     -> reload into a free slot (unless recomputing is cheaper), then rank;
  partial hit  -> the user did k more things than the cached prefix: compute only those k tokens
                  against the cached K/V, re-key the entry, rank (bounded by cache.max_extend_len);
  miss         -> the caller computes the full path.
A cache answers only for the exact prefix it was built from (R2): the key carries the user id, the
model version and a hash of the prefix events; any mismatch is a miss.

Plain Python over a `SlotStore` (the model in production, a fake in unit tests). It is not
thread-safe by itself: one device thread per instance calls it (MindSpore calls must not overlap).
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Callable, Generator, Iterator
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from mindspore_relaygr.cache.expander import DRAMExpander
from mindspore_relaygr.cache.keys import CacheKey, prefix_hash
from mindspore_relaygr.cache.manager import EntryState, KVCacheManager, SlotLease
from mindspore_relaygr.model.inputs import History

logger = logging.getLogger(__name__)

TIERS = ("device", "dram", "partial", "inflight", "miss")
# Yielded by step generators (prefill, promote) right after a step that spilled an evicted slot to
# DRAM: the copy of a long prefix costs about a chunk, so it is a device step of its own, and ranks
# queued behind it run before the next chunk. It is not a chunk or a copied layer.
SPILLED = "spilled"


class SlotStore(Protocol):
    """What the hierarchy needs from the model (see RelayGRModel)."""

    def prefill(self, slot: int, history: History, start: int = 0) -> int: ...
    def rank_cached(self, slot: int, prefix_len: int, suffix_history: History, candidate_ids: Any) -> np.ndarray: ...
    def export_slot(self, slot: int) -> Any: ...
    def import_slot(self, slot: int, copy: Any) -> None: ...
    def import_slot_steps(self, slot: int, copy: Any) -> Iterator[Any]: ...
    def release_slot(self, slot: int) -> None: ...


@dataclass(frozen=True)
class CacheHit:
    """A pinned slot holding `prefix_len` events of the user's history; `release` it after ranking."""

    tier: str  # device | dram | partial
    key: CacheKey
    slot: int
    prefix_len: int


class RelayCache:
    """Device + DRAM tiers, incremental extension and spill/reload for one model instance."""

    def __init__(self, store: SlotStore, manager: KVCacheManager, expander: DRAMExpander | None, *,
                 model_version: str, max_suffix_len: int, max_extend_len: int, max_prefix_len: int,
                 reload_is_cheaper: Callable[[int, int], bool] | None = None) -> None:
        """max_prefix_len: events a slot can hold; reload_is_cheaper(nbytes, prefix_len) -> bool."""
        self.store, self.manager, self.expander = store, manager, expander
        self.model_version = model_version
        self.max_suffix_len, self.max_extend_len, self.max_prefix_len = max_suffix_len, max_extend_len, max_prefix_len
        self.reload_is_cheaper = reload_is_cheaper or (lambda nbytes, prefix_len: True)
        self._latest: dict[str, CacheKey] = {}  # user -> key of the newest prefix relayed for them
        self._inflight: dict[str, CacheKey] = {}  # user -> key being prefilled right now
        self.tier_counts: Counter[str] = Counter()
        self.on_evicted: Callable[[CacheKey], None] | None = None  # e.g. the engine's wasted-prefill count
        self._flushing = False
        self.extended_tokens = 0
        self.promotions = 0  # DRAM copies reloaded ahead of their rank (at pre-infer time)
        self.spills = 0  # evicted slots copied to DRAM
        manager.on_evict = self._on_evict

    # ----------------------------------------------------------------- pre-infer
    def key_for(self, user_id: str, history: History) -> CacheKey:
        return CacheKey.for_history(user_id, self.model_version, history, len(history))

    def reserve(self, user_id: str, history: History) -> SlotLease | None:
        """Reserve a slot for prefilling the whole `history` (None: no slot free, or too long)."""
        if not 0 < len(history) <= self.max_prefix_len:
            return None
        key = self.key_for(user_id, history)
        if self.manager.peek(key) is not None:
            return None  # already cached or being prefilled
        lease = self.manager.allocate(key)
        if lease is not None:
            self._inflight[user_id] = key
        return lease

    def commit(self, lease: SlotLease) -> None:
        """The prefill of a reserved slot finished: make it READY and the user's newest prefix."""
        self.manager.mark_ready(lease.key)
        self._forget_inflight(lease.key)
        old = self._latest.get(lease.key.user_id)
        self._latest[lease.key.user_id] = lease.key
        old_lease = self.manager.peek(old) if old is not None and old != lease.key else None
        if old_lease is not None and old_lease.state is EntryState.READY:
            try:
                self.manager.release(old)  # stale: the user's history moved on (spilled if policy says)
            except ValueError:
                logger.debug("stale entry %s is pinned; it will age out", old)

    def abort(self, lease: SlotLease) -> None:
        """The prefill of a reserved slot failed or was cancelled."""
        self.manager.abort(lease.key)
        self._forget_inflight(lease.key)
        self.store.release_slot(lease.slot)

    def prefill(self, user_id: str, history: History) -> CacheKey | None:
        """Reserve, prefill in one go and commit; None when no slot could be had."""
        lease = self.reserve(user_id, history)
        if lease is None:
            return None
        try:
            self.store.prefill(lease.slot, history)
        except BaseException:
            self.abort(lease)
            raise
        self.commit(lease)
        return lease.key

    # ----------------------------------------------------------------- rank
    def locate(self, user_id: str, history: History) -> tuple[str, CacheKey | None]:
        """Where the user's newest prefix is, if it is a prefix of `history`: (tier, key)."""
        key = next((k for k in (self._inflight.get(user_id), self._latest.get(user_id))
                    if k is not None and self.matches(k, history)), None)
        if key is None:
            return "miss", None  # R2: nothing cached for exactly this prefix
        lease = self.manager.peek(key)
        if lease is not None:
            return ("device" if lease.state is EntryState.READY else "inflight"), key
        if self.expander is not None and self.expander.contains(key):
            return "dram", key
        return "miss", None

    def acquire(self, user_id: str, history: History) -> CacheHit | None:
        """Pin a slot holding a prefix of `history` (reloading or extending as needed), or None."""
        tier, key = self.locate(user_id, history)
        hit = None
        if tier == "device":
            lease = self.manager.lookup(key, pin=True)
            hit = CacheHit("device", key, lease.slot, key.prefix_len) if lease else None
        elif tier == "dram":
            hit = self._reload(key)
        if hit is not None and len(history) - hit.prefix_len > self.max_suffix_len:
            hit = self._extend(hit, history)
        self.tier_counts[hit.tier if hit else ("inflight" if tier == "inflight" else "miss")] += 1
        return hit

    def release(self, hit: CacheHit) -> None:
        self.manager.unpin(hit.key)

    def promote(self, user_id: str, history: History) -> bool:
        """Reload the user's DRAM copy of a prefix of `history` into a device slot ahead of the
        rank (no lookup is counted); False if it is not (only) in DRAM or the reload was skipped."""
        steps = self.promote_steps(user_id, history)
        while True:
            try:
                next(steps)
            except StopIteration as stop:
                return stop.value

    def promote_steps(self, user_id: str, history: History) -> Generator[Any, None, bool]:
        """`promote` as steps of the store's copy (one graph call each). Meanwhile the slot is
        reserved, so the prefix reads as in flight and nobody else reloads or uses it."""
        tier, key = self.locate(user_id, history)
        if tier != "dram":
            return False
        payload = self.expander.get(key)
        if payload is None or not self.reload_is_cheaper(payload.nbytes, key.prefix_len):
            return False
        spills = self.spills
        lease = self.manager.allocate(key)
        if lease is None:
            return False  # every slot is pinned or reserved
        try:
            if self.spills != spills:
                yield SPILLED
            yield from self.store.import_slot_steps(lease.slot, payload)
        except BaseException:
            self.abort(lease)
            raise
        self.manager.mark_ready(key)
        self.expander.record_reload(payload.nbytes)
        self.promotions += 1
        return True

    def rank(self, user_id: str, history: History, candidate_ids: Any) -> tuple[np.ndarray, str] | None:
        """Scores from the cache and the tier that served them, or None on a miss."""
        hit = self.acquire(user_id, history)
        if hit is None:
            return None
        try:
            scores = self.store.rank_cached(hit.slot, hit.prefix_len, history.slice(hit.prefix_len), candidate_ids)
        finally:
            self.release(hit)
        return scores, hit.tier

    def stats(self) -> dict[str, Any]:
        out = {"tiers": dict(self.tier_counts), "extended_tokens": self.extended_tokens, "promotions": self.promotions,
               "spills": self.spills, "device": self.manager.stats()}
        if self.expander is not None:
            out["dram"] = self.expander.stats()
        return out

    # ----------------------------------------------------------------- internals
    def matches(self, key: CacheKey, history: History) -> bool:
        """True iff `key` was built from exactly the first key.prefix_len events of `history` (R2)."""
        return (key.model_version == self.model_version and key.prefix_len <= len(history)
                and prefix_hash(history, key.prefix_len) == key.prefix_hash)

    def _forget_inflight(self, key: CacheKey) -> None:
        if self._inflight.get(key.user_id) == key:
            del self._inflight[key.user_id]

    def _reload(self, key: CacheKey) -> CacheHit | None:
        payload = self.expander.get(key)
        if payload is None or not self.reload_is_cheaper(payload.nbytes, key.prefix_len):
            return None
        lease = self.manager.allocate(key)
        if lease is None:
            return None  # every slot is pinned or reserved: recompute instead

        def copy(p: Any) -> int:
            self.store.import_slot(lease.slot, p)
            return lease.slot

        try:
            self.expander.reload(key, copy, device_has_copy=None)
        except BaseException:
            self.abort(lease)
            raise
        self.manager.mark_ready(key)
        self.manager.pin(key)
        return CacheHit("dram", key, lease.slot, key.prefix_len)

    def _extend(self, hit: CacheHit, history: History) -> CacheHit | None:
        """Append the events the user did since the cached prefix, re-keying the entry."""
        new_events = len(history) - hit.prefix_len
        new_key = self.key_for(hit.key.user_id, history)
        if (new_events > self.max_extend_len or len(history) > self.max_prefix_len
                or self.manager.peek(new_key) is not None):
            self.release(hit)
            return None
        self.store.prefill(hit.slot, history, start=hit.prefix_len)
        self.manager.rekey(hit.key, new_key)
        self._latest[new_key.user_id] = new_key
        self.extended_tokens += new_events
        return CacheHit("partial", new_key, hit.slot, len(history))

    def flush(self) -> None:
        """Drop every READY entry (no spill) and the whole DRAM tier."""
        self._flushing = True
        try:
            for lease in self.manager.leases():
                if lease.state is EntryState.READY:
                    try:
                        self.manager.release(lease.key)
                    except ValueError:
                        logger.info("flush: %s is pinned, left in place", lease.key)
        finally:
            self._flushing = False
        if self.expander is not None:
            for key in list(self._latest.values()):
                self.expander.discard(key)
        self._latest.clear()

    def _on_evict(self, key: CacheKey, slot: int, was_used: bool, reason: str) -> None:
        spill = self.expander is not None and not self._flushing and self.expander.should_spill(was_used)
        if spill and not self.expander.contains(key):
            self.expander.put(key, self.store.export_slot(slot))
            self.spills += 1
        self.store.release_slot(slot)
        if self.on_evicted is not None:
            self.on_evicted(key)
