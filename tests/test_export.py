"""Serving bundle: export -> verify -> load gives the same scores; missing or corrupt files are refused;
the MindIR prefix and candidate graphs reproduce the Cell's scores."""

from __future__ import annotations

import json
import shutil
import stat

import numpy as np
import pytest

from mindspore_relaygr import load_config
from mindspore_relaygr.errors import BundleError
from mindspore_relaygr.export import (
    MANIFEST_FILE,
    Vocabulary,
    check_mindir,
    check_mindir_batch,
    export_batch_buckets,
    export_bundle,
    load_bundle,
    load_vocabulary,
    mindir_plan,
    sha256_file,
    verify_bundle,
)
from tests.conftest import CONFIGS, random_history, split_history

pytestmark = pytest.mark.slow
USER = [2, 4]
VOCAB = Vocabulary(item_vocab={1000 + i: i for i in range(1, 201)}, user_vocab={7: 1, 9: 2},
                   item_titles={i: f"Movie {i} (199{i % 10})" for i in range(1, 201)},
                   user_features={1: (2, 4), 2: (1, 0)}, user_feature_names=("gender", "age_bucket"),
                   event_types=("click", "cart", "buy", 7), event_column="event",
                   user_feature_vocabs=({"F": 1, "M": 2}, {18: 1, 25: 2, 35: 3, 45: 4}),
                   label_rule={"events": ["buy"]})


@pytest.fixture(scope="module")
def model_and_bundle(tmp_path_factory):
    from mindspore_relaygr.model.ranker import RelayGRModel
    from tests.model.conftest import randomize_weights

    cfg = load_config(CONFIGS / "tiny.yaml")
    model = RelayGRModel(cfg)
    randomize_weights(model, seed=5)
    out = export_bundle(model, cfg, VOCAB, tmp_path_factory.mktemp("export") / "bundle", name="tiny")
    return model, out


def test_bundle_files_manifest_and_version(model_and_bundle):
    model, out = model_and_bundle
    manifest = verify_bundle(out)
    checkpoint_sha = sha256_file(out / "model.ckpt")
    assert manifest["model_version"] == f"tiny-{checkpoint_sha[:12]}"
    assert load_config(out / "config.yaml").model.version == manifest["model_version"]
    plan = mindir_plan(model.config)
    assert sorted(manifest["mindir"]) == sorted(f"{stem}.mindir" for stem in plan)
    assert set(manifest["files"]) == {p.name for p in out.iterdir()} - {MANIFEST_FILE}
    assert load_vocabulary(out) == VOCAB
    items = json.loads((out / "items.json").read_text())
    assert items["raw_to_dense"]["1007"] == 7 and items["titles"]["7"] == "Movie 7 (1997)"
    events = json.loads((out / "events.json").read_text())
    assert events == {"column": "event", "types": ["click", "cart", "buy", 7], "label": {"events": ["buy"]}}


def test_bundle_files_are_readable_by_every_account(model_and_bundle):
    """MindSpore writes checkpoints and MindIR files mode 0400: a service account other than the exporter could
    not read them. A bundle is installed like a package: directories 0755, files 0644."""
    _, out = model_and_bundle
    modes = {p.name: stat.S_IMODE(p.stat().st_mode) for p in [out, *out.rglob("*")]}
    assert modes[out.name] == 0o755
    assert {name: mode for name, mode in modes.items() if name != out.name and mode != 0o644} == {}
    assert any(name.endswith(".mindir") for name in modes) and "model.ckpt" in modes


def test_loaded_bundle_scores_like_the_original(model_and_bundle):
    model, out = model_and_bundle
    cfg, loaded = load_bundle(out, ["cache.num_slots=2"])
    assert cfg.cache.num_slots == 2 and loaded.version == cfg.model.version != model.version
    rng = np.random.default_rng(0)
    for n, suffix in [(10, 3), (90, 8)]:
        hist = random_history(rng, n, user_features=USER)
        cands = rng.integers(1, 201, 20)
        expected = model.rank_full(hist, cands)
        np.testing.assert_array_equal(loaded.rank_full(hist, cands), expected)
        pre, suf = split_history(hist, n - suffix)
        loaded.prefill(1, pre)
        np.testing.assert_allclose(loaded.rank_cached(1, n - suffix, suf, cands), expected, rtol=0, atol=1e-5)


@pytest.mark.parametrize(("n", "suffix", "m"), [(1, 0, 1), (30, 5, 8), (100, 16, 32), (127, 0, 20)])
def test_mindir_graphs_reproduce_the_cell(model_and_bundle, n, suffix, m):
    model, out = model_and_bundle
    rng = np.random.default_rng(n)
    hist = random_history(rng, n, user_features=USER)
    assert check_mindir(out, model, hist, rng.integers(1, 201, m), suffix_len=suffix) <= 1e-5


