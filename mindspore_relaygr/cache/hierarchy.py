"""The cache hierarchy of one instance: device slots (KVCacheManager) + host DRAM (DRAMExpander).

`RelayCache` finds where a user's prefix is and does the copies:
  device hit   -> rank from the slot;
  DRAM hit     -> reload into a free slot (unless recomputing is cheaper), then rank;
  extension    -> the user did more things than the cached prefix holds: compute only the new
                  events against the cached K/V and re-key the entry (`extend`);
  miss         -> the caller computes the full path.
A cache answers only for the exact prefix it was built from (R2): the key carries the user id, the
model version and a hash of the prefix events; any mismatch is a miss. A user may have several
entries (e.g. a history sent under their id by someone else); a commit drops only the same user's
entries that the new history extends.

Tier logic only: which relays are pending, awaited or consumed is the RelayLedger's business. The
caller hands in the keys to keep (`keep`: prefixes whose rank may still come), which are evicted only
when nothing else can be, never superseded and never rewritten in place; and it collects the device
entries this cache dropped (`take_dropped`) to settle the relays they held. Nothing here calls up.

Threads: `key_for`, `matches`, `locate` and `stats` read only the thread-safe manager and expander
and may be called from any thread (`THREAD_SAFE`); every other method writes slots or tier tables
and must be called from the one device thread of the instance (MindSpore calls must not overlap).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Collection, Generator, Iterator
from dataclasses import dataclass
from typing import Any, Protocol

from mindspore_relaygr.cache.expander import DRAMExpander, DramTierStats
from mindspore_relaygr.cache.keys import CacheKey, prefix_hash
from mindspore_relaygr.cache.manager import DeviceTierStats, EntryState, Eviction, KVCacheManager, SlotLease
from mindspore_relaygr.history import History

logger = logging.getLogger(__name__)

# Yielded by step generators (prefill, promote) right after a step that spilled an evicted slot to
# DRAM: the copy of a long prefix costs about a chunk, so it is a device step of its own, and ranks
# queued behind it run before the next chunk. It is not a chunk or a copied layer.
SPILLED = "spilled"


class SlotStore(Protocol):
    """What the hierarchy needs from the model (see RelayGRModel)."""

    def prefill(self, slot: int, history: History, start: int = 0) -> int: ...
    def export_slot(self, slot: int) -> Any: ...
    def import_slot(self, slot: int, copy: Any) -> None: ...
    def import_slot_steps(self, slot: int, copy: Any) -> Iterator[Any]: ...
    def release_slot(self, slot: int) -> None: ...


@dataclass(frozen=True)
class CacheHit:
    """A pinned slot holding `prefix_len` events of the user's history; `release` it after ranking."""

    tier: str  # device | dram | partial (extended)
    key: CacheKey
    slot: int
    prefix_len: int


@dataclass
class CacheTierStats:
    extended_tokens: int  # events computed to extend cached prefixes
    promotions: int  # DRAM copies reloaded ahead of their rank
    spills: int  # evicted slots copied to DRAM
    superseded: int  # entries dropped because the same user's longer history extends them
    device: DeviceTierStats
    dram: DramTierStats | None


