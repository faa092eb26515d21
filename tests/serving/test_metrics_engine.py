"""/metrics against the real RelayEngine (not the fake): per-tier hits and misses, one per rank, and
every scrape-time metric resolves to a field of the engine's typed stats."""

from __future__ import annotations

import numpy as np
import pytest

from mindspore_relaygr.config import load_config
from mindspore_relaygr.relay.engine import RelayEngine
from serving.app import create_app
from serving.metrics import STATS_METRICS, _lookup
from tests.conftest import CONFIGS
from tests.relay.test_engine_fake import BASE, latency
from tests.serving.conftest import make_history

USERS = [f"m{i}" for i in range(5)]  # one more user than the 4 slots


def body(user, seed, rank=True):
    out = {"user_id": user, "history": make_history(60, seed, user_features=[1, 2])}
    if rank:
        out["candidates"] = {"item_ids": list(range(1, 11))}
    return out


def drive(client, engine):
    """5 relayed users (the first spilled to DRAM), a DRAM-served rank and a miss."""
    for seed, user in enumerate(USERS):
        assert client.post("/v1/preinfer", json=body(user, seed, rank=False),
                           headers={"X-RelayGR-Affinity": user}).json["admitted"]
        engine.wait_prefills(60)
        assert client.post("/v1/rank", json=body(user, seed)).json["cache"] == "device"
    assert client.post("/v1/rank", json=body(USERS[0], 0)).json["cache"] == "dram"
    assert client.post("/v1/rank", json=body("stranger", 99)).json["cache"] == "miss"


def expected_lines():
    return ['relaygr_cache_hits_total{tier="device"} 5.0', 'relaygr_cache_hits_total{tier="dram"} 1.0',
            'relaygr_cache_hits_total{tier="partial"} 0.0', 'relaygr_cache_hits_total{tier="inflight"} 0.0',
            'relaygr_cache_misses_total{tier="device"} 2.0', 'relaygr_cache_misses_total{tier="dram"} 1.0',
            'relaygr_cache_dram_reloads_total 1.0', "relaygr_prefills_total 5.0"]


def test_every_stats_metric_resolves_on_the_engines_stats():
    from tests.relay.fake_model import FakeModel

    cfg = load_config(CONFIGS / "tiny.yaml", BASE)
    engine = RelayEngine(cfg, FakeModel(cfg), latency())
    try:
        stats = engine.stats()
        for name, _, _, sources in STATS_METRICS:
            for path, _ in sources:
                assert _lookup(stats, path) is not None, (name, path)
    finally:
        engine.close()


def _per_tier_metrics_of(make_model) -> RelayEngine:
    """Drive an engine over `make_model(cfg)` through the app and check every per-tier metric line; returns
    the engine (closed)."""
    cfg = load_config(CONFIGS / "tiny.yaml", [*BASE, "expander.enable_prefetch=false"])
    engine = RelayEngine(cfg, make_model(cfg), latency())
    try:
        client = create_app(cfg, engine=engine).test_client()
        drive(client, engine)
        text = client.get("/metrics").get_data(as_text=True)
        for line in expected_lines():
            assert line in text, line
        return engine
    finally:
        engine.close()


def test_per_tier_metrics_with_the_fake_model_engine():
    from tests.relay.fake_model import FakeModel

    _per_tier_metrics_of(FakeModel)


@pytest.mark.slow
def test_per_tier_metrics_with_the_real_tiny_model():
    from mindspore_relaygr.model import RelayGRModel

    engine = _per_tier_metrics_of(RelayGRModel)
    assert np.isfinite(engine.stats().copy_bytes_per_s)


def test_audit_metrics_and_histogram_with_the_fake_model_engine():
    from tests.relay.fake_model import FakeModel

    cfg = load_config(CONFIGS / "tiny.yaml", [*BASE, "expander.enable_prefetch=false", "relay.audit_fraction=1.0"])
    engine = RelayEngine(cfg, FakeModel(cfg), latency())
    try:
        client = create_app(cfg, engine=engine).test_client()
        drive(client, engine)
        engine.wait_audits(10)
        audit = engine.stats().audit
        assert audit.checked + audit.skipped == 6 and audit.failures == 0  # 5 device + 1 dram rank
        text = client.get("/metrics").get_data(as_text=True)
        assert f"relaygr_audit_checks_total {float(audit.checked)}" in text
        assert f"relaygr_audit_max_abs_diff_count {float(audit.checked)}" in text
        assert f'relaygr_audit_max_abs_diff_bucket{{le="1e-08"}} {float(audit.checked)}' in text
    finally:
        engine.close()


def test_device_batch_size_histogram_counts_every_rank_call():
    from tests.relay.fake_model import FakeModel

    cfg = load_config(CONFIGS / "tiny.yaml", [*BASE, "expander.enable_prefetch=false"])
    engine = RelayEngine(cfg, FakeModel(cfg), latency())
    try:
        client = create_app(cfg, engine=engine).test_client()
        drive(client, engine)  # 7 ranks, one at a time: 7 device calls of one rank each
        text = client.get("/metrics").get_data(as_text=True)
        assert 'relaygr_device_batch_size_bucket{le="1",work="rank"} 7.0' in text
        assert 'relaygr_device_batch_size_count{work="rank"} 7.0' in text
        assert 'relaygr_device_batch_size_sum{work="rank"} 7.0' in text
    finally:
        engine.close()
