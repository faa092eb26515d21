from __future__ import annotations

import threading
from dataclasses import dataclass

import numpy as np
import pytest

from mindspore_relaygr.cache import CacheKey, DRAMExpander
from tests.waiting import wait_until


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


@dataclass
class Payload:
    kv: np.ndarray

    @property
    def nbytes(self) -> int:
        return int(self.kv.nbytes)


def key(name: str) -> CacheKey:
    return CacheKey(name, "v1", 4, "h-" + name)


def payload(nbytes: int) -> Payload:
    return Payload(np.zeros(nbytes, np.uint8))


def make(budget: float = 300, ttl_s: float = 10.0, policy: str = "always") -> tuple[DRAMExpander, FakeClock]:
    clock = FakeClock()
    return DRAMExpander(budget, ttl_s, policy, clock=clock), clock


def test_lru_eviction_within_budget() -> None:
    exp, _ = make(300)
    for name in "abc":
        assert exp.put(key(name), payload(100))
    assert exp.get(key("a")) is not None  # "b" becomes the LRU entry
    assert exp.put(key("d"), payload(150))  # needs two evictions: "b", then "c"
    assert [exp.contains(key(n)) for n in "abcd"] == [True, False, False, True]
    assert exp.bytes_in_use() == 250
    assert exp.put(key("a"), payload(50))  # replacing frees the old bytes first
    assert exp.bytes_in_use() == 200 and exp.stats().evictions == 2


def test_ttl_expiry_is_preferred_over_lru() -> None:
    exp, clock = make(300, ttl_s=10.0)
    exp.put(key("a"), payload(100))
    clock.now = 5.0
    exp.put(key("b"), payload(100))
    exp.put(key("c"), payload(100))
    exp.get(key("a"))  # LRU order is now b, c, a
    clock.now = 10.0  # "a" expired (10 s after its put)
    assert exp.put(key("d"), payload(100))
    assert [exp.contains(key(n)) for n in "abcd"] == [False, True, True, True]
    clock.now = 15.0
    assert exp.get(key("b")) is None and exp.bytes_in_use() == 200  # expired entries go on access
    assert not exp.contains(key("c")) and exp.bytes_in_use() == 100
    stats = exp.stats()
    assert (stats.expirations, stats.evictions, stats.misses) == (3, 0, 1)


def test_oversized_payload_is_refused_and_counted() -> None:
    exp, _ = make(300)
    exp.put(key("a"), payload(100))
    assert not exp.put(key("big"), payload(301))
    assert exp.contains(key("a")) and not exp.contains(key("big")) and exp.stats().refused == 1
    with pytest.raises(ValueError, match="nbytes"):
        exp.put(key("x"), object())
    assert exp.discard(key("a")) and not exp.discard(key("a")) and exp.bytes_in_use() == 0


@pytest.mark.parametrize(("policy", "expected"), [("always", (True, True)), ("used", (True, False)),
                                                  ("never", (False, False))])
def test_spill_policy(policy: str, expected: tuple[bool, bool]) -> None:
    exp, _ = make(policy=policy)
    assert (exp.should_spill(was_used=True), exp.should_spill(was_used=False)) == expected


def test_bad_arguments_raise_with_the_value() -> None:
    with pytest.raises(ValueError, match="'sometimes'"):
        make(policy="sometimes")
    with pytest.raises(ValueError, match="budget_bytes=0"):
        make(budget=0)


def test_a_reload_counts_one_hit_and_peek_counts_none() -> None:
    exp, _ = make()
    exp.put(key("a"), Payload(np.zeros(100, np.uint8)))
    assert exp.peek(key("a")) is not None and exp.stats().hits == 0
    exp.reload(key("a"), lambda payload: payload.nbytes)
    assert (exp.stats().hits, exp.stats().reloads) == (1, 1)


def test_clear_and_keys_of() -> None:
    exp, _ = make()
    for name in ("a", "b"):
        exp.put(key(name), Payload(np.zeros(10, np.uint8)))
    assert exp.keys_of(key("a").user_id) == [key("a")] and exp.clear() == 2
    assert exp.keys_of(key("a").user_id) == [] and exp.bytes_in_use() == 0


def run_concurrently(exp: DRAMExpander, copy_fn, n: int = 8) -> tuple[list[threading.Thread], list]:
    """n threads reload key "a"; returns each thread's result or exception."""
    out: list = [None] * n

    def worker(i: int) -> None:
        try:
            out[i] = exp.reload(key("a"), copy_fn)
        except Exception as exc:
            out[i] = exc

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    return threads, out


def test_single_flight_reload_runs_one_copy_for_all_callers() -> None:
    exp, _ = make()
    exp.put(key("a"), payload(100))
    calls, release = [], threading.Event()

    def copy_fn(p: Payload) -> tuple[str, int]:
        calls.append(p.nbytes)
        assert release.wait(10), "copy_fn was never released"
        return ("slot", 5)

    threads, out = run_concurrently(exp, copy_fn)
    wait_until(lambda: exp.stats().reload_waits == 7)  # all others joined the running copy
    release.set()
    for t in threads:
        t.join()
    assert calls == [100] and out == [("slot", 5)] * 8
    stats = exp.stats()
    assert (stats.reloads, stats.reload_waits, stats.bytes_copied) == (1, 7, 100)


def test_reload_errors_reach_every_waiter_and_the_next_call_retries() -> None:
    exp, _ = make()
    exp.put(key("a"), payload(100))
    release = threading.Event()

    def failing(p: Payload) -> None:
        assert release.wait(10)
        raise RuntimeError("device copy failed")

    threads, out = run_concurrently(exp, failing, n=4)
    wait_until(lambda: exp.stats().reload_waits == 3)
    release.set()
    for t in threads:
        t.join()
    assert all(isinstance(e, RuntimeError) and str(e) == "device copy failed" for e in out)
    assert exp.reload(key("a"), lambda p: "ok") == "ok"
    assert exp.stats().reloads == 1


def test_no_reload_when_device_has_copy_or_key_is_absent() -> None:
    exp, _ = make()
    exp.put(key("a"), payload(100))
    calls = []
    assert exp.reload(key("a"), calls.append, device_has_copy=lambda: True) is None
    assert exp.reload(key("missing"), calls.append, device_has_copy=lambda: False) is None
    assert calls == []
    stats = exp.stats()
    assert (stats.skipped_reloads, stats.reloads, stats.bytes_copied) == (1, 0, 0)


def test_keys_of_a_user_whose_copies_expired_drops_them_without_error() -> None:
    """keys_of iterated over the user's key set while dropping its expired copies from it: a pre-infer
    of a returning user whose DRAM copies had outlived expander.ttl_s failed with a 500
    ('Set changed size during iteration'), seen in `relaygr bench soak -o expander.ttl_s=120`."""
    ex, clock = make(budget=1000, ttl_s=10.0)
    short, longer = CacheKey("u", "v1", 4, "h4"), CacheKey("u", "v1", 8, "h8")
    ex.put(short, payload(10))
    clock.now = 5.0
    ex.put(longer, payload(10))
    clock.now = 12.0  # the first copy has expired, the second not
    assert ex.keys_of("u") == [longer]
    clock.now = 20.0
    assert ex.keys_of("u") == [] and ex.stats().num_entries == 0 and ex.stats().expirations == 2
