"""GraphCallStats: timings per graph signature and compiles on the request path (no MindSpore)."""

from __future__ import annotations

import logging

from mindspore_relaygr.model.call_stats import GraphCallStats


def test_timings_are_kept_per_kind_and_shapes():
    stats = GraphCallStats()
    stats.record("full", [(512,), (128,)], 30.0)
    stats.record("full", [(512,), (128,)], 50.0)
    stats.record("full", [(1024,), (128,)], 40.0)
    stats.record("candidate", [(32,)], 5.0)
    top = stats.slowest(2)
    assert [(r["kind"], r["shapes"], r["calls"], r["max_ms"]) for r in top] == [
        ("full", [[512], [128]], 2, 50.0), ("full", [[1024], [128]], 1, 40.0)]
    assert top[0]["mean_ms"] == 40.0
    assert len(stats.slowest(10)) == 3


def test_first_calls_after_warm_up_are_cold_and_logged(caplog):
    stats = GraphCallStats()
    stats.record("prefix", [(64,)], 900.0)  # during warm-up: expected compile
    stats.mark_warm()
    stats.record("prefix", [(64,)], 3.0)
    assert stats.cold_calls == []
    with caplog.at_level(logging.WARNING, logger="mindspore_relaygr.model.call_stats"):
        stats.record("extend", [(64,), (512,)], 1200.0)
    assert [(c.kind, c.shapes, c.max_ms) for c in stats.cold_calls] == [("extend", ((64,), (512,)), 1200.0)]
    assert "not warmed up" in caplog.text
    stats.record("extend", [(64,), (512,)], 4.0)  # compiled now: not cold again
    assert len(stats.cold_calls) == 1


def test_reset_forgets_timings_but_not_what_was_compiled():
    stats = GraphCallStats()
    stats.record("full", [(8,)], 1.0)
    stats.mark_warm()
    stats.reset()
    assert stats.slowest() == []
    stats.record("full", [(8,)], 2.0)
    assert stats.cold_calls == [] and stats.slowest()[0]["calls"] == 1
