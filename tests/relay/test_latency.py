"""Latency model: interpolation on known points, monotonicity, JSON profiles, calibration."""

from __future__ import annotations

import json
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mindspore_relaygr.relay.latency import LatencyModel, LatencyPoint


def full(tokens: int, candidates: int, ms: float) -> LatencyPoint:
    return LatencyPoint("full", tokens, candidates, 0, ms)


def relay(prefix: int, suffix: int, candidates: int, ms: float) -> LatencyPoint:
    return LatencyPoint("relay", prefix, candidates, suffix, ms)


def prefill(tokens: int, ms: float) -> LatencyPoint:
    return LatencyPoint("prefill", tokens, 0, 0, ms)


@pytest.fixture
def model() -> LatencyModel:
    return LatencyModel(
        [
            full(100, 10, 10.0),
            full(200, 10, 20.0),
            full(400, 10, 60.0),
            full(100, 20, 14.0),
            full(200, 20, 30.0),
            full(400, 20, 70.0),
            relay(100, 8, 10, 2.0),
            relay(200, 8, 10, 3.0),
            relay(100, 32, 10, 4.0),
            relay(200, 32, 10, 7.0),
            relay(100, 8, 20, 6.0),
            relay(200, 8, 20, 7.0),
            relay(100, 32, 20, 8.0),
            relay(200, 32, 20, 11.0),
            prefill(100, 5.0),
            prefill(300, 15.0),
            prefill(500, 35.0),
        ],
        interpolation="linear",
    )


def test_full_path_interpolates_between_buckets(model):
    assert model.predict_full_ms(100, 10) == 10.0  # measured points are reproduced exactly
    assert model.predict_full_ms(400, 20) == 70.0
    assert model.predict_full_ms(150, 10) == pytest.approx(15.0)  # along tokens
    assert model.predict_full_ms(300, 10) == pytest.approx(40.0)
    assert model.predict_full_ms(200, 15) == pytest.approx(25.0)  # along candidates
    assert model.predict_full_ms(150, 15) == pytest.approx((15.0 + 22.0) / 2)  # both


def test_extrapolation_is_flat_below_and_proportional_above(model):
    assert model.predict_full_ms(0, 10) == 10.0
    assert model.predict_full_ms(50, 1) == 10.0
    assert model.predict_full_ms(600, 10) == pytest.approx(60.0 * 600 / 400)  # last bucket 400 tokens: 60 ms
    assert model.predict_full_ms(100, 30) == pytest.approx(14.0 * 30 / 20)  # last bucket 20 candidates: 14 ms
    assert model.predict_full_ms(600, 30) == pytest.approx(70.0 * 600 / 400 * 30 / 20)


def test_relay_path_interpolates_over_prefix_suffix_and_candidates(model):
    assert model.predict_relay_ms(100, 8, 10) == 2.0
    assert model.predict_relay_ms(150, 8, 10) == pytest.approx(2.5)
    assert model.predict_relay_ms(100, 20, 10) == pytest.approx(3.0)
    assert model.predict_relay_ms(150, 20, 15) == pytest.approx((4.0 + 8.0) / 2)
    assert model.predict_relay_ms(300, 8, 10) == pytest.approx(3.0 * 300 / 200)


def test_step_interpolation_charges_the_bucket_a_query_pads_to(model):
    step = LatencyModel(model.points)  # the default: calibrated points are the padded buckets
    assert step.interpolation == "step"
    assert step.predict_full_ms(100, 10) == 10.0  # measured points are reproduced exactly
    assert step.predict_full_ms(101, 10) == 20.0  # 101 tokens run the 200-token graph
    assert step.predict_full_ms(201, 10) == 60.0
    assert step.predict_full_ms(150, 11) == 30.0  # both axes round up: (200 tokens, 20 candidates)
    assert step.predict_relay_ms(101, 9, 10) == 7.0  # (200, 32, 10)
    assert step.predict_full_ms(50, 5) == 10.0  # flat below, proportional above, as linear
    assert step.predict_full_ms(600, 10) == pytest.approx(60.0 * 600 / 400)
    # cumulative 15 ms (200 pads to 300), 35 ms (400 pads to 500), 35 ms (450 pads to 500)
    assert step.predict_prefill_chunks_ms(450, chunk_len=200) == pytest.approx([15.0, 20.0, 0.0])
    with pytest.raises(ValueError, match="interpolation='cubic'"):
        LatencyModel(model.points, interpolation="cubic")


