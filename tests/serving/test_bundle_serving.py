"""The main demo's path on synthetic MovieLens data: train -> export -> `relaygr serve --bundle` ->
the Python client (dense ids) and `serving.demo_client` (the catalogue's raw ids) over HTTP, scores equal to the
bundle's model in process."""

from __future__ import annotations

import re

import numpy as np
import pytest

from mindspore_relaygr import load_config
from serving import demo_client
from serving.client import APIError, RelayGRClient
from tests.conftest import CONFIGS, ONE_BUCKET
from tests.serving.servers import serve
from tests.train.conftest import synthetic_overrides, write_synthetic_movielens

pytestmark = pytest.mark.slow
TOL = 1e-5


@pytest.fixture(scope="module")
def bundle(tmp_path_factory):
    from mindspore_relaygr.export import Vocabulary, export_bundle
    from mindspore_relaygr.model.ranker import RelayGRModel
    from mindspore_relaygr.train.dataset import prepare_data
    from mindspore_relaygr.train.trainer import train

    root = tmp_path_factory.mktemp("demo")
    data_path = write_synthetic_movielens(root / "movielens")
    cfg = load_config(CONFIGS / "tiny.yaml",
                      [*synthetic_overrides(data_path, root / "run"), *ONE_BUCKET, "train.epochs=1"])
    result = train(cfg)
    model = RelayGRModel(cfg)
    model.load_checkpoint(result.checkpoint)
    vocab = Vocabulary.from_interactions(prepare_data(cfg).interactions)
    return export_bundle(model, cfg, vocab, root / "bundle", name="synthetic"), data_path


@pytest.fixture(scope="module")
def server(bundle, tmp_path_factory):
    from mindspore_relaygr.relay.latency import LatencyModel, LatencyPoint

    tmp = tmp_path_factory.mktemp("server")
    profile = tmp / "latency.json"  # every prefix is "at risk": pre-infers are admitted
    LatencyModel([LatencyPoint("full", 128, 32, 0, 500.0), LatencyPoint("relay", 128, 16, 32, 5.0),
                  LatencyPoint("prefill", 128, 0, 0, 20.0)]).to_json(profile)
    with serve(tmp, "demo", bundle=bundle[0], overrides=(f"trigger.latency_profile={profile}",
                                                         "relay.warmup=false", "trigger.slo_ms=50")) as (url, _, _):
        yield url


def test_client_ranks_like_the_bundled_model(bundle, server):
    from mindspore_relaygr.export import load_bundle
    from mindspore_relaygr.model.inputs import History

    _, model = load_bundle(bundle[0])
    rng = np.random.default_rng(0)
    n = 40
    hist = History(rng.integers(1, 61, n).astype(np.int32), rng.integers(0, 5, n).astype(np.int32),
                   (880_000_000 + np.cumsum(rng.integers(1, 1000, n))).astype(np.int64))
    cands = np.arange(1, 21)
    client = RelayGRClient(server, id_space="dense")  # the model's own ids, to compare with rank_full
    try:
        assert client.wait_ready(60)["model_version"] == model.version
        pre = client.preinfer("u-client", hist.slice(0, n - 4), num_candidates=len(cands))
        assert pre.body["admitted"] and pre.instance == "demo"
        res = client.rank("u-client", hist, cands, top_k=5)
        # inflight: the rank waited for this prefill (graphs compile on first use here), then used it
        assert res.body["cache"] in ("device", "inflight") and len(res.body["ranking"]) == 5
        np.testing.assert_allclose(np.asarray(res.body["scores"]), model.rank_full(hist, cands), rtol=0, atol=TOL)
        with pytest.raises(APIError, match="candidates.item_ids") as err:
            client.rank("u-client", hist, [0])
        assert err.value.status == 400
    finally:
        client.close()


def test_demo_client_prints_titles_tier_and_the_held_out_movie(bundle, server, capsys):
    bundle_dir, data_path = bundle
    assert demo_client.main(["--bundle", str(bundle_dir), "--url", server, "--data", str(data_path),
                             "--suffix", "3", "--top-k", "5"]) == 0
    out = capsys.readouterr().out
    assert "pre-infer: admitted=True" in out
    assert re.search(r"rank: cache tier '(device|inflight)'", out)
    assert re.search(r"is ranked #\d+ of 21", out)  # the held-out movie among 20 sampled negatives
    assert len(re.findall(r"^\s+[1-5]\s+\S", out, flags=re.M)) == 5  # the top-5 table rows
    assert re.search(r"ranked without a pre-infer: cache tier '(miss|full|bypass)'", out)
