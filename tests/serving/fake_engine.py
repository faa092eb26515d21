"""A numpy stand-in for RelayEngine with the same contract (no MindSpore): deterministic scores, a
per-user prefix cache, the same validation and errors. Also loadable by a real gunicorn worker:
`relaygr serve --engine-factory tests.serving.fake_engine:FakeEngine.from_config`.

Environment knobs for multi-process tests: RELAYGR_FAKE_OVERLOADED="i1,i2" makes those instances
answer every rank with Overloaded; RELAYGR_FAKE_STARTUP_S delays start-up like a warm-up;
RELAYGR_FAKE_RANK_MS makes every rank hold one device lock for that long (a device thread's service time).
"""

from __future__ import annotations

import hashlib
import os
import threading
import time
from collections import Counter
from typing import Any

import numpy as np

from mindspore_relaygr.cache.expander import DramTierStats
from mindspore_relaygr.cache.hierarchy import CacheTierStats
from mindspore_relaygr.cache.manager import DeviceTierStats
from mindspore_relaygr.config import RelayGRConfig
from mindspore_relaygr.errors import Overloaded
from mindspore_relaygr.model.inputs import History, validate_candidates, validate_history
from mindspore_relaygr.relay.audit import AuditStats
from mindspore_relaygr.relay.ledger import LedgerStats
from mindspore_relaygr.relay.stats import DeviceWorkCounts, EngineStats, RankTierCounts
from mindspore_relaygr.relay.trigger import TriggerStats
from mindspore_relaygr.relay.types import PreinferResult, RankResult

PREDICTED_MS_PER_EVENT = 0.25


def prefix_digest(hist: History, n: int) -> str:
    h = hashlib.blake2b(digest_size=16)
    for arr in (hist.item_ids[:n], hist.action_ids[:n], hist.timestamps[:n]):
        h.update(np.ascontiguousarray(arr, dtype=np.int64).tobytes())
    if hist.user_features is not None:
        h.update(np.asarray(hist.user_features, np.int64).tobytes())
    return h.hexdigest()


def fake_scores(hist: History, cands: np.ndarray, num_tasks: int) -> np.ndarray:
    """float32 [M, num_tasks], a deterministic function of the whole history and each candidate."""
    mix = int(int(prefix_digest(hist, len(hist))[:8], 16) % 10007)
    tasks = np.arange(1, num_tasks + 1)
    x = np.sin(np.outer(cands.astype(np.float64), tasks) * 0.37 + mix * 0.001 * tasks)
    return (1.0 / (1.0 + np.exp(-3 * x))).astype(np.float32)


