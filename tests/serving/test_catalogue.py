"""Raw ids on the HTTP API (an instance with a bundle's vocabularies): items, event types and user-feature values
as the training log wrote them, mapped to the dense ids the engine (and its cache keys) see; dense ids on request;
unknown ids are a 400 naming them. FakeEngine, no MindSpore."""

from __future__ import annotations

import pytest

from mindspore_relaygr.export import Vocabulary
from serving.app import create_app
from serving.catalogue import Catalogue
from serving.client import _history_json
from serving.settings import resolve_settings
from tests.serving.conftest import make_history

SKUS = [f"sku-{k:03d}" for k in range(1, 201)]  # tiny.yaml: 200 items, 4 actions, user features [3, 5]
EVENTS = ("buy", "cart", "click", 7)  # a numeric type too: 7 and "7" are one type
VOCAB = Vocabulary(item_vocab={s: k for k, s in enumerate(SKUS, 1)}, user_vocab={"c1": 1}, item_titles={},
                   user_features={}, user_feature_names=("segment", "region"), event_types=EVENTS,
                   user_feature_vocabs=({"new": 1, "vip": 2}, {"eu": 1, "us": 2, "asia": 3, 42: 4}),
                   event_column="event", label_rule={"events": ["buy"]})


@pytest.fixture
def raw_app(tiny_config, fake_engine):
    settings = resolve_settings(tiny_config, instance_id="t0")
    return create_app(tiny_config, engine=fake_engine, settings=settings,
                      catalogue=Catalogue.from_vocabulary(VOCAB))


def _raw(dense: dict) -> dict:
    """The raw form of a dense history of make_history (user features [1, 2] -> ["new", "us"])."""
    return {"item_ids": [SKUS[i - 1] for i in dense["item_ids"]],
            "action_ids": [EVENTS[a] for a in dense["action_ids"]], "timestamps": dense["timestamps"],
            "user_features": ["new", "us"]}


def test_raw_and_dense_requests_rank_alike_and_answer_in_their_own_ids(raw_app, fake_engine):
    client = raw_app.test_client()
    dense = make_history(20, seed=1, user_features=[1, 2])
    cands = [5, 17, 99, 120]
    raw = client.post("/v1/rank", json={"user_id": "c1", "history": _raw(dense),
                                        "candidates": {"item_ids": [SKUS[c - 1] for c in cands]}, "top_k": 3})
    assert raw.status_code == 200, raw.json
    same = client.post("/v1/rank", json={"user_id": "c2", "history": dense, "candidates": {"item_ids": cands},
                                         "id_space": "dense", "top_k": 3})
    assert same.status_code == 200, same.json
    assert raw.json["id_space"] == "raw" and same.json["id_space"] == "dense"  # raw: the default with a bundle
    assert raw.json["scores"] == same.json["scores"] and raw.json["ranking"] == same.json["ranking"]
    assert raw.json["ranked_item_ids"] == [SKUS[cands[i] - 1] for i in raw.json["ranking"]]
    assert same.json["ranked_item_ids"] == [cands[i] for i in same.json["ranking"]]
    stats = client.get("/v1/stats").json
    assert stats["id_space"] == "raw" and stats["catalogue"] == {"items": 200, "event_types": list(EVENTS),
                                                                 "user_features": ["segment", "region"]}


def test_the_relay_sees_the_dense_history_whatever_the_id_space(raw_app, fake_engine):
    """A pre-infer in raw ids and a rank in dense ids of the same events share the cache entry (the engine's cache
    key is computed from the dense history), and the other way round."""
    client = raw_app.test_client()
    dense = make_history(24, seed=2, user_features=[2, 4])
    raw = {**_raw(dense), "user_features": ["vip", "42"]}  # a numeric feature value, sent as text
    prefix = {k: (v if k == "user_features" else v[:20]) for k, v in raw.items()}
    pre = client.post("/v1/preinfer", json={"user_id": "c1", "history": prefix}, headers={"X-RelayGR-Affinity": "c1"})
    assert pre.status_code == 202 and pre.json["admitted"], pre.json
    rank = client.post("/v1/rank", json={"user_id": "c1", "history": dense, "candidates": {"item_ids": [1, 2]},
                                         "id_space": "dense"})
    assert rank.json["cache"] == "device", rank.json
    dense_prefix = {k: (v if k == "user_features" else v[:20]) for k, v in dense.items()}
    pre = client.post("/v1/preinfer", json={"user_id": "c3", "history": dense_prefix, "id_space": "dense"},
                      headers={"X-RelayGR-Affinity": "c3"})
    assert pre.status_code == 202 and pre.json["admitted"]
    rank = client.post("/v1/rank", json={"user_id": "c3", "history": raw, "candidates": {"item_ids": ["sku-001"]}})
    assert rank.json["cache"] == "device" and rank.json["ranked_item_ids"] == ["sku-001"]