class RelayCache:
    """Device + DRAM tiers, incremental extension and spill/reload for one model instance."""

    THREAD_SAFE = frozenset({"key_for", "matches", "locate", "stats"})

    def __init__(self, store: SlotStore, manager: KVCacheManager, expander: DRAMExpander | None, *,
                 model_version: str, max_prefix_len: int,
                 reload_is_cheaper: Callable[[int, int], bool] | None = None) -> None:
        """max_prefix_len: events a slot can hold; reload_is_cheaper(nbytes, prefix_len) -> bool."""
        self.store, self.manager, self.expander = store, manager, expander
        self.model_version = model_version
        self.max_prefix_len = max_prefix_len
        self.reload_is_cheaper = reload_is_cheaper or (lambda nbytes, prefix_len: True)
        self._dropped: list[CacheKey] = []  # READY device entries dropped since the last take_dropped
        self.extended_tokens = 0
        self.promotions = 0
        self.spills = 0
        self.superseded = 0

    # ----------------------------------------------------------------- any thread
    def key_for(self, user_id: str, history: History) -> CacheKey:
        return CacheKey.for_history(user_id, self.model_version, history, len(history))

    def matches(self, key: CacheKey, history: History) -> bool:
        """True iff `key` was built from exactly the first key.prefix_len events of `history` (R2)."""
        return (key.model_version == self.model_version and key.prefix_len <= len(history)
                and prefix_hash(history, key.prefix_len) == key.prefix_hash)

    def locate(self, user_id: str, history: History) -> tuple[str, CacheKey | None]:
        """The longest cached prefix of `history` for this user and where it is: ("device" | "inflight"
        (its slot is being written) | "dram", key), or ("miss", None)."""
        device = self.manager.keys_of(user_id)
        dram = self.expander.keys_of(user_id) if self.expander is not None else []
        hashes: dict[int, str] = {}
        for key in sorted({*device, *dram}, key=lambda k: (-k.prefix_len, k.prefix_hash)):
            if key.model_version != self.model_version or key.prefix_len > len(history):
                continue
            if key.prefix_len not in hashes:
                hashes[key.prefix_len] = prefix_hash(history, key.prefix_len)
            if hashes[key.prefix_len] != key.prefix_hash:
                continue
            lease = self.manager.peek(key)
            if lease is not None:
                return ("device" if lease.state is EntryState.READY else "inflight"), key
            if self.expander is not None and self.expander.contains(key):
                return "dram", key
        return "miss", None

    def stats(self) -> CacheTierStats:
        return CacheTierStats(self.extended_tokens, self.promotions, self.spills, self.superseded,
                              self.manager.stats(), self.expander.stats() if self.expander is not None else None)

    # ----------------------------------------------------------------- device thread
    def take_dropped(self) -> list[CacheKey]:
        """The READY device entries dropped (evicted, superseded or released) since the last call."""
        dropped, self._dropped = self._dropped, []
        return dropped

    # ----------------------------------------------------------------- device thread: pre-infer
    def reserve(self, user_id: str, history: History, keep: Collection[CacheKey] = ()) -> SlotLease | None:
        """Reserve a slot for prefilling the whole `history` (None: no slot free, too long, or cached)."""
        if not 0 < len(history) <= self.max_prefix_len:
            return None
        key = self.key_for(user_id, history)
        if self.manager.peek(key) is not None:
            return None  # already cached or being prefilled
        return self._allocate(key, keep)

    def commit(self, lease: SlotLease, history: History, keep: Collection[CacheKey] = ()) -> None:
        """The prefill of `history` into a reserved slot finished: make it READY, and drop the same
        user's shorter entries it extends (their history moved on), except those in `keep`. Entries it
        does not extend stay."""
        self.manager.mark_ready(lease.key)
        self._supersede(lease.key, history, keep)

    def abort(self, lease: SlotLease) -> None:
        """The prefill of a reserved slot failed or was cancelled."""
        self.manager.abort(lease.key)
        self.store.release_slot(lease.slot)

    def promote_steps(self, key: CacheKey, keep: Collection[CacheKey] = ()) -> Generator[Any, None, bool]:
        """Reload `key`'s DRAM copy into a device slot ahead of its rank, as steps of the store's copy
        (one graph call each). Meanwhile the slot is reserved, so the prefix reads as in flight and
        nobody else reloads or uses it. False when there is no copy, the device has it, no slot is
        free, or recomputing is cheaper."""
        payload = self.expander.peek(key) if self.expander is not None else None
        if payload is None or self.manager.peek(key) is not None \
                or not self.reload_is_cheaper(payload.nbytes, key.prefix_len):
            return False
        spills = self.spills
        lease = self._allocate(key, keep)
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

    # ----------------------------------------------------------------- device thread: rank
    def acquire(self, user_id: str, history: History, keep: Collection[CacheKey] = ()) -> CacheHit | None:
        """Pin a device slot holding the longest cached prefix of `history` (reloading it from DRAM
        if needed, evicting entries in `keep` last), or None. The caller extends it if the suffix is
        too long, and `release`s it."""
        tier, key = self.locate(user_id, history)
        if tier == "device":
            lease = self.manager.lookup(key, pin=True)
            return CacheHit("device", key, lease.slot, key.prefix_len) if lease else None
        if tier == "dram":
            return self._reload(key, keep)
        return None

    def release(self, hit: CacheHit) -> None:
        self.manager.unpin(hit.key)

    def extend_steps(self, hit: CacheHit, history: History, chunk_len: int,
                     keep: Collection[CacheKey] = ()) -> Generator[None, None, CacheHit | None]:
        """Compute the events of `history` after the pinned `hit` in its slot, `chunk_len` events per
        step (yielding after each), and re-key the entry to the whole `history`; the hit stays pinned.
        None (hit released) when the history does not fit the slot, is already cached under its own key,
        or the hit is in `keep` (another rank may still need its prefix as it is)."""
        new_key = self.key_for(hit.key.user_id, history)
        if len(history) > self.max_prefix_len or self.manager.peek(new_key) is not None or hit.key in keep:
            self.release(hit)
            return None
        try:
            yield from self.extension_chunks(hit.slot, history, hit.prefix_len, chunk_len)
        except BaseException:
            self.release(hit)
            raise
        self.manager.rekey(hit.key, new_key)
        self._supersede(new_key, history, keep)
        return CacheHit("partial", new_key, hit.slot, len(history))

    def reopen(self, key: CacheKey, history: History, keep: Collection[CacheKey] = ()) -> SlotLease | None:
        """Turn the unpinned READY device entry of `key` (a prefix of `history`) into a reservation of
        the whole `history`, to extend it over several device steps (`extension_chunks`, then
        `commit` or `abort`). None when the history does not fit a slot, is cached already, or the
        entry is gone, pinned, not READY or in `keep` (a rank may still come for `key` as it is)."""
        new_key = self.key_for(key.user_id, history)
        lease = self.manager.peek(key)
        if (len(history) > self.max_prefix_len or self.manager.peek(new_key) is not None or lease is None
                or lease.state is not EntryState.READY or key in keep or not self.matches(key, history)):
            return None
        try:
            return self.manager.reopen(key, new_key)
        except ValueError:  # pinned
            return None

    def extension_chunks(self, slot: int, history: History, start: int, chunk_len: int) -> Iterator[None]:
        """Compute events [start, n) of `history` into `slot` (which holds [0, start)), `chunk_len` per
        graph call, yielding after each."""
        if chunk_len < 1:
            raise ValueError(f"chunk_len={chunk_len!r}: must be >= 1")
        while start < len(history):
            end = min(len(history), start + chunk_len)
            self.store.prefill(slot, history.slice(0, end), start=start)
            self.extended_tokens += end - start
            start = end
            yield

    # ----------------------------------------------------------------- device thread: admin
    def flush(self) -> None:
        """Drop every READY device entry (no spill) and every DRAM copy."""
        for lease in self.manager.leases():
            if lease.state is EntryState.READY and not self._release(lease.key, "released"):
                logger.info("flush: %s is pinned, left in place", lease.key)
        if self.expander is not None:
            self.expander.clear()

    def drop(self, key: CacheKey, reason: str) -> bool:
        """Drop `key` from both tiers without spilling (e.g. a corrupted slot); False if it is pinned
        or its prefill is running."""
        if self.expander is not None:
            self.expander.discard(key)
        lease = self.manager.peek(key)
        if lease is None:
            return True
        return lease.state is EntryState.READY and self._release(key, reason)

    # ----------------------------------------------------------------- internals
    def _release(self, key: CacheKey, reason: str) -> bool:
        """Drop a READY device entry without spilling it; False when it is pinned (it will age out)."""
        try:
            eviction = self.manager.release(key)
        except ValueError:
            logger.debug("%s entry %s is pinned; it will age out", reason, key)
            return False
        self.store.release_slot(eviction.slot)
        self._dropped.append(key)
        return True

    def _allocate(self, key: CacheKey, keep: Collection[CacheKey]) -> SlotLease | None:
        """A slot for `key`; an entry evicted for it is copied to DRAM first (per the spill policy)."""
        allocation = self.manager.allocate(key, keep=keep)
        if allocation is None:
            return None
        if allocation.evicted is not None:
            self._spill(allocation.evicted)
        return allocation.lease

    def _spill(self, eviction: Eviction) -> None:
        """Copy an evicted slot to DRAM (per the spill policy) before the slot is reused."""
        if (self.expander is not None and self.expander.should_spill(eviction.was_used)
                and not self.expander.contains(eviction.key)):
            self.expander.put(eviction.key, self.store.export_slot(eviction.slot))
            self.spills += 1
        self.store.release_slot(eviction.slot)
        self._dropped.append(eviction.key)

    def evict_one(self, keep: Collection[CacheKey] = ()) -> bool:
        """Evict the best victim now (spilled like any eviction); False when nothing can go."""
        eviction = self.manager.evict_one(keep)
        if eviction is not None:
            self._spill(eviction)
        return eviction is not None

    def _supersede(self, key: CacheKey, history: History, keep: Collection[CacheKey]) -> None:
        """Drop the user's READY entries and DRAM copies that are strict prefixes of `history`, except
        those in `keep`."""
        dram = self.expander.keys_of(key.user_id) if self.expander is not None else []
        for old in {*self.manager.keys_of(key.user_id), *dram}:
            if old == key or old in keep or old.prefix_len >= key.prefix_len or not self.matches(old, history):
                continue
            if self.expander is not None:
                self.expander.discard(old)
            lease = self.manager.peek(old)
            if lease is not None and lease.state is EntryState.READY and self._release(old, "superseded"):
                self.superseded += 1

    def _reload(self, key: CacheKey, keep: Collection[CacheKey]) -> CacheHit | None:
        payload = self.expander.peek(key)
        if payload is None or not self.reload_is_cheaper(payload.nbytes, key.prefix_len):
            return None
        lease = self._allocate(key, keep)
        if lease is None:
            return None  # every slot is pinned or reserved: recompute instead

        def copy(p: Any) -> int:
            self.store.import_slot(lease.slot, p)
            return lease.slot

        try:
            copied = self.expander.reload(key, copy, device_has_copy=None)
        except BaseException:
            self.abort(lease)
            raise
        if copied is None:  # the copy expired in between
            self.abort(lease)
            return None
        self.manager.mark_ready(key)
        self.manager.pin(key)
        return CacheHit("dram", key, lease.slot, key.prefix_len)
