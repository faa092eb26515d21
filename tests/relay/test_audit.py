"""Exactness audit: sampling, the difference histogram, and (fake model) a corrupted slot detected
off the rank's path and dropped."""

from __future__ import annotations

import logging

import numpy as np
import pytest

from mindspore_relaygr import load_config
from mindspore_relaygr.relay.audit import DIFF_BUCKETS, MAX_PENDING, ExactnessAudit
from mindspore_relaygr.relay.engine import RelayEngine
from tests.conftest import CONFIGS
from tests.relay.fake_model import FakeModel
from tests.relay.test_engine_fake import BASE, CANDS, hist, latency, relay, validate


@pytest.fixture
def make_engine():
    engines = []

    def make(*overrides):
        cfg = load_config(CONFIGS / "tiny.yaml", [*BASE, *overrides])
        engines.append(RelayEngine(cfg, FakeModel(cfg), latency()))
        return engines[-1]

    yield make
    for eng in engines:
        eng.close()


@pytest.mark.parametrize("fraction, offered, sampled", [(0.0, 10, 0), (1.0, 10, 10), (0.25, 10, 2), (0.5, 9, 4)])
def test_sampling_takes_an_even_fraction_of_the_offered_ranks(fraction, offered, sampled):
    audit = ExactnessAudit(fraction, max_pending=100)
    assert sum(audit.sample() for _ in range(offered)) == sampled


def test_samples_beyond_the_pending_bound_are_skipped():
    audit = ExactnessAudit(1.0)
    assert [audit.sample() for _ in range(MAX_PENDING + 2)] == [True] * MAX_PENDING + [False, False]
    assert audit.stats().skipped == 2
    audit.finished(0.0)
    assert audit.sample()


def test_results_fill_the_histogram_and_count_failures_over_the_tolerance():
    audit = ExactnessAudit(1.0, max_pending=10)
    for diff in (0.0, 5e-6, 2e-5, float("nan")):
        assert audit.sample()
        audit.finished(diff)
    stats = audit.stats()
    assert (stats.checked, stats.failures, stats.max_abs_diff) == (4, 2, float("inf"))
    hist_ = dict(stats.histogram())
    assert hist_[repr(1e-8)] == 1 and hist_[repr(1e-5)] == 2 and hist_[repr(1e-4)] == 3 and hist_["+Inf"] == 4
    assert len(stats.histogram()) == len(DIFF_BUCKETS) + 1


def test_a_fraction_outside_0_1_is_rejected():
    with pytest.raises(ValueError, match="fraction=1.5"):
        ExactnessAudit(1.5)


def test_a_corrupted_slot_is_detected_after_the_rank_and_dropped(make_engine, caplog):
    eng = make_engine("relay.audit_fraction=1.0")
    h = hist(5)
    relay(eng, "u", h)
    key = eng.cache.key_for("u", validate(eng, h))
    eng.model.corrupt(eng.cache.manager.peek(key).slot)
    with caplog.at_level(logging.ERROR, logger="mindspore_relaygr.relay.engine"):
        res = eng.rank("u", h, CANDS)
        assert res.cache == "device"  # the rank itself is not held up by the audit
        eng.wait_audits(10)
    stats = eng.stats().audit
    assert (stats.checked, stats.failures) == (1, 1) and stats.max_abs_diff > 1e-5
    assert any(str(key) in r.getMessage() and "entry dropped" in r.getMessage() for r in caplog.records)
    assert eng.cache.locate("u", validate(eng, h)) == ("miss", None)
    again = eng.rank("u", h, CANDS)
    assert again.cache == "miss"
    np.testing.assert_array_equal(again.scores, eng.model.rank_full(h, CANDS))


def test_an_intact_slot_passes_the_audit_and_stays(make_engine):
    eng = make_engine("relay.audit_fraction=1.0")
    h = hist(6)
    relay(eng, "u", h)
    eng.rank("u", h, CANDS)
    eng.wait_audits(10)
    stats = eng.stats().audit
    assert (stats.checked, stats.failures, stats.max_abs_diff) == (1, 0, 0.0)
    assert eng.rank("u", h, CANDS).cache == "device"


def test_no_audit_by_default_and_misses_are_never_audited(make_engine):
    eng = make_engine()
    h = hist(7)
    relay(eng, "u", h)
    eng.rank("u", h, CANDS)
    full = make_engine("relay.audit_fraction=1.0")
    full.rank("stranger", h, CANDS)
    for e in (eng, full):
        e.wait_audits(10)
        assert e.stats().audit.checked == 0
