"""The evaluation's filter: a fixed rule on the user's earlier events, never the model's history length."""

from __future__ import annotations

import numpy as np
import pytest

from mindspore_relaygr.data.sequences import Target
from mindspore_relaygr.model.inputs import History
from mindspore_relaygr.train.eval_filter import (
    DEFAULT_FILTERS,
    EVERY_EARLIER_ITEM,
    REFERENCE_FILTER,
    HistoryFilter,
    check_filters,
    parse_filter,
)
from mindspore_relaygr.train.full_ranking import RankingCase, batch_ranks, ranking_cases
from mindspore_relaygr.train.metrics import paired_difference, per_user_values, standard_error


def _history(items: list[int]) -> History:
    n = len(items)
    return History(np.array(items, np.int32), np.zeros(n, np.int32), np.arange(n, dtype=np.int64))


def test_rules_parse_and_name_themselves():
    assert parse_filter("recent200") == REFERENCE_FILTER and REFERENCE_FILTER.name == "recent200"
    assert parse_filter(" ALL ") == EVERY_EARLIER_ITEM and EVERY_EARLIER_ITEM.name == "all"
    assert parse_filter("none") == HistoryFilter(0) and HistoryFilter(0).name == "none"
    assert parse_filter("recent7").recent == 7
    for bad in ("recent0", "recent", "200", "last200", "recent-5", ""):
        with pytest.raises(ValueError, match="recentN"):
            parse_filter(bad)
    assert [f.name for f in DEFAULT_FILTERS] == ["recent200", "all"]
    with pytest.raises(ValueError, match="twice"):
        check_filters([REFERENCE_FILTER, parse_filter("recent200")])
    with pytest.raises(ValueError):
        check_filters([])


def test_each_rule_removes_what_it_says():
    earlier = np.array([5, 6, 7, 8, 9])
    np.testing.assert_array_equal(parse_filter("recent2").excluded(earlier), [8, 9])
    np.testing.assert_array_equal(parse_filter("recent9").excluded(earlier), earlier)
    np.testing.assert_array_equal(EVERY_EARLIER_ITEM.excluded(earlier), earlier)
    assert parse_filter("none").excluded(earlier).size == 0


def test_filtering_200_or_400_recent_items_changes_a_rank_by_hand():
    """450 earlier events. Item 3 was seen 300 events ago (outside the 200 most recent, inside the 400) and
    scores above the target: the reference rule ranks it (target 2nd), recent400 removes it (target 1st).
    Item 2 is among the 200 most recent and scores higher still: every rule removes it."""
    earlier = [10] * 450
    earlier[450 - 300] = 3
    earlier[450 - 5] = 2
    case = RankingCase(0, _history(earlier[-50:]), target_id=1, earlier_items=np.array(earlier))
    scores = np.array([[-np.inf, 0.5, 0.9, 0.7, 0.1] + [0.0] * 6])  # items 0..10 (0: padding)
    assert batch_ranks(scores, [case], REFERENCE_FILTER)[0] == 2
    assert batch_ranks(scores, [case], parse_filter("recent400"))[0] == 1
    assert batch_ranks(scores, [case], EVERY_EARLIER_ITEM)[0] == 1
    assert batch_ranks(scores, [case], parse_filter("none"))[0] == 3


def test_the_input_cap_leaves_the_filter_unchanged():
    """A case capped to 50 events reads 50, but its filter still sees all 450 earlier events."""
    items = list(range(1, 451))
    seq = _history(items)
    targets = {0: Target(seq, 999, 0, 0)}
    short, long = ranking_cases(targets, 50)[0], ranking_cases(targets, 400)[0]
    assert len(short.history) == 50 and len(long.history) == 400
    for rule in (REFERENCE_FILTER, EVERY_EARLIER_ITEM, parse_filter("recent300")):
        np.testing.assert_array_equal(short.excluded(rule), long.excluded(rule))
    np.testing.assert_array_equal(short.excluded(REFERENCE_FILTER), items[-200:])
    assert len(short.excluded(EVERY_EARLIER_ITEM)) == 450


def test_standard_errors_and_paired_differences_by_hand():
    ranks = np.array([1, 3, 20, 2])
    np.testing.assert_array_equal(per_user_values(ranks, "hr@10"), [1, 1, 0, 1])
    np.testing.assert_allclose(per_user_values(ranks, "ndcg@10"), [1, 0.5, 0, 1 / np.log2(3)])
    np.testing.assert_allclose(per_user_values(ranks, "mrr"), [1, 1 / 3, 1 / 20, 1 / 2])
    assert standard_error(np.array([1.0, 1.0, 0.0, 1.0])) == pytest.approx(np.std([1, 1, 0, 1], ddof=1) / 2)
    assert standard_error(np.array([0.3])) == 0.0
    diff, se = paired_difference(np.array([1, 3, 20, 2]), np.array([1, 1, 20, 20]), "hr@10")
    assert diff == pytest.approx(-0.25)  # one user fell out of the top 10
    assert se == pytest.approx(np.std([0, 0, 0, -1], ddof=1) / 2)
    assert paired_difference(ranks, ranks, "ndcg@10") == (0.0, 0.0)
    with pytest.raises(ValueError, match="same users"):
        paired_difference(ranks, ranks[:3], "mrr")
    with pytest.raises(ValueError, match="hr@k"):
        per_user_values(ranks, "auc")


def test_filter_option_on_the_command_line():
    from mindspore_relaygr.cli import build_parser

    parser = build_parser()
    args = parser.parse_args(["eval", "--checkpoint", "x.ckpt"])
    assert [f.name for f in args.filter] == ["recent200", "all"]
    args = parser.parse_args(["caps", "--checkpoint", "x.ckpt", "--caps", "50", "all", "--filter", "recent400"])
    assert [f.name for f in args.filter] == ["recent400"] and args.caps == [50, "all"]
    with pytest.raises(SystemExit) as err:
        parser.parse_args(["eval", "--checkpoint", "x.ckpt", "--filter", "latest"])
    assert err.value.code == 2


def test_a_filter_listed_twice_is_refused_before_any_work(capsys):
    from mindspore_relaygr.cli import main

    assert main(["eval", "--checkpoint", "missing.ckpt", "--filter", "all", "all"]) == 2
    assert "listed twice" in capsys.readouterr().err