def test_a_bundle_exports_batched_candidate_graphs_up_to_max_rank_batch(tmp_path):
    """relay.max_rank_batch 2: one batched graph per prefix bucket, whose users each score as rank_full; more users
    than the exported batch bucket are refused naming what is missing. max_rank_batch 1 exports none."""
    from mindspore_relaygr.model.ranker import RelayGRModel
    from tests.model.conftest import randomize_weights

    assert export_batch_buckets(load_config(CONFIGS / "tiny.yaml")) == []
    # one suffix and one candidate bucket: the single-user graphs of the other buckets are the module bundle's
    cfg = load_config(CONFIGS / "tiny.yaml", ["relay.max_rank_batch=2", "model.len_buckets=[64, 128]",
                                              "model.suffix_buckets=[16]", "model.candidate_buckets=[32]"])
    assert export_batch_buckets(cfg) == [2]
    model = RelayGRModel(cfg)
    randomize_weights(model, seed=6)
    out = export_bundle(model, cfg, VOCAB, tmp_path / "bundle", name="tiny")
    batched = sorted(n for n, e in verify_bundle(out)["mindir"].items() if e["graph"] == "candidate_batch")
    assert batched == ["candidate_b2_p128_s16_m32.mindir", "candidate_b2_p64_s16_m32.mindir"]
    rng = np.random.default_rng(11)
    requests = [(random_history(rng, 40, user_features=USER), rng.integers(1, 201, 12)),
                (random_history(rng, 100, user_features=USER), rng.integers(1, 201, 30))]
    assert check_mindir_batch(out, model, requests, suffix_len=5) <= 1e-5  # past buckets 64 and 128: padded
    assert check_mindir_batch(out, model, requests[:1], suffix_len=0) <= 1e-5  # one user, padded to the bucket
    with pytest.raises(BundleError, match="no bundled candidate_batch graph takes 3 user"):
        check_mindir_batch(out, model, requests + requests[:1])


def _copy(out, tmp_path):
    dst = tmp_path / "copy"
    shutil.copytree(out, dst)
    return dst


def test_missing_file_is_refused(model_and_bundle, tmp_path):
    _, out = model_and_bundle
    bundle = _copy(out, tmp_path)
    (bundle / "items.json").unlink()
    with pytest.raises(BundleError, match="file items.json is missing"):
        load_bundle(bundle)
    (bundle / MANIFEST_FILE).unlink()
    with pytest.raises(BundleError, match="manifest.json is missing"):
        verify_bundle(bundle)
    with pytest.raises(BundleError, match="not a directory"):
        verify_bundle(tmp_path / "nope")


@pytest.mark.parametrize("name", ["model.ckpt", "config.yaml", "prefix_p32.mindir"])
def test_corrupt_file_is_refused(model_and_bundle, tmp_path, name):
    _, out = model_and_bundle
    bundle = _copy(out, tmp_path)
    data = bytearray((bundle / name).read_bytes())
    data[len(data) // 2] ^= 0x01
    (bundle / name).chmod(0o600)  # MindSpore writes checkpoints and MindIR read-only
    (bundle / name).write_bytes(bytes(data))
    with pytest.raises(BundleError, match=f"file {name} is corrupt"):
        load_bundle(bundle)


def test_corrupt_manifest_and_existing_directory(model_and_bundle, tmp_path):
    model, out = model_and_bundle
    bundle = _copy(out, tmp_path)
    (bundle / MANIFEST_FILE).write_text("{not json")
    with pytest.raises(BundleError, match="manifest.json is unreadable or corrupt"):
        verify_bundle(bundle)
    with pytest.raises(BundleError, match="already exists"):
        export_bundle(model, model.config, VOCAB, out)


def test_engine_from_bundle_ranks_like_the_original_model(model_and_bundle, tmp_path):
    from mindspore_relaygr.relay.engine import RelayEngine
    from mindspore_relaygr.relay.latency import LatencyModel, LatencyPoint

    model, out = model_and_bundle
    profile = tmp_path / "latency.json"
    LatencyModel([LatencyPoint("full", 128, 32, 0, 500.0), LatencyPoint("relay", 128, 16, 32, 5.0),
                  LatencyPoint("prefill", 128, 0, 0, 20.0)]).to_json(profile)
    engine = RelayEngine.from_bundle(out, [f"trigger.latency_profile={profile}", "relay.warmup=false",
                                           "trigger.slo_ms=50"], instance_id="b0")
    try:
        assert engine.model_version == verify_bundle(out)["model_version"]
        hist = random_history(np.random.default_rng(3), 90, user_features=USER)
        cands = np.arange(1, 31)
        assert engine.preinfer("u1", hist, num_candidates=len(cands)).admitted
        engine.wait_prefills(60)
        res = engine.rank("u1", hist, cands)
        expected = model.rank_full(hist, cands)  # engine idle: one MindSpore caller at a time
        assert res.cache == "device"
        np.testing.assert_allclose(res.scores, expected, rtol=0, atol=1e-5)
    finally:
        engine.close()
    broken = _copy(out, tmp_path)
    (broken / "model.ckpt").unlink()
    with pytest.raises(BundleError, match="model.ckpt"):
        RelayEngine.from_bundle(broken)
