"""`relaygr bench soak`: the mix generation and the per-minute aggregation (fast), and a short real run of two
tiny instances behind nginx with one killed and restarted in the middle (slow; structure and counts, no timing)."""

from __future__ import annotations

import argparse
import json

import pytest

from mindspore_relaygr.errors import ConfigError
from serving import soak_bench
from serving.soak_bench import (
    HistoryShape,
    SoakMix,
    SoakOutcome,
    SoakSpec,
    aggregate,
    disrupted_buckets,
    format_table,
    generate_soak,
    mix_summary,
)
from tests.conftest import CONFIGS, ONE_BUCKET, cli_overrides

TINY = CONFIGS / "tiny.yaml"


def soak(mix: SoakMix | None = None, rate: float = 50.0, seconds: float = 200.0, seed: int = 3):
    return generate_soak(mix or SoakMix(), rate, seconds, HistoryShape(), num_items=200, num_actions=4, seed=seed)


def test_mix_proportions_follow_the_asked_shares_with_a_seed():
    mix = SoakMix(orphan=0.25, rank_only=0.10, late=0.05, no_header=0.05, returning=0.30)
    work = soak(mix)
    drawn = mix_summary(work)
    assert drawn["visits"] > 8000
    for cls, want in mix.shares().items():
        assert drawn["classes"][cls] == pytest.approx(want, abs=0.02), cls
    assert drawn["no_header_preinfer"] == pytest.approx(0.05, abs=0.01)
    assert drawn["no_header_rank"] == pytest.approx(0.05, abs=0.01)
    assert drawn["returning"] == pytest.approx(0.30, abs=0.03)  # a few returning draws find no user with visits left
    assert drawn["history_len"]["max"] <= HistoryShape().max_len and drawn["history_len"]["min"] >= 16
    # the same seed draws the same visits, another seed others
    assert soak(mix).visits == work.visits
    assert soak(mix, seed=4).visits != work.visits


def test_visits_respect_their_class_gaps_and_the_growth_of_returning_users():
    mix = SoakMix(gap_ms=(100.0, 600.0), late_gap_ms=(2000.0, 8000.0))
    work = soak(mix, rate=20.0, seconds=100.0)
    shape = HistoryShape()
    seen: dict[int, int] = {}
    for v in work.visits:
        r = v.request
        assert 0 <= r.at_s < 100.0
        if v.cls == "follow":
            assert 0.1 <= r.gap_s <= 0.6
        elif v.cls == "late":
            assert 2.0 <= r.gap_s <= 8.0
        else:
            assert r.gap_s == 0.0
        assert r.visit == seen.get(r.user, 0)  # visits of a user are numbered in arrival order
        seen[r.user] = r.visit + 1
        assert r.visit < shape.max_visits
        hist = work.workload.history(r)
        assert len(hist["item_ids"]) == work.workload.base_lens[r.user] + r.visit * shape.growth <= shape.max_len
    events = work.events()
    assert [e[0] for e in events] == sorted(e[0] for e in events)
    kinds = {(e[1], work.visits[e[2]].cls) for e in events}
    assert ("rank", "orphan") not in kinds and ("preinfer", "rank_only") not in kinds


def test_bad_mixes_and_specs_are_refused(tmp_path):
    for bad in ({"orphan": 0.7, "rank_only": 0.4}, {"no_header": 1.5}, {"retries": -1}, {"gap_ms": (600.0, 100.0)}):
        with pytest.raises(ConfigError):
            SoakMix(**bad)
    with pytest.raises(ConfigError):
        HistoryShape(min_len=120, max_len=127, growth=3, max_visits=6)  # no room for the growth
    for bad in ({"kill_at": 1.0}, {"kill_instance": "i7"}, {"rate": 0.0}):
        with pytest.raises(ConfigError):
            SoakSpec(config_path=str(TINY), run_dir=tmp_path, **bad)


def out(endpoint, visit, cls, user, t, status, result="", instance="i0", header=True, attempts=1, failure="",
        ms=5.0):
    return SoakOutcome(endpoint, visit, cls, user, t, ms, status, result, instance, header, attempts, failure)


