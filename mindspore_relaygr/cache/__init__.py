"""Prefix KV-cache bookkeeping (plain Python): keys, device slot manager and the DRAM tier."""

from __future__ import annotations

from mindspore_relaygr.cache.expander import DRAMExpander, ExpanderCounters
from mindspore_relaygr.cache.keys import CacheKey, prefix_hash
from mindspore_relaygr.cache.manager import (
    EVICTION_REASONS,
    CacheCounters,
    EntryState,
    Eviction,
    KVCacheManager,
    SlotLease,
)

__all__ = ["EVICTION_REASONS", "CacheCounters", "CacheKey", "DRAMExpander", "EntryState", "Eviction",
           "ExpanderCounters", "KVCacheManager", "SlotLease", "prefix_hash"]