class FakeEngine:
    """RelayEngine's public surface over a dict cache; `calls` records (method, user_id) reaching it."""

    def __init__(self, config: RelayGRConfig, instance_id: str = "i0", overloaded: bool = False,
                 rank_ms: float = 0.0) -> None:
        self.config = config
        self.instance_id = instance_id
        self.overloaded = overloaded
        self.rank_ms = rank_ms
        self._device = threading.Lock()
        self.fail_with: BaseException | None = None  # raised by the next preinfer/rank (then cleared)
        self._ready = True
        self._lock = threading.Lock()
        self._cache: dict[str, tuple[str, int, float]] = {}  # user -> (prefix digest, prefix len, created)
        self.calls: list[tuple[str, str]] = []
        self.counters: Counter[str] = Counter()
        self.closed = False

    @classmethod
    def from_config(cls, config: RelayGRConfig, instance_id: str = "i0") -> FakeEngine:
        time.sleep(float(os.environ.get("RELAYGR_FAKE_STARTUP_S", "0")))
        overloaded = instance_id in os.environ.get("RELAYGR_FAKE_OVERLOADED", "").split(",")
        rank_ms = float(os.environ.get("RELAYGR_FAKE_RANK_MS", "0"))
        return cls(config, instance_id, overloaded=overloaded, rank_ms=rank_ms)

    @property
    def ready(self) -> bool:
        return self._ready and not self.closed

    @property
    def model_version(self) -> str:
        return self.config.model.version

    def cache_entry(self, user_id: str) -> tuple[str, int, float] | None:
        with self._lock:
            return self._cache.get(user_id)

    def _maybe_fail(self) -> None:
        exc, self.fail_with = self.fail_with, None
        if exc is not None:
            raise exc

    def preinfer(self, user_id: str, history: Any, num_candidates: int | None = None) -> PreinferResult:
        self.calls.append(("preinfer", user_id))
        self._maybe_fail()
        hist = validate_history(self.config.model, history)
        if not self.config.relay.enabled:
            return self._count(PreinferResult(False, "disabled", None, 0.0))
        digest = prefix_digest(hist, len(hist))
        predicted = 0.5 * len(hist)
        with self._lock:
            entry = self._cache.get(user_id)
            if entry is not None and entry[0] == digest:
                return self._count(PreinferResult(False, "already_cached", None, predicted))
            if len(hist) < self.config.trigger.min_prefix_len:
                return self._count(PreinferResult(False, "not_at_risk", None, predicted))
            self._cache[user_id] = (digest, len(hist), time.monotonic())
        return self._count(PreinferResult(True, "admitted", digest[:16], predicted))

    def predicted_rank_ms(self, user_id: str, history: Any, candidate_ids: Any) -> float:
        """RELAYGR_FAKE_RANK_MS when set, else PREDICTED_MS_PER_EVENT per event (rank_body's 20: 5 ms)."""
        hist = validate_history(self.config.model, history)
        validate_candidates(self.config.model, candidate_ids)
        return self.rank_ms or PREDICTED_MS_PER_EVENT * len(hist)

    def queue_share(self, queued: int) -> float:
        """Ranks run one at a time here."""
        return 1.0

    def rank(self, user_id: str, history: Any, candidate_ids: Any, top_k: int | None = None) -> RankResult:
        self.calls.append(("rank", user_id))
        self._maybe_fail()
        t0 = time.perf_counter()
        hist = validate_history(self.config.model, history)
        cands = validate_candidates(self.config.model, candidate_ids)
        if self.overloaded:
            raise Overloaded(f"instance {self.instance_id}: ranking queue would miss the SLO")
        tier, truncated = "miss", False
        if not self.config.relay.enabled:
            tier = "bypass"
            max_events = self.config.relay.max_online_len
            truncated = len(hist) > max_events
            if truncated:
                hist = hist.slice(len(hist) - max_events)
        else:
            entry = self.cache_entry(user_id)
            if entry is not None and entry[1] <= len(hist) and prefix_digest(hist, entry[1]) == entry[0]:
                tier = "device"
        if self.rank_ms:
            with self._device:
                time.sleep(self.rank_ms / 1e3)
        scores = fake_scores(hist, cands, len(self.config.model.task_names))
        order = np.argsort(-scores.sum(1), kind="stable")[: top_k or len(cands)].tolist()
        self.counters[f"rank_{tier}"] += 1
        ms = (time.perf_counter() - t0) * 1e3
        return RankResult(scores, order, tier, truncated, {"wait": 0.0, "queue": 0.0, "compute": ms, "total": ms},
                          ranked_events=len(hist))

    def _count(self, result: PreinferResult) -> PreinferResult:
        self.counters[f"preinfer_{result.reason}"] += 1
        return result

    def stats(self) -> EngineStats:
        with self._lock:
            n = len(self._cache)
        slots = self.config.cache.num_slots or 8
        ranks = RankTierCounts(device=self.counters["rank_device"], miss=self.counters["rank_miss"],
                               bypass=self.counters["rank_bypass"])
        device = DeviceTierStats(num_slots=slots, num_free_slots=max(slots - n, 0), num_ready=n,
                                 bytes_in_use=n * 1024)
        return EngineStats(
            instance=self.instance_id, model_version=self.model_version, ready=self.ready,
            relay_enabled=self.config.relay.enabled, queue_depth=0, copy_bytes_per_s=1e9, slot_bytes=1024,
            ranks=ranks, work=DeviceWorkCounts(),
            relays=LedgerStats(n, 0, n, 0, 0, 0, 0, 0), trigger=TriggerStats({}, 100.0),
            cache=CacheTierStats(0, 0, 0, 0, device, DramTierStats(bytes_copied=int(np.int64(0)))),
            audit=AuditStats(), preinfers={k[9:]: v for k, v in self.counters.items() if k.startswith("preinfer_")},
        )

    def flush(self) -> None:
        with self._lock:
            self._cache.clear()

    def close(self) -> None:
        self.closed = True