@pytest.mark.parametrize(("change", "field", "message"), [
    (("candidates", ["sku-001", "sku-999"]), "candidates.item_ids",
     "item 'sku-999' at index 1 is not one the model was trained on"),
    (("item_ids", 3), "history.item_ids", "item 'NEW-SKU' at index 3 is not one the model was trained on"),
    (("action_ids", 0), "history.action_ids", "event type 'wishlist' at index 0 is not one the model was trained on"),
    (("user_features", None), "history.user_features",
     "value of user feature 'region' 'mars' at index 1 is not one the model was trained on"),
    (("candidates", [1.5]), "candidates.item_ids", "value at index 0 must be an item (a string or an integer), got "
                                                   "a number"),
    (("id_space", "catalogue"), "id_space", "must be one of ['raw', 'dense']"),
])
def test_unknown_raw_ids_are_a_400_naming_them(raw_app, change, field, message):
    client = raw_app.test_client()
    hist = _raw(make_history(6, seed=3, user_features=[1, 2]))
    body = {"user_id": "c1", "history": hist, "candidates": {"item_ids": ["sku-001"]}}
    what, value = change
    if what == "candidates":
        body["candidates"]["item_ids"] = value
    elif what == "item_ids":
        hist["item_ids"][value] = "NEW-SKU"
    elif what == "action_ids":
        hist["action_ids"][value] = "wishlist"
    elif what == "user_features":
        hist["user_features"] = ["new", "mars"]
    else:
        body[what] = value
    resp = client.post("/v1/rank", json=body)
    assert resp.status_code == 400 and resp.json["field"] == field, resp.json
    assert message in resp.json["error"]


def test_unknown_feature_values_may_be_null_and_numeric_ids_match_by_value(raw_app):
    client = raw_app.test_client()
    hist = _raw(make_history(6, seed=4, user_features=[1, 2]))
    hist["user_features"] = [None, 42]  # null: unknown (0), as in training; 42 and "42" are one value
    hist["action_ids"] = ["7", 7, "7.0", "buy", "click", "cart"]
    resp = client.post("/v1/rank", json={"user_id": "c1", "history": hist, "candidates": {"item_ids": ["sku-003"]}})
    assert resp.status_code == 200, resp.json


def test_raw_ids_need_a_bundle(client):
    """An instance serving a config (no vocabularies) takes dense ids, its default, and refuses raw ones."""
    hist = make_history(5, user_features=[1, 2])
    ok = client.post("/v1/rank", json={"user_id": "u", "history": hist, "candidates": {"item_ids": [1]}})
    assert ok.status_code == 200 and ok.json["id_space"] == "dense"
    resp = client.post("/v1/rank", json={"user_id": "u", "history": hist, "candidates": {"item_ids": [1]},
                                         "id_space": "raw"})
    assert resp.status_code == 400 and resp.json["field"] == "id_space" and "bundle" in resp.json["error"]


def test_a_model_without_event_types_takes_no_action_ids(tiny_config, fake_engine):
    vocab = Vocabulary(item_vocab={s: k for k, s in enumerate(SKUS, 1)}, user_vocab={}, item_titles={},
                       user_features={})
    cfg = tiny_config.__class__(**{**tiny_config.__dict__, "model": tiny_config.model.__class__(
        **{**tiny_config.model.__dict__, "num_actions": 1, "user_feature_sizes": []})})
    app = create_app(cfg, engine=fake_engine, settings=resolve_settings(cfg, instance_id="t0"),
                     catalogue=Catalogue.from_vocabulary(vocab))
    client = app.test_client()
    hist = {"item_ids": ["sku-001", "sku-002"], "timestamps": [1, 2]}
    assert client.post("/v1/rank", json={"history": hist, "user_id": "u",
                                         "candidates": {"item_ids": ["sku-003"]}}).status_code == 200
    hist["action_ids"] = ["click", "click"]
    resp = client.post("/v1/rank", json={"history": hist, "user_id": "u", "candidates": {"item_ids": ["sku-003"]}})
    assert resp.status_code == 400 and "trained without event types" in resp.json["error"]


def test_the_client_sends_ids_as_given():
    import numpy as np

    body = _history_json({"item_ids": ["sku-1", np.int64(4)], "action_ids": ["click", 2], "timestamps": [1, 2],
                          "user_features": [None, "vip"]})
    assert body == {"item_ids": ["sku-1", 4], "action_ids": ["click", 2], "timestamps": [1, 2],
                    "user_features": [None, "vip"]}
    with pytest.raises(TypeError):
        _history_json({"item_ids": [1.5], "action_ids": [0], "timestamps": [1]})