def test_profiles_keep_their_interpolation(model, tmp_path):
    path = tmp_path / "profile.json"
    LatencyModel(model.points).to_json(path)
    assert LatencyModel.from_json(path).predict_full_ms(101, 10) == 20.0
    doc = json.loads(path.read_text())
    del doc["interpolation"]  # a profile written before the key existed was linear
    path.write_text(json.dumps(doc))
    assert LatencyModel.from_json(path).predict_full_ms(150, 10) == pytest.approx(15.0)


def test_noisy_measurements_never_make_longer_requests_cheaper():
    m = LatencyModel([full(100, 10, 10.0), full(200, 10, 8.0), full(300, 10, 20.0)], interpolation="linear")
    assert m.predict_full_ms(200, 10) == 10.0  # the dip is lifted to the running maximum
    assert m.predict_full_ms(150, 10) == 10.0
    assert m.predict_full_ms(250, 10) == pytest.approx(15.0)
    flat_end = LatencyModel([full(100, 10, 10.0), full(200, 10, 5.0)], interpolation="linear")
    assert flat_end.predict_full_ms(10_000, 10) == pytest.approx(10.0 * 10_000 / 200)  # lifted, then scaled


def test_single_point_is_flat_below_and_proportional_above():
    m = LatencyModel([full(128, 16, 7.5)])
    assert [m.predict_full_ms(t, c) for t, c in [(0, 0), (128, 16), (256, 16), (128, 32)]] == [7.5, 7.5, 15.0, 15.0]


@pytest.mark.parametrize("interpolation", ["step", "linear"])
@settings(max_examples=60, deadline=None)
@given(
    tokens=st.lists(st.integers(1, 5000), min_size=1, max_size=4, unique=True),
    cands=st.lists(st.integers(1, 500), min_size=1, max_size=3, unique=True),
    data=st.data(),
)
def test_predictions_are_monotone_in_every_argument(interpolation, tokens, cands, data):
    ms = st.floats(0, 1000, allow_nan=False)
    m = LatencyModel([full(t, c, data.draw(ms)) for t in tokens for c in cands], interpolation)
    qs = st.integers(0, 8000)
    t1, t2 = sorted(data.draw(st.tuples(qs, qs)))
    c1, c2 = sorted(data.draw(st.tuples(st.integers(0, 800), st.integers(0, 800))))
    assert m.predict_full_ms(t1, c1) <= m.predict_full_ms(t2, c1) + 1e-9
    assert m.predict_full_ms(t1, c1) <= m.predict_full_ms(t1, c2) + 1e-9
    assert m.predict_full_ms(t1, c1) >= 0


def test_prefill_and_its_chunks(model):
    assert model.predict_prefill_ms(200) == pytest.approx(10.0)
    chunks = model.predict_prefill_chunks_ms(450, chunk_len=200)
    assert chunks == pytest.approx([10.0, 15.0, 5.0])  # cumulative 10, 25, 30 ms at 200, 400, 450 tokens
    assert sum(chunks) == pytest.approx(model.predict_prefill_ms(450))
    assert model.predict_prefill_chunks_ms(100, chunk_len=512) == [5.0]
    assert model.predict_prefill_chunks_ms(0, chunk_len=512) == []
    with pytest.raises(ValueError, match="chunk_len=0"):
        model.predict_prefill_chunks_ms(10, chunk_len=0)


def test_bad_queries_and_missing_kinds_raise(model):
    with pytest.raises(ValueError, match="tokens=-1"):
        model.predict_full_ms(-1, 10)
    with pytest.raises(ValueError, match="candidates=2.5"):
        model.predict_full_ms(10, 2.5)
    with pytest.raises(ValueError, match=r"kind='relay': no measured points; profile has \['full'\]"):
        LatencyModel([full(1, 1, 1.0)]).predict_relay_ms(10, 1, 1)


@pytest.mark.parametrize(
    ("point", "match"),
    [
        (("gpu", 1, 1, 0, 1.0), "kind='gpu'"),
        (("full", -5, 1, 0, 1.0), "tokens=-5"),
        (("full", 10, 1, 4, 1.0), "suffix=4: must be 0 for kind 'full'"),
        (("prefill", 10, 3, 0, 1.0), "candidates=3: must be 0 for kind 'prefill'"),
        (("full", 10, 1, 0, float("nan")), "ms=nan"),
        (("full", 10, 1, 0, -1.0), "ms=-1.0"),
    ],
)
def test_invalid_points_are_rejected(point, match):
    with pytest.raises(ValueError, match=match):
        LatencyPoint(*point)


