"""MovieLens loaders on fixture files written to tmp_path, bad-file errors, and the recbole-bundled ML-100K."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pytest

from mindspore_relaygr.data.movielens import (
    OCCUPATIONS_100K,
    USER_FEATURE_SIZES,
    age_bucket,
    bundled_ml100k_path,
    load_movielens,
)

HAS_RECBOLE = importlib.util.find_spec("recbole") is not None
# Raw user ids 20, 7, 50 -> dense 2, 1, 3; raw items 300, 5, 42 -> dense 3, 1, 2 (ascending raw order).
ROWS = [(20, 300, 4, 881250949), (7, 5, 1, 881250950), (20, 42, 5, 881250940), (50, 5, 3, 881250999)]


def _write(path: Path, lines: list[str], encoding: str = "utf-8") -> Path:
    path.write_bytes(("\n".join(lines) + "\n").encode(encoding))
    return path


def _check_rows(data) -> None:
    assert (data.num_users, data.num_items, len(data)) == (3, 3, 4)
    assert data.user_vocab == {7: 1, 20: 2, 50: 3}
    assert data.item_vocab == {5: 1, 42: 2, 300: 3}
    np.testing.assert_array_equal(data.user_ids, [2, 1, 2, 3])
    np.testing.assert_array_equal(data.item_ids, [3, 1, 2, 1])
    np.testing.assert_array_equal(data.ratings, [4, 1, 5, 3])
    np.testing.assert_array_equal(data.timestamps, [r[3] for r in ROWS])
    assert data.user_ids.dtype == np.int32 and data.item_ids.dtype == np.int32
    assert data.timestamps.dtype == np.int64


@pytest.fixture
def udata_dir(tmp_path: Path) -> Path:
    _write(tmp_path / "u.data", ["\t".join(map(str, r)) for r in ROWS])
    _write(tmp_path / "u.user", ["7|24|M|technician|85711", "20|53|F|other|94043", "50|17|X|astronaut|0"])
    genres = "|".join("0" * 19)
    _write(tmp_path / "u.item", [f"5|Misérables, Les (1995)|01-Jan-1995||http://x|{genres}",
                                 f"42|Clerks (1994)|01-Jan-1994||http://x|{genres}",
                                 f"300|Air Force One (1997)|01-Jan-1997||http://x|{genres}",
                                 f"999|Never Rated (1990)|01-Jan-1990||http://x|{genres}"], encoding="latin-1")
    return tmp_path


def test_udata_with_side_files(udata_dir: Path) -> None:
    for path in (udata_dir, udata_dir / "u.data"):
        data = load_movielens(path)
        _check_rows(data)
        assert data.source == f"u.data:{udata_dir / 'u.data'}"
        assert data.user_feature_sizes == USER_FEATURE_SIZES == (3, 8, 22)
        technician, other = OCCUPATIONS_100K.index("technician") + 1, OCCUPATIONS_100K.index("other") + 1
        # gender M=2 F=1 unknown=0; ages 24 -> 18-24 bucket 2, 53 -> 50-55 bucket 6, 17 -> under-18 bucket 1
        assert data.user_features == {1: (2, 2, technician), 2: (1, 6, other), 3: (0, 1, 0)}
        assert data.item_titles == {1: "Misérables, Les (1995)", 2: "Clerks (1994)", 3: "Air Force One (1997)"}
        np.testing.assert_array_equal(data.user_feature_array(3), [0, 1, 0])


def test_udata_without_side_files(tmp_path: Path) -> None:
    _write(tmp_path / "u1.base", ["\t".join(map(str, r)) for r in ROWS])
    data = load_movielens(tmp_path / "u1.base")
    _check_rows(data)
    assert data.user_features == {} and data.item_titles == {} and data.user_feature_sizes == ()
    assert data.user_feature_array(1) is None


def test_ml1m_ratings_dat(tmp_path: Path) -> None:
    _write(tmp_path / "ratings.dat", ["::".join(map(str, r)) for r in ROWS])
    # users.dat: UserID::Gender::Age(code)::Occupation(code 0..20)::Zip
    _write(tmp_path / "users.dat", ["7::F::1::10::48067", "20::M::56::16::70072", "50::M::25::0::55117"])
    _write(tmp_path / "movies.dat", ["5::Père Noël (1982)::Comedy", "42::Clerks (1994)::Comedy"], encoding="latin-1")
    data = load_movielens(tmp_path)
    _check_rows(data)
    assert data.source.startswith("ratings.dat:")
    assert data.user_features == {1: (1, 1, 11), 2: (2, 7, 17), 3: (2, 3, 1)}  # occupation code + 1
    assert data.item_titles == {1: "Père Noël (1982)", 2: "Clerks (1994)"}


def test_atomic_files_header_driven(tmp_path: Path) -> None:
    # Columns in another order than ml-100k.inter and float-typed integers, as RecBole writes them.
    lines = ["item_id:token\tuser_id:token\ttimestamp:float\trating:float"]
    lines += [f"{i}\t{u}\t{t}.0\t{r}.0" for u, i, r, t in ROWS]
    _write(tmp_path / "toy.inter", lines)
    _write(tmp_path / "toy.user", ["user_id:token\tage:token\tgender:token\toccupation:token\tzip_code:token",
                                   "7\t30\tM\twriter\t1", "20\t60\tF\tstudent\t2"])
    _write(tmp_path / "toy.item", ["item_id:token\tmovie_title:token_seq\trelease_year:token\tclass:token_seq",
                                   "300\tAir Force One\t1997\tAction", "5\tMisérables, Les\t1995\tDrama"])
    data = load_movielens(tmp_path / "toy.inter")
    _check_rows(data)
    assert data.source == f"atomic:{tmp_path / 'toy.inter'}"
    writer, student = OCCUPATIONS_100K.index("writer") + 1, OCCUPATIONS_100K.index("student") + 1
    assert data.user_features == {1: (2, 3, writer), 2: (1, 7, student)}  # user 3 (raw 50) has no row
    np.testing.assert_array_equal(data.user_feature_array(3), [0, 0, 0])
    assert data.item_titles == {3: "Air Force One", 1: "Misérables, Les"}


def test_age_buckets() -> None:
    ages = [0, 1, 17, 18, 24, 25, 34, 35, 44, 45, 49, 50, 55, 56, 90]
    assert [age_bucket(a) for a in ages] == [0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 7, 7]
    assert max(age_bucket(a) for a in ages) < USER_FEATURE_SIZES[1]


@pytest.mark.parametrize(("name", "lines", "message"), [
    ("u.data", ["1\t2\t3\t4", "1\t2\t3"], r"u\.data:2: expected 4 '\\t'-separated fields, got 3"),
    ("u.data", ["1\t2\t3\t4", "", "1\tx\t3\t4"], r"u\.data:3: item id 'x' is not a number"),
    ("u.data", ["1\t2\t3\t4.5"], r"u\.data:1: timestamp '4\.5' is not an integer"),
    ("u.data", ["1\t2\tnan\t4"], r"u\.data:1: rating 'nan' is not finite"),
    ("u.data", [""], r"u\.data: no interactions \(empty file\)"),
    ("ratings.dat", ["1::2::3::4", "1::2::3::4::5"], r"ratings\.dat:2: expected 4 '::'-separated fields, got 5"),
    ("x.inter", ["user_id:token\titem_id:token\trating:float"],
     r"x\.inter:1: header lacks column\(s\) \['timestamp'\]"),
    ("x.inter", ["user_id:token\titem_id:token\trating:float\ttimestamp:float", "1\t2\t3"],
     r"x\.inter:2: expected 4 '\\t'-separated fields, got 3"),
    ("x.inter", ["user_id:token\titem_id:token\trating:float\ttimestamp:float"], r"x\.inter: no interactions"),
])
def test_bad_files_rejected(tmp_path: Path, name: str, lines: list[str], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        load_movielens(_write(tmp_path / name, lines))


def test_bad_side_file_and_missing_paths(tmp_path: Path) -> None:
    _write(tmp_path / "u.data", ["1\t2\t3\t4"])
    _write(tmp_path / "u.user", ["1|twenty|M|writer|0"])
    with pytest.raises(ValueError, match=r"u\.user:1: age 'twenty' is not a number"):
        load_movielens(tmp_path)
    with pytest.raises(ValueError, match=r"missing\.data: file not found"):
        load_movielens(tmp_path / "missing.data")
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match=r"empty: no \*\.inter, u\.data or ratings\.dat"):
        load_movielens(tmp_path / "empty")
    header = b"user_id:token\titem_id:token\trating:float\ttimestamp:float\n"
    (tmp_path / "bin.inter").write_bytes(header + b"\xff\t1\t1\t1\n")
    with pytest.raises(ValueError, match=r"bin\.inter:2: not utf-8 text"):
        load_movielens(tmp_path / "bin.inter")


@pytest.mark.skipif(not HAS_RECBOLE, reason="recbole (which ships ML-100K) is not installed")
def test_bundled_ml100k() -> None:
    path = bundled_ml100k_path()
    assert path.parts[-3:] == ("dataset_example", "ml-100k", "ml-100k.inter")
    data = load_movielens()
    assert (data.num_users, data.num_items, len(data)) == (943, 1682, 100_000)
    assert data.source == "recbole==1.2.1:dataset_example/ml-100k/ml-100k.inter"
    # Raw ids are already 1..N, so the dense ids equal them.
    assert all(k == v for k, v in data.user_vocab.items()) and all(k == v for k, v in data.item_vocab.items())
    np.testing.assert_array_equal(np.bincount(data.ratings.astype(int))[1:], [6110, 11370, 27145, 34174, 21201])
    assert (data.timestamps.min(), data.timestamps.max()) == (874724710, 893286638)
    assert np.bincount(np.bincount(data.user_ids)[1:].clip(max=20))[20] == 943  # every user rated >= 20 movies
    assert len(data.user_features) == 943 and len(data.item_titles) == 1682
    assert data.user_features[1] == (2, 2, OCCUPATIONS_100K.index("technician") + 1)  # 1  24  M  technician
    assert data.item_titles[1] == "Toy Story"
    feats = np.array(list(data.user_features.values()))
    assert (feats > 0).all() and (feats < np.array(USER_FEATURE_SIZES)).all()  # no unknown values in ML-100K