def test_aggregate_buckets_synthetic_outcomes():
    outcomes = [
        # minute 0: user 1 follows (hit), user 2 follows (miss), user 3 orphan, user 4 rank only (miss),
        # user 5's pre-infer goes without the header (refused 400), its rank is answered from no cache
        out("preinfer", 0, "follow", 1, 1.0, 202, "admitted"),
        out("rank", 0, "follow", 1, 1.3, 200, "device", ms=8.0),
        out("preinfer", 1, "follow", 2, 2.0, 202, "footprint", instance="i1"),
        out("rank", 1, "follow", 2, 2.4, 200, "miss", instance="i1", ms=20.0),
        out("preinfer", 2, "orphan", 3, 3.0, 202, "admitted"),
        out("rank", 3, "rank_only", 4, 4.0, 200, "miss"),
        out("preinfer", 4, "follow", 5, 5.0, 400, "http_400", header=False),
        out("rank", 4, "follow", 5, 5.5, 200, "miss"),
        # minute 1: user 1 returns without a pre-infer (partial hit: had one in minute 0); a rank retried twice
        # and failed with a 503; a connection error; a rank without the header, answered
        out("rank", 5, "rank_only", 1, 61.0, 200, "partial"),
        out("rank", 6, "rank_only", 6, 62.0, 503, "http_503", attempts=3, failure="5xx", instance="i1"),
        out("preinfer", 7, "orphan", 7, 63.0, 0, "", instance="", failure="connection"),
        out("rank", 8, "rank_only", 8, 64.0, 200, "miss", header=False),
        # minute 2 (the last, 30 s long): a late rank sent after the end lands in it
        out("preinfer", 9, "late", 9, 125.0, 202, "admitted"),
        out("rank", 9, "late", 9, 151.0, 200, "dram"),
    ]
    rss = [{"t_s": 10.0, "instance": "i0", "pid": 1, "rss_mb": 300.0},
           {"t_s": 50.0, "instance": "i0", "pid": 1, "rss_mb": 310.0},
           {"t_s": 70.0, "instance": "i1", "pid": 2, "rss_mb": 280.0}]
    rows = aggregate(outcomes, bucket_s=60.0, duration_s=150.0, rss=rss, disrupted=(1,), kill_bucket=1)
    assert [r["minute"] for r in rows] == [0, 1, 2]
    assert [r["length_s"] for r in rows] == [60.0, 60.0, 30.0]
    m0, m1, m2 = rows
    assert m0["followed"] == {"ranks": 2, "cached": 1, "share": 0.5}  # user 5's pre-infer was refused
    assert m0["with_preinfer"] == {"ranks": 2, "cached": 1, "share": 0.5}
    assert m0["preinfers_sent"] == 4 and m0["orphan_share"] == 0.25
    assert m0["preinfer_reasons"] == {"admitted": 2, "footprint": 1}
    assert m0["status_400"] == {"preinfer": 1, "rank": 0} and sum(m0["failed"].values()) == 0
    assert m0["ranks_ok"] == 4 and m0["goodput_rps"] == pytest.approx(4 / 60)
    assert m0["tiers"] == {"device": 1, "miss": 3} and m0["p99_ms"] == pytest.approx(20.0, abs=0.5)
    assert m0["visits"] == 5 and m0["target_met"] is False and not m0["kill"]
    assert m0["rss_mb"] == {"i0": 310.0} and m0["answered_by"] == {"i0": 6, "i1": 2}
    assert m1["kill"] and m1["disrupted"]
    assert m1["with_preinfer"] == {"ranks": 1, "cached": 1, "share": 1.0}  # user 1 came back
    assert m1["followed"]["share"] is None and m1["target_met"] is None
    assert m1["failed"]["5xx"] == 1 and m1["failed"]["connection"] == 1 and m1["retries"] == 2
    assert m1["failed_by_endpoint"] == {"preinfer": 1, "rank": 1}
    assert m1["no_header"] == {"preinfer": 0, "rank": 1, "rank_ok": 1}
    assert m1["rss_mb"] == {"i1": 280.0} and m1["orphan_share"] == 1.0
    assert m2["ranks_ok"] == 1 and m2["goodput_rps"] == pytest.approx(1 / 30)
    assert m2["with_preinfer"]["share"] == 1.0 and m2["followed"]["ranks"] == 0  # late is not "followed"