def test_duplicate_shapes_and_empty_models_are_rejected():
    with pytest.raises(ValueError, match=r"duplicate 'full' shape \(10, 1\)"):
        LatencyModel([full(10, 1, 1.0), full(10, 1, 2.0)])
    with pytest.raises(ValueError, match="points=\\[\\]"):
        LatencyModel([])


def test_json_round_trip(model, tmp_path):
    path = tmp_path / "profile.json"
    model.to_json(path)
    loaded = LatencyModel.from_json(path)
    assert loaded.points == model.points
    assert loaded.interpolation == model.interpolation == "linear"
    assert loaded.predict_full_ms(333, 17) == model.predict_full_ms(333, 17)
    assert loaded.predict_relay_ms(150, 20, 15) == model.predict_relay_ms(150, 20, 15)


def test_a_batch_costs_its_bucket_times_its_factor_of_single_calls_at_the_padded_shape(model):
    batched = LatencyModel(model.points, model.interpolation, {1: 1.0, 2: 0.9, 4: 0.75})
    shapes = [(100, 8, 10), (200, 8, 20), (150, 32, 10)]  # padded to (200, 32, 20): 11 ms single
    assert batched.batch_bucket(3) == (4, 0.75)
    assert batched.predict_relay_batch_ms(shapes) == pytest.approx(4 * 0.75 * 11.0)
    assert batched.predict_relay_batch_ms(shapes[:2]) == pytest.approx(2 * 0.9 * 7.0)
    assert batched.predict_relay_batch_ms(shapes[:1]) == model.predict_relay_ms(100, 8, 10)
    assert batched.predict_relay_batch_ms([]) == 0.0
    assert batched.batch_bucket(6) == (6, 0.75)  # beyond the largest bucket: the batch itself, its factor
    # no factors measured: B single calls of the padded shape
    assert model.predict_relay_batch_ms(shapes) == pytest.approx(3 * 11.0) and model.batch_bucket(3) == (3, 1.0)
    with pytest.raises(ValueError, match="batch=0"):
        batched.batch_bucket(0)
    with pytest.raises(ValueError, match=r"batch_factors\[2\]=-1"):
        LatencyModel(model.points, batch_factors={2: -1})


def test_batch_factors_survive_a_json_round_trip_and_old_profiles_have_none(model, tmp_path):
    path = tmp_path / "profile.json"
    LatencyModel(model.points, model.interpolation, {4: 0.8, 1: 1.0, 2: 0.95}).to_json(path)
    loaded = LatencyModel.from_json(path)
    assert loaded.batch_factors == {1: 1.0, 2: 0.95, 4: 0.8} and list(loaded.batch_factors) == [1, 2, 4]
    old = {k: v for k, v in json.loads(path.read_text()).items() if k != "batch_factors"}
    path.write_text(json.dumps(old))
    assert LatencyModel.from_json(path).batch_factors == {}


def _good_doc() -> dict:
    return {"version": 1, "points": [{"kind": "full", "tokens": 10, "candidates": 1, "suffix": 0, "ms": 1.0}]}


@pytest.mark.parametrize(
    ("text", "match"),
    [
        ("{not json", "not valid JSON"),
        ("[1, 2]", "top level must be an object, got list"),
        (json.dumps({"points": []}), "version=None, expected 1"),
        (json.dumps({"version": 1, "points": []}), "'points' must be a non-empty list"),
        (json.dumps({"version": 1}), "'points' must be a non-empty list, got None"),
        (json.dumps({"version": 1, "points": [{"kind": "full", "tokens": 10}]}), r"points\[0\]=.*exactly the keys"),
        (json.dumps(_good_doc() | {"points": _good_doc()["points"] * 2}), "bad.json'.*duplicate 'full' shape"),
        (json.dumps(_good_doc()).replace('"tokens": 10', '"tokens": "10"'), r"points\[0\]: tokens='10'"),
        (json.dumps(_good_doc()).replace('"ms": 1.0', '"ms": NaN'), r"points\[0\]: ms=nan"),
        (json.dumps(_good_doc()).replace('"full"', '"fast"'), r"points\[0\]: kind='fast'"),
        (json.dumps(_good_doc() | {"batch_factors": [0.9]}), "bad.json'.*'batch_factors' must be an object"),
        (json.dumps(_good_doc() | {"batch_factors": {"two": 0.9}}), "bad.json'.*must be a batch bucket"),
        (json.dumps(_good_doc() | {"batch_factors": {"2": 0}}), r"bad.json'.*batch_factors\[2\]=0"),
        (json.dumps(_good_doc() | {"batch_factors": {"0": 1.0}}), "bad.json'.*batch bucket 0"),
    ],
)
def test_malformed_profiles_raise_value_error_naming_the_problem(tmp_path, text, match):
    path = tmp_path / "bad.json"
    path.write_text(text)
    with pytest.raises(ValueError, match=match):
        LatencyModel.from_json(path)


