from __future__ import annotations

import json
import struct

import pytest

from mindspore_relaygr import load_config
from mindspore_relaygr.config import ConfigError
from mindspore_relaygr.train.length_curve import (
    CURVE_JSON,
    CURVE_PLOT,
    format_curve,
    length_overrides,
    load_context,
    plot_length_curve,
    run_length_curve,
)
from tests.conftest import CONFIGS, REPO
from tests.train.conftest import synthetic_overrides


@pytest.mark.parametrize("max_len, buckets", [(50, [51]), (200, [64, 128, 201]),
                                              (2314, [64, 128, 256, 512, 1024, 2048, 2315])])
def test_each_length_is_a_valid_ml1m_config(tmp_path, max_len, buckets):
    cfg = load_config(REPO / "configs" / "ml1m.yaml", length_overrides(max_len, tmp_path / "x"))
    assert cfg.model.max_seq_len == max_len + 1 and cfg.model.len_buckets == buckets
    assert cfg.cache.max_prefix_len == max_len + 1 and cfg.train.output_dir == str(tmp_path / "x")
    with pytest.raises(ValueError, match="history length must be >= 1"):
        length_overrides(0, tmp_path)


def test_a_length_over_the_configured_cap_is_an_error(tmp_path):
    with pytest.raises(ConfigError, match="train.max_history_len=300"):
        from mindspore_relaygr.train.dataset import max_history_len

        max_history_len(load_config(REPO / "configs" / "ml1m.yaml",
                                    [*length_overrides(100, tmp_path), "train.max_history_len=300"]))


def _point(hr: float, ndcg: float) -> dict:
    return {"hr@10": hr, "ndcg@10": ndcg, "se": {"hr@10": 0.006, "ndcg@10": 0.004}}


def _caps_report(filters=("recent200", "all")) -> dict:
    return {"split": "test", "model_max_history": 800, "filters": {f: "rule" for f in filters},
            "rows": [{"cap": cap, "metrics": {f: _point(0.30 + cap / 1e5, 0.17) for f in filters}}
                     for cap in (50, 200, 800)]}


def _png_width(path) -> int:
    return struct.unpack(">I", path.read_bytes()[16:20])[0]


def test_context_must_be_a_caps_report_under_the_curve_filter(tmp_path):
    good = tmp_path / "caps.json"
    good.write_text(json.dumps(_caps_report()))
    assert [r["cap"] for r in load_context(good)["rows"]] == [50, 200, 800]
    cases = {"missing.json": None, "garbage.json": "{not json", "curve.json": json.dumps({"rows": [{"max_len": 50}]}),
             "empty.json": json.dumps({**_caps_report(), "rows": []}),
             "other_filter.json": json.dumps(_caps_report(filters=("all",)))}
    for name, text in cases.items():
        if text is not None:
            (tmp_path / name).write_text(text)
    for name, message in (("missing.json", "No such file"), ("garbage.json", "Expecting"),
                          ("curve.json", "not a `relaygr caps` report"), ("empty.json", "not a `relaygr caps` report"),
                          ("other_filter.json", "--filter recent200")):
        with pytest.raises(ConfigError, match=message):
            load_context(tmp_path / name)


def test_a_bad_context_stops_the_sweep_before_any_training(tmp_path):
    with pytest.raises(ConfigError, match="not a `relaygr caps` report"):
        (tmp_path / "curve.json").write_text(json.dumps({"rows": []}))
        run_length_curve(tmp_path / "no_config.yaml", [50], tmp_path / "out", context=tmp_path / "curve.json")
    assert not (tmp_path / "out").exists()


def test_the_context_is_drawn_beside_the_curve(tmp_path):
    rows = [{"max_len": n, "filter": "recent200", "users": 6040, **_point(0.27 + n / 1e4, 0.15)} for n in (50, 200)]
    plot_length_curve(rows, tmp_path / "alone.png")
    plot_length_curve(rows, tmp_path / "both.png", _caps_report())
    assert _png_width(tmp_path / "both.png") == 2 * _png_width(tmp_path / "alone.png")


@pytest.mark.slow
def test_sweep_trains_evaluates_and_resumes(synthetic_data_path, tmp_path):
    """Two lengths on the synthetic data: a row per length, the JSON and the plot; an interrupted length
    resumes, and a rerun reuses both finished runs."""
    from mindspore_relaygr.train.trainer import train

    config = tmp_path / "config.yaml"
    config.write_text((CONFIGS / "tiny.yaml").read_text())
    overrides = [*synthetic_overrides(synthetic_data_path, tmp_path / "unused"), "train.epochs=4",
                 "train.eval_every=2"]
    # Length 6 was stopped after 2 of its 4 epochs.
    train(load_config(config, [*overrides, "train.epochs=2", *length_overrides(6, tmp_path / "out" / "len_6")]))
    lines: list[str] = []
    rows = run_length_curve(config, [12, 6], tmp_path / "out", overrides, progress=lines.append)
    assert any("length 6: resuming" in line for line in lines) and any("length 12: training" in line for line in lines)
    assert [r["max_len"] for r in rows] == [6, 12]
    for r in rows:
        assert 0.0 <= r["ndcg@10"] <= r["hr@10"] <= 1.0 and r["epochs_run"] == 4
        # One fixed rule at every length (not "the L most recent events"), both rules recorded.
        assert r["filter"] == "recent200" and list(r["by_filter"]) == ["recent200", "all"]
        assert r["se"]["hr@10"] > 0
    assert (tmp_path / "out" / CURVE_PLOT).stat().st_size > 0
    saved = json.loads((tmp_path / "out" / CURVE_JSON).read_text())
    assert saved["rows"] == rows
    assert load_config(tmp_path / "out" / "len_6" / "config.yaml").model.max_seq_len == 7
    again: list[str] = []
    assert run_length_curve(config, [6, 12], tmp_path / "out", overrides, progress=again.append) == rows
    assert not any("training" in line or "resuming" in line for line in again)  # finished lengths are reused
    assert saved["context"] is None
    width = _png_width(tmp_path / "out" / CURVE_PLOT)
    (tmp_path / "caps.json").write_text(json.dumps(_caps_report()))
    assert run_length_curve(config, [6, 12], tmp_path / "out", overrides, context=tmp_path / "caps.json") == rows
    assert json.loads((tmp_path / "out" / CURVE_JSON).read_text())["context"] == str(tmp_path / "caps.json")
    assert _png_width(tmp_path / "out" / CURVE_PLOT) == 2 * width
    assert format_curve(rows).splitlines()[:2] == ["filter recent200", format_curve(rows).splitlines()[1]]
    assert "max len" in format_curve(rows).splitlines()[1]
