"""`relaygr bench quality-at-slo`: caps judged per budget become the quality each mode reaches."""

from __future__ import annotations

import json
import math

import pytest

from mindspore_relaygr.bench.quality_at_slo import quality_rows
from tests.train.conftest import synthetic_overrides, write_synthetic_movielens


def test_each_modes_compliant_cap_becomes_its_quality():
    def metrics(ndcg, hr):
        return {"ndcg@10": ndcg, "hr@10": hr}

    quality = {"filters": {"recent200": "...", "all": "..."}, "rows": [
        {"cap": 100, "metrics": {"recent200": metrics(0.15, 0.27), "all": metrics(0.16, 0.28)}, "change_from": {}},
        {"cap": 400, "metrics": {"recent200": metrics(0.17, 0.30), "all": metrics(0.19, 0.31)},
         "change_from": {"100": {"recent200": {"ndcg@10": {"diff": 0.02, "se": 0.003}},
                                 "all": {"ndcg@10": {"diff": 0.03, "se": 0.004}}}}}]}
    by_slo = [{"slo_ms": 20.0, "baseline": None, "relay": 100, "ratio": math.inf},
              {"slo_ms": 40.0, "baseline": 100, "relay": 400, "ratio": 4.0},
              {"slo_ms": 60.0, "baseline": 400, "relay": 400, "ratio": 1.0}]
    rows = quality_rows(by_slo, quality)
    assert rows[0]["baseline"]["cap"] == 0 and math.isnan(rows[0]["baseline"]["ndcg@10"])
    assert rows[0]["relay"] == {"cap": 100, "ndcg@10": 0.15, "hr@10": 0.27}  # the first filter's metrics
    assert math.isnan(rows[0]["ndcg_gain"]) and math.isnan(rows[0]["ndcg_gain_se"])
    assert rows[1]["cap_ratio"] == 4.0 and rows[1]["ndcg_gain"] == pytest.approx(0.02)
    assert rows[1]["ndcg_gain_se"] == 0.003  # the paired error of the same users at both caps
    assert rows[1]["relay"]["hr@10"] == 0.30
    assert rows[2]["ndcg_gain"] == 0.0 and rows[2]["ndcg_gain_se"] == 0.0


@pytest.mark.slow
def test_quality_at_slo_command_end_to_end(tmp_path, capsys):
    """A tiny model on synthetic timelines: a generous budget lets both modes reach the largest cap."""
    from mindspore_relaygr import load_config
    from mindspore_relaygr.cli import main
    from mindspore_relaygr.config import save_config
    from mindspore_relaygr.model.ranker import RelayGRModel
    from tests.conftest import CONFIGS, ONE_BUCKET

    data = write_synthetic_movielens(tmp_path / "data", num_users=60)
    cfg = load_config(CONFIGS / "tiny.yaml", [*synthetic_overrides(data, tmp_path / "run"), *ONE_BUCKET])
    config_path, checkpoint = tmp_path / "config.yaml", tmp_path / "model.ckpt"
    save_config(cfg, config_path)
    RelayGRModel(cfg).save_checkpoint(checkpoint)
    workload = tmp_path / "tl.json"
    assert main(["workload", "timeline", "--data", str(data), "--requests", "30", "--visit-gap-s", "1000",
                 "--min-history", "3", "--out", str(workload)]) == 0
    out = tmp_path / "q.json"
    assert main(["bench", "quality-at-slo", "--checkpoint", str(checkpoint), "--config", str(config_path),
                 "--workload", str(workload), "--caps", "4", "8", "--qps", "20", "--loads", "20",
                 "--slo-ms", "5000", "--cap-events", "8", "--candidates", "16", "--out", str(out)]) == 0
    report = json.loads(out.read_text())
    assert report["quality_filter"] == "recent200" and list(report["quality"]["filters"]) == ["recent200", "all"]
    caps_quality = {r["cap"]: r["metrics"]["recent200"]["ndcg@10"] for r in report["quality"]["rows"]}
    at_run_budget = next(r for r in report["table"] if r["slo_ms"] == 5000)
    assert at_run_budget["baseline"]["cap"] == at_run_budget["relay"]["cap"] == 8
    assert at_run_budget["relay"]["ndcg@10"] == caps_quality[8]
    assert report["slo_throughput"]["compliant_qps"]["relay"] >= 20
    points = report["latency"]["points"]
    assert {(p["mode"], p["length"]) for p in points} == {(m, c) for m in ("baseline", "relay") for c in (4, 8)}
    assert all(p["ranks"] == 30 and p["errors"] == 0 for p in points)
    assert out.with_suffix(".png").stat().st_size > 0 and out.with_suffix(".workload.json").is_file()
    assert "Quality at a P99 budget" in capsys.readouterr().out


@pytest.mark.slow
def test_truncated_ranks_are_scored_on_the_events_they_used(tmp_path):
    from dataclasses import asdict

    import numpy as np

    from mindspore_relaygr import load_config
    from mindspore_relaygr.bench.quality_at_slo import truncation_cost
    from mindspore_relaygr.bench.timeline import TimelineSpec, TimelineWorkload
    from mindspore_relaygr.model.ranker import RelayGRModel
    from mindspore_relaygr.train.full_ranking import full_path_logits, item_chunks
    from mindspore_relaygr.train.metrics import full_ranking_ranks, ranking_metrics_at
    from tests.conftest import CONFIGS
    from tests.model.conftest import randomize_weights

    data = write_synthetic_movielens(tmp_path / "data", num_users=60)
    cfg = load_config(CONFIGS / "tiny.yaml", synthetic_overrides(data, tmp_path / "run"))
    model = RelayGRModel(cfg)
    randomize_weights(model, seed=5)
    timeline = TimelineWorkload.generate(TimelineSpec(data_path=str(data), num_requests=12, visit_gap_s=1000,
                                                      min_history=6))
    rows = [{"request": asdict(r), "ranked_events": 2 + i % 3} for i, r in enumerate(timeline.requests)]
    cost = truncation_cost(model, cfg, timeline, [{"mode": "relay", "length": 8, "truncated_requests": rows},
                                                  {"mode": "baseline", "length": 8, "truncated_requests": []}])
    assert list(cost) == ["relay@8"] and cost["relay@8"]["ranks"] == 12
    assert cost["relay@8"]["ndcg@10_truncated"] != cost["relay@8"]["ndcg@10_whole"]  # the cut matters here
    chunks = item_chunks(timeline.num_items, max(cfg.model.candidate_buckets))
    for key, events in (("truncated", [r["ranked_events"] for r in rows]), ("whole", [None] * len(rows))):
        hists, targets, filtered = [], [], []
        for req, n in zip(timeline.requests, events, strict=True):
            h = timeline.with_spec(max_len=8).history(req)
            hists.append(h if n is None else h.slice(len(h) - n))
            targets.append(timeline.sequences[req.user].item_ids[req.end])
            filtered.append(timeline.sequences[req.user].item_ids[:req.end][-200:])  # the reference filter
        scores = np.stack([full_path_logits(model, h, chunks) for h in hists])
        expected = ranking_metrics_at(full_ranking_ranks(scores, np.array(targets), filtered))
        assert cost["relay@8"][f"ndcg@10_{key}"] == pytest.approx(expected["ndcg@10"], abs=1e-9)
        assert cost["relay@8"][f"hr@10_{key}"] == pytest.approx(expected["hr@10"], abs=1e-9)