def test_missing_profile_file_raises_value_error(tmp_path):
    with pytest.raises(ValueError, match="nope.json.*cannot read"):
        LatencyModel.from_json(tmp_path / "nope.json")


def test_calibrate_takes_the_median_of_repeats():
    samples = {
        ("full", (100, 10)): [9.0, 30.0, 10.0],
        ("full", (200, 10)): [20.0, 21.0, 19.0],
        ("relay", (100, 8, 10)): [2.0, 2.0, 50.0],
        ("prefill", (100,)): [4.0, 6.0, 5.0],
    }
    calls = []

    def measure(kind: str, shape: tuple) -> float:
        calls.append((kind, shape))
        return samples[kind, shape][sum(c == (kind, shape) for c in calls) - 1]

    shapes = {"full": [(100, 10), (200, 10)], "relay": [(100, 8, 10)], "prefill": [(100,)]}
    m = LatencyModel.calibrate(measure, shapes, repeats=3)
    assert len(calls) == 12
    assert m.points == [full(100, 10, 10.0), full(200, 10, 20.0), relay(100, 8, 10, 2.0), prefill(100, 5.0)]
    assert m.kinds == ["full", "prefill", "relay"]
    assert m.interpolation == "step"  # the shapes are buckets: 150 tokens run the 200-token graph
    assert math.isclose(m.predict_full_ms(150, 10), 20.0)


@pytest.mark.parametrize(
    ("shapes", "repeats", "match"),
    [
        ({"cpu": [(1,)]}, 3, "shapes\\['cpu'\\]: unknown kind"),
        ({"full": [(1, 2, 3)]}, 3, "expected 2 values"),
        ({"full": [(1, 2)]}, 0, "repeats=0"),
        ({"full": [(-1, 2)]}, 1, "tokens=-1"),
    ],
)
def test_calibrate_rejects_bad_shapes(shapes, repeats, match):
    with pytest.raises(ValueError, match=match):
        LatencyModel.calibrate(lambda kind, shape: 1.0, shapes, repeats=repeats)


def test_calibration_measures_prefill_at_every_chunk_boundary():
    from types import SimpleNamespace

    from mindspore_relaygr.relay.calibrate import calibration_shapes

    cfg = SimpleNamespace(user_feature_sizes=[], len_buckets=[512, 1024, 1536, 2048, 3072, 4096], suffix_buckets=[32],
                          candidate_buckets=[128], max_seq_len=4096)
    model = SimpleNamespace(cfg=cfg, prefix_buckets=cfg.len_buckets)
    shapes = calibration_shapes(model, prefill_chunk_len=512)
    # later chunks attend to the whole prefix before them: each boundary is measured, not extrapolated
    assert shapes["prefill"] == [(n,) for n in range(512, 4097, 512)]
    assert calibration_shapes(model, prefill_chunk_len=1000)["prefill"] == [
        (512,), (1000,), (2000,), (3000,), (4000,), (4096,)]
    assert shapes["full"] == [(n, 128) for n in cfg.len_buckets]


def test_an_extension_costs_the_last_chunks_of_a_fresh_prefill():
    lat = LatencyModel([prefill(256, 10.0), prefill(512, 30.0), prefill(768, 60.0)])
    assert lat.predict_prefill_chunks_ms(768, 256) == [10.0, 20.0, 30.0]
    assert lat.predict_extend_chunks_ms(512, 256, 256) == [30.0]  # the chunk that attends to 512 tokens
    assert lat.predict_extend_chunks_ms(300, 468, 256) == [20.0, 30.0]
    assert lat.predict_extend_chunks_ms(0, 768, 256) == lat.predict_prefill_chunks_ms(768, 256)
    assert lat.predict_extend_chunks_ms(500, 0, 256) == []