def test_disrupted_buckets_run_from_the_kill_to_the_return():
    assert disrupted_buckets({}, 60.0, 600.0) == ()
    assert disrupted_buckets({"at_s": 300.0, "ready_s": 335.0}, 60.0, 600.0) == (5,)
    assert disrupted_buckets({"at_s": 350.0, "ready_s": 370.0}, 60.0, 600.0) == (5, 6)
    assert disrupted_buckets({"at_s": 350.0}, 60.0, 600.0) == (5, 6, 7, 8, 9)  # never came back


@pytest.mark.slow
def test_short_real_run_kills_and_restarts_an_instance(tmp_path):
    """Two tiny instances behind nginx for 100 s in 10 s buckets, i0 SIGKILLed at 15% and restarted (a restart
    compiles every graph again: tens of seconds on shared cores)."""
    prefix = tmp_path / "soak"
    parser = argparse.ArgumentParser(prog="relaygr bench")
    soak_bench.register(parser.add_subparsers(dest="bench", required=True))
    args = parser.parse_args(["soak", "--config", str(TINY), *cli_overrides(ONE_BUCKET), "--minutes", str(100 / 60),
                              "--bucket-s", "10",
                              "--kill-at", "0.15", "--rate", "10", "--rss-every", "2", "--out", str(prefix) + ".json"])
    assert args.func(args) == 0
    report = json.loads(prefix.with_name("soak.json").read_text())
    assert prefix.with_name("soak.png").is_file() and prefix.with_name("soak.config.yaml").is_file()
    for key in ("command", "args", "mix", "mix_drawn", "machine", "per_minute", "rss", "summary", "kill",
                "overrides", "minutes_table"):
        assert key in report, key
    assert set(report["machine"]) >= {"cpu_model", "cores", "matmul_gflops", "mindspore", "date_utc"}
    assert "trigger.risk_margin=0.01" in report["overrides"]
    assert set(report["mix"]) >= {"orphan", "rank_only", "late", "no_header", "returning", "retries", "follow"}
    rows = report["per_minute"]
    assert [r["minute"] for r in rows] == list(range(10))  # every bucket is there
    for r in rows:
        assert set(r) >= {"followed", "with_preinfer", "goodput_rps", "p99_ms", "preinfer_reasons", "failed",
                          "status_400", "rss_mb", "orphan_share", "answered_by", "kill", "target_met"}
    kill = report["kill"]
    assert kill["instance"] == "i0" and kill["old_pid"] != kill["new_pid"]
    assert kill["ready_s"] > kill["at_s"]  # it came back ...
    assert kill["answers_after_restart"] > 0  # ... and answered later requests
    assert [r["minute"] for r in rows if r["kill"]] == [kill["minute"]] == [int(kill["at_s"] // 10)]
    after = [r for r in rows if r["start_s"] >= kill["ready_s"]]
    assert any(r["answered_by"].get("i0", 0) for r in after)
    # RSS samples of both instances, and of the restarted i0 under its new worker pid
    by_inst = {}
    for s in report["rss"]:
        if s["rss_mb"] is not None:
            by_inst.setdefault(s["instance"], set()).add(s["pid"])
    assert set(by_inst) == {"i0", "i1"} and len(by_inst["i0"]) == 2
    assert any(r["cpu_cores"] for r in rows)
    assert report["summary"]["requests_answered"] > 0
    assert sum(r["preinfer_reasons"].get("admitted", 0) for r in rows) > 0  # the trigger admits pre-infers
    assert "KILL" in format_table(report)
