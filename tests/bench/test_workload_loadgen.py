"""Workload generator and open-loop runner (no MindSpore)."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from mindspore_relaygr.bench.loadgen import Outcome, run_open_loop, summarize
from mindspore_relaygr.bench.workload import Workload, WorkloadSpec


def test_same_seed_same_workload_and_file_round_trip(tmp_path):
    spec = WorkloadSpec(num_users=30, num_requests=80, qps=5.0, seed=3)
    a, b = Workload.generate(spec), Workload.generate(spec)
    assert a.requests == b.requests and a.base_lens == b.base_lens
    a.save(tmp_path / "w.json")
    c = Workload.load(tmp_path / "w.json")
    assert c.requests == a.requests
    req = a.requests[17]
    for key, value in a.history(req).items():
        np.testing.assert_array_equal(value, c.history(req)[key])
    np.testing.assert_array_equal(a.candidates(req), c.candidates(req))
    assert Workload.generate(WorkloadSpec(num_users=30, num_requests=80, seed=4)).requests != a.requests


def test_distributions_follow_their_parameters():
    spec = WorkloadSpec(num_users=2000, num_requests=4000, qps=20.0, median_len=512, min_len=8, max_len=4096,
                        gap_ms=40.0, growth_per_visit=0, seed=1)
    w = Workload.generate(spec)
    assert abs(np.median(w.base_lens) / 512 - 1) < 0.1
    assert min(w.base_lens) >= 8 and max(w.base_lens) <= 4096
    gaps = np.diff([r.at_s for r in w.requests])
    assert abs(1 / gaps.mean() / 20 - 1) < 0.1
    assert abs(np.mean([r.gap_s for r in w.requests]) * 1e3 / 40 - 1) < 0.1
    counts = np.bincount([r.user for r in w.requests], minlength=2000)
    assert counts[0] > counts[10] > counts[1000]  # Zipf: low ranks revisit most


def test_gaps_have_a_floor_and_keep_their_mean():
    spec = WorkloadSpec(num_users=100, num_requests=4000, gap_ms=600.0, min_gap_ms=500.0, seed=2)
    gaps_ms = np.array([r.gap_s for r in Workload.generate(spec).requests]) * 1e3
    assert gaps_ms.min() >= 500.0 and abs(gaps_ms.mean() / 600 - 1) < 0.03
    assert abs(np.median(gaps_ms - 500.0) / (100 * np.log(2)) - 1) < 0.1  # exponential tail of mean 100 ms
    with pytest.raises(ValueError, match="min_gap_ms"):
        Workload.generate(WorkloadSpec(gap_ms=50.0, min_gap_ms=80.0))


def test_history_grows_between_visits_and_stays_chronological():
    w = Workload.generate(WorkloadSpec(num_users=3, num_requests=30, growth_per_visit=4, seed=2))
    by_user = [r for r in w.requests if r.user == w.requests[0].user]
    first, later = w.history(by_user[0]), w.history(by_user[-1])
    grown = len(later["item_ids"]) - len(first["item_ids"])
    assert grown == 4 * by_user[-1].visit
    np.testing.assert_array_equal(later["item_ids"][: len(first["item_ids"])], first["item_ids"])
    assert np.all(np.diff(later["timestamps"]) > 0)


def test_open_loop_sends_every_request_before_any_response_returns():
    """Open loop: no request waits for an earlier response. Every rank blocks until all ten have been sent;
    a loop that waited for responses would never get there (each rank would time out)."""
    w = Workload.generate(WorkloadSpec(num_users=5, num_requests=10, qps=20.0, gap_ms=0.0, seed=0))
    started = threading.Semaphore(0)
    all_sent = threading.Event()

    def blocked_rank(req):
        started.release()
        return ("miss", False, 200) if all_sent.wait(10) else ("", False, 599)

    def release_when_all_started():
        for _ in range(10):
            assert started.acquire(timeout=30)
        all_sent.set()

    watcher = threading.Thread(target=release_when_all_started)
    watcher.start()
    outcomes = run_open_loop(w, None, blocked_rank, max_workers=16, sleep=lambda s: None)
    watcher.join(30)
    assert len(outcomes) == 10 and all(o.ok for o in outcomes)


def test_open_loop_sleeps_until_each_scheduled_send():
    w = Workload.generate(WorkloadSpec(num_users=5, num_requests=10, qps=20.0, gap_ms=0.0, seed=0))
    now = [0.0]
    woke = []

    def sleep(seconds: float) -> None:
        now[0] += seconds
        woke.append(now[0])

    outcomes = run_open_loop(w, None, lambda req: ("miss", False, 200), max_workers=1, clock=lambda: now[0],
                             sleep=sleep)
    schedule = sorted({r.at_s + r.gap_s for r in w.requests} - {0.0})
    assert woke == pytest.approx(schedule)  # it woke exactly at each send time, never later, never in between
    assert sorted(o.scheduled_s for o in outcomes) == pytest.approx(sorted(r.at_s + r.gap_s for r in w.requests))


def test_summary_percentiles_and_counts_on_known_inputs():
    ranks = [Outcome("rank", 0, i * 0.1, float(i + 1), True, "device" if i % 2 else "miss") for i in range(100)]
    ranks.append(Outcome("rank", 1, 10.0, 5.0, False, status=503))
    ranks.append(Outcome("rank", 1, 10.0, 5.0, False, status=599, error="boom"))
    pre = [Outcome("preinfer", 0, 0.0, 1.0, True, "admitted"), Outcome("preinfer", 0, 0.0, 1.0, True, "load")]
    s = summarize(ranks + pre, offered_qps=10.0)
    assert s["p50_ms"] == pytest.approx(50.5) and s["p99_ms"] == pytest.approx(99.01) and s["max_ms"] == 100.0
    assert (s["ranks"], s["errors"], s["rejected_503"]) == (102, 1, 1)
    assert s["tiers"] == {"miss": 50, "device": 50} and s["hit_rate"] == 0.5
    assert s["trigger"] == {"admitted": 1, "load": 1}
    # device ranks took 2, 4, ..., 100 ms; misses 1, 3, ..., 99 ms; failed ranks count in no tier
    assert set(s["tier_latency_ms"]) == {"device", "miss"}
    assert s["tier_latency_ms"]["device"]["p50"] == pytest.approx(51.0)
    assert s["tier_latency_ms"]["miss"]["max"] == 99.0 and s["tier_latency_ms"]["device"]["max"] == 100.0
    assert s["tier_latency_ms"]["miss"]["p99"] == pytest.approx(np.percentile(np.arange(1, 100, 2), 99))
