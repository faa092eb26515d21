"""docs/your_data.md end to end: the example event log of scripts/make_event_log.py (string user and item ids, ISO
times, the event types click / cart / buy, one categorical user feature) -> `relaygr train` -> `relaygr export` ->
`relaygr serve --bundle` -> pre-infer and rank over HTTP in the log's own ids; the relay path's scores equal the
full path's."""

from __future__ import annotations

import csv
import datetime as dt
import subprocess
import sys

import numpy as np
import pytest

from serving.client import APIError, RelayGRClient
from tests.conftest import REPO, cli_overrides
from tests.serving.servers import serve

pytestmark = pytest.mark.slow
TOL = 1e-5


@pytest.fixture(scope="module")
def shop(tmp_path_factory):
    from serving.cli import main

    root = tmp_path_factory.mktemp("shop")
    log = root / "events.csv"
    made = subprocess.run([sys.executable, str(REPO / "scripts" / "make_event_log.py"), "--out", str(log),
                           "--users", "120", "--items", "60"], capture_output=True, text=True, timeout=120)
    assert made.returncode == 0, made.stderr
    # one shape bucket per axis: export compiles and checks 3 ranking graphs instead of ~20
    one_bucket = ("model.len_buckets=[128]", "model.suffix_buckets=[16]", "model.candidate_buckets=[64]")
    config = ["--config", "event_log", "-o", f"data.path={log}", "-o", "data.num_eval_negatives=20",
              *cli_overrides(one_bucket)]
    assert main(["train", *config, "--output-dir", str(root / "run"), "-o", "train.epochs=2",
                 "-o", "train.eval_every=2"]) == 0
    assert main(["export", "--checkpoint", str(root / "run" / "best.ckpt"), "--out-dir", str(root / "bundle")]) == 0
    return log, root / "bundle"


@pytest.fixture(scope="module")
def server(shop, tmp_path_factory):
    from mindspore_relaygr.relay.latency import LatencyModel, LatencyPoint

    tmp = tmp_path_factory.mktemp("server")
    profile = tmp / "latency.json"  # every prefix is "at risk": pre-infers are admitted
    LatencyModel([LatencyPoint("full", 128, 64, 0, 500.0), LatencyPoint("relay", 128, 16, 64, 5.0),
                  LatencyPoint("prefill", 128, 0, 0, 20.0)]).to_json(profile)
    with serve(tmp, "shop", bundle=shop[1], overrides=(f"trigger.latency_profile={profile}", "relay.warmup=false",
                                                       "trigger.slo_ms=50")) as (url, _, _):
        yield url


def user_history(log, user: str) -> dict[str, list]:
    """One user's events from the CSV, oldest first, in the log's ids (the API takes unix seconds)."""
    with open(log, newline="") as f:
        rows = [r for r in csv.DictReader(f) if r["user_id"] == user]
    seconds = [int(dt.datetime.fromisoformat(r["timestamp"]).timestamp()) for r in rows]
    order = sorted(range(len(rows)), key=seconds.__getitem__)  # stable: file order within a second, as training
    return {"item_ids": [rows[k]["item_id"] for k in order], "action_ids": [rows[k]["event"] for k in order],
            "timestamps": [seconds[k] for k in order], "user_features": [rows[order[-1]]["segment"]]}


def test_the_bundle_carries_the_logs_vocabularies(shop):
    from mindspore_relaygr.export import load_bundle_config, load_vocabulary

    config, vocab = load_bundle_config(shop[1]), load_vocabulary(shop[1])
    assert config.model.version.startswith("events-")  # named after the data, not ml1m
    assert (config.model.num_items, config.model.num_actions, config.model.user_feature_sizes) == (60, 3, [4])
    assert vocab.event_types == ("buy", "cart", "click") and vocab.label_rule == {"events": ["buy"]}
    assert vocab.user_feature_names == ("segment",) and set(vocab.user_feature_vocabs[0]) == {"new", "regular", "vip"}
    assert all(isinstance(k, str) and k.startswith("sku-") for k in vocab.item_vocab)


def test_rank_in_the_logs_ids_relay_path_equals_full_path(shop, server):
    log, _ = shop
    hist = user_history(log, "c0007")
    n = len(hist["item_ids"])
    assert n >= 12 and set(hist["action_ids"]) <= {"click", "cart", "buy"}
    candidates = [f"sku-{k:04d}" for k in range(1, 61, 3)]  # 20 SKUs
    prefix = {k: (v if k == "user_features" else v[: n - 4]) for k, v in hist.items()}
    client = RelayGRClient(server)
    try:
        assert client.wait_ready(60)["model_version"].startswith("events-")
        pre = client.preinfer("c0007", prefix, num_candidates=len(candidates))
        assert pre.body["admitted"], pre.body
        relay = client.rank("c0007", hist, candidates, top_k=5)
        full = client.rank("someone-else", hist, candidates, top_k=5)  # nothing cached: full inference
        assert relay.body["cache"] in ("device", "inflight") and full.body["cache"] == "miss"
        np.testing.assert_allclose(relay.body["scores"], full.body["scores"], rtol=0, atol=TOL)
        assert relay.body["ranking"] == full.body["ranking"]
        assert relay.body["id_space"] == "raw" and relay.body["tasks"] == ["engage", "buy"]
        assert relay.body["ranked_item_ids"] == [candidates[i] for i in relay.body["ranking"]]
        assert all(isinstance(i, str) for i in relay.body["ranked_item_ids"])
        with pytest.raises(APIError, match=r"candidates.item_ids: item 'sku-9999' at index 1 is not one") as err:
            client.rank("c0007", hist, ["sku-0001", "sku-9999"])
        assert err.value.status == 400
    finally:
        client.close()
