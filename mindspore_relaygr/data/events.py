"""Event logs: the interactions a ranker trains on, read from the file a team brings (numpy only).

The format (docs/your_data.md): one row per event with a header naming the columns, as CSV (`.csv`), tab-separated
text (`.tsv`) or a RecBole atomic file (`.inter`, whose header says `name:type`). Required: a user column, an item
column and a time column (unix seconds, or ISO 8601 date-times); optional: an event-type column (click, cart, buy,
a rating, ...), a 0/1 label column for the second task, and categorical user-feature columns. `config.data` names
the columns (`DataConfig`); MovieLens datasets are such logs too, read by `data.movielens` with the columns
user_id, item_id, rating, timestamp and the user features gender, age_bucket, occupation.

What the schema gives the rows (`apply_schema`):
- ids: raw ids are mapped to dense ids 1..N (0 stays padding). All-integer ids keep their numbers' order; other
  ids (text) are numbered in natural order ("u2" before "u10"), items first in the order of a catalogue file (the
  RecBole `.item` next to a `.inter`) when there is one.
- event types: action ids 0..K-1 in the order of `data.event_types`, else of the distinct types sorted (numbers
  numerically, so MovieLens ratings 1..5 are actions 0..4); without an event column every event is action 0.
- the label of the second task: `data.label_column` (0/1, true/false), or `data.label_events` (the label is 1 on
  events of these types: MovieLens's "rating >= 4" is `[4, 5]`); neither: no label (a one-task model).
- user features: per column, the values sorted and numbered 1.., 0 = unknown (no value); a user's value is the one
  on their latest event that has one (a `.user` file has one row per user).
Every problem with the file is a `DataError` naming the file, the line, the column and the value.
"""

from __future__ import annotations

import csv
import datetime as dt
import io
import logging
import math
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np

from mindspore_relaygr.config import DataConfig
from mindspore_relaygr.errors import DataError

logger = logging.getLogger(__name__)

RawId = int | str  # a raw id or value: an integer when the text is one, else the text
MAX_TIMESTAMP = 2**40  # the model's exact range (model.inputs.MAX_ABS_TIMESTAMP); serving takes >= 0
MAX_EVENT_TYPES = 1000  # a "small vocabulary": more distinct values are an id column, not event types
FORMATS = {".csv": ",", ".tsv": "\t"}  # delimited text with a header row; .inter: RecBole atomic
ATOMIC_SUFFIXES = (".inter", ".user", ".item")  # RecBole atomic files
MOVIELENS_SUFFIXES = (".dat", ".data", ".base", ".test")  # ratings.dat; ML-100K's u.data, u1.base, ua.test...
TRUE_LABELS, FALSE_LABELS = frozenset({"1", "true", "yes"}), frozenset({"0", "false", "no"})


@dataclass(frozen=True)
class Interactions:
    """All events of one log with dense ids, their event types, labels and user features."""

    user_ids: np.ndarray  # int32 [n], dense 1..num_users
    item_ids: np.ndarray  # int32 [n], dense 1..num_items
    action_ids: np.ndarray  # int32 [n], event type ids 0..num_actions-1
    timestamps: np.ndarray  # int64 [n], unix seconds
    user_vocab: dict[RawId, int]  # raw user id -> dense id
    item_vocab: dict[RawId, int]  # raw item id -> dense id
    user_features: dict[int, tuple[int, ...]]  # dense user id -> feature ids (0 = unknown), one per feature
    item_titles: dict[int, str]  # dense item id -> title (a catalogue file's)
    source: str
    user_feature_sizes: tuple[int, ...] = ()  # cardinalities (0 = unknown included); (): no user features
    labels: np.ndarray | None = None  # bool [n], the second task's label; None: the log has none
    event_types: tuple[RawId, ...] = ()  # raw event type of each action id; (): no event column (one type)
    user_feature_names: tuple[str, ...] = ()
    user_feature_vocabs: tuple[dict[RawId, int], ...] = ()  # per feature: raw value -> id (1..)
    label_rule: dict[str, Any] = field(default_factory=dict)  # {"column": ...} or {"events": [...]}; {}: none
    event_column: str | None = None

    def __len__(self) -> int:
        return int(self.user_ids.shape[0])

    @property
    def num_users(self) -> int:
        return len(self.user_vocab)

    @property
    def num_items(self) -> int:
        return len(self.item_vocab)

    @property
    def num_actions(self) -> int:
        return max(1, len(self.event_types))

    def user_feature_array(self, user_id: int) -> np.ndarray | None:
        """int32 [len(user_feature_sizes)] for a dense user id (zeros if unknown); None without features."""
        if not self.user_feature_sizes:
            return None
        feats = self.user_features.get(user_id, (0,) * len(self.user_feature_sizes))
        return np.asarray(feats, dtype=np.int32)


@dataclass
class RawEvents:
    """A log after its reader: dense users and items, timestamps, and the text of the other columns, before
    `apply_schema` gives those columns their meaning."""

    source: str
    path: Path  # the file the rows come from (errors name it)
    lines: np.ndarray  # int64 [n], the line of each row in `path`
    user_ids: np.ndarray  # int32 [n]
    item_ids: np.ndarray  # int32 [n]
    timestamps: np.ndarray  # int64 [n]
    user_vocab: dict[RawId, int]
    item_vocab: dict[RawId, int]
    item_titles: dict[int, str]
    columns: dict[str, list[str]]  # every other column of the log: name -> text of each row
    user_file: Path | None = None  # a user file (one row per user) and its columns: name -> dense user -> (line,
    user_columns: dict[str, dict[int, tuple[int, str]]] = field(default_factory=dict)  # text)
    fixed_vocabs: dict[str, dict[RawId, int]] = field(default_factory=dict)  # feature vocabularies the reader fixed


# ---------------------------------------------------------------- values


def data_error(path: Path, line: int | None, column: str | None, message: str) -> DataError:
    """`path:line: column 'c': message` (line and column when known)."""
    where = f"{path}:{line}" if line is not None else str(path)
    return DataError(f"{where}: column {column!r}: {message}" if column else f"{where}: {message}")


def parse_int(text: str) -> int | None:
    """`text` as an integer (integral floats such as "881250949.0" too), else None."""
    try:
        return int(text)
    except ValueError:
        pass
    try:
        value = float(text)
    except ValueError:
        return None
    return int(value) if math.isfinite(value) and value == int(value) else None


def canonical(text: str) -> RawId:
    """A raw id or value: the integer when the text is one ("4.0" -> 4), else the stripped text."""
    text = text.strip()
    value = parse_int(text)
    return text if value is None else value


def natural_key(value: RawId) -> tuple:
    """Sort key: integers first, numerically; then text in natural order ("u2" < "u10")."""
    if isinstance(value, int):
        return (0, value)
    return (1, [int(p) if p.isdigit() else p for p in re.split(r"(\d+)", value)])


def shown(value: Any, limit: int = 60) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[:limit] + "...'"


def parse_timestamps(path: Path, lines: np.ndarray, column: str, texts: list[str]) -> np.ndarray:
    """int64 unix seconds of a time column: integers (integral floats accepted) or ISO 8601 date-times (UTC unless
    they carry an offset); each must be in [0, 2^40)."""
    n = len(texts)
    try:
        values = np.fromiter(map(int, texts), np.int64, n)
    except (ValueError, OverflowError):
        values = np.fromiter((_timestamp(path, int(line), column, t) for line, t in zip(lines, texts, strict=True)),
                             np.int64, n)
    bad = np.flatnonzero((values < 0) | (values >= MAX_TIMESTAMP))
    if bad.size:
        k = int(bad[0])
        raise _out_of_range(path, int(lines[k]), column, texts[k], int(values[k]))
    return values


def _out_of_range(path: Path, line: int, column: str, text: str, value: int) -> DataError:
    hint = " (milliseconds? the model takes seconds)" if value >= MAX_TIMESTAMP else ""
    return data_error(path, line, column, f"{shown(text)} is outside [0, 2^40) unix seconds{hint}")


def _timestamp(path: Path, line: int, column: str, text: str) -> int:
    value = parse_int(text.strip())
    if value is not None:
        if not 0 <= value < MAX_TIMESTAMP:  # checked here too: beyond int64 it would not reach the array check
            raise _out_of_range(path, line, column, text, value)
        return value
    try:
        when = dt.datetime.fromisoformat(text.strip())
    except ValueError:
        try:
            fraction = math.isfinite(float(text))
        except ValueError:
            fraction = False
        what = "is not whole unix seconds" if fraction else "is neither unix seconds nor an ISO 8601 date-time"
        raise data_error(path, line, column, f"{shown(text)} {what}") from None
    if when.tzinfo is None:
        when = when.replace(tzinfo=dt.UTC)
    return int(when.timestamp())


def dense_ids(path: Path, lines: np.ndarray, column: str, texts: list[str], order: Sequence[str] = ()
              ) -> tuple[np.ndarray, dict[RawId, int]]:
    """(int32 dense id of each row, raw id -> dense id): integer ids ascending, text ids in natural order, except
    that ids listed in `order` (a catalogue file) come first, in its order. An empty id is an error."""
    tokens = list(dict.fromkeys(texts))
    index = {t: k for k, t in enumerate(tokens)}
    codes = np.fromiter(map(index.__getitem__, texts), np.int64, len(texts))
    raw = [canonical(t) for t in tokens]
    if "" in raw:
        k = int(np.flatnonzero(codes == raw.index(""))[0])
        raise data_error(path, int(lines[k]), column, "empty id")
    if all(isinstance(r, int) for r in raw):
        keys = sorted(set(raw))
    else:
        raw = [t.strip() for t in tokens]  # text ids stay text ("007" and "7" are two items)
        present = set(raw)
        first = [t for t in dict.fromkeys(o.strip() for o in order) if t in present]
        rest = sorted(present.difference(first), key=natural_key)
        if order and rest:
            logger.warning("%s: %d item(s) are not in the catalogue file (first: %r); numbered after it", path,
                           len(rest), rest[0])
        keys = first + rest
    vocab: dict[RawId, int] = {r: k for k, r in enumerate(keys, 1)}
    per_token = np.fromiter((vocab[r] for r in raw), np.int64, len(raw))
    return per_token[codes].astype(np.int32), vocab


# ---------------------------------------------------------------- reading a log


def open_data(path: Path) -> BinaryIO:
    """A data file opened for reading bytes; a missing or unreadable file is a DataError."""
    if not path.is_file():
        raise DataError(f"{path}: file not found")
    try:
        return path.open("rb")
    except OSError as exc:
        raise DataError(f"{path}: cannot read: {exc.strerror or exc}") from None


def read_bytes(path: Path) -> bytes:
    """The bytes of a data file; a missing or unreadable file is a DataError."""
    with open_data(path) as f:
        return f.read()


def _decode(path: Path) -> str:
    raw = read_bytes(path)
    try:
        return raw.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        line = raw.count(b"\n", 0, e.start) + 1
        raise DataError(f"{path}:{line}: not UTF-8 text ({e.reason} at byte {e.start})") from None


def read_table(path: Path, needed: Sequence[str] = ()) -> tuple[dict[str, int], np.ndarray, list[list[str]]]:
    """A delimited file with a header row: (column name -> index, int64 [n] line of each data row, one list of n
    texts per column). `.inter` (and its `.user`, `.item`): RecBole atomic (tab-separated, `name:type` headers);
    `.csv`, `.tsv`: CSV with quoting. A missing `needed` column or a row with another field count is a DataError."""
    if path.suffix in ATOMIC_SUFFIXES:
        from mindspore_relaygr.data.movielens import atomic_table

        cols, lines, columns = atomic_table(path, ())
    else:
        cols, lines, columns = _csv_table(path, FORMATS.get(path.suffix, ","))
    missing = [c for c in needed if c not in cols]
    if missing:
        raise DataError(f"{path}:{_header_line(path)}: no column {missing[0]!r} (the header has "
                        f"{', '.join(repr(c) for c in cols)}): name it in the data section of the config")
    return cols, lines, columns


def _header_line(path: Path) -> int:
    for k, line in enumerate(read_bytes(path).splitlines(), 1):
        if line.strip():
            return k
    return 1


def _csv_table(path: Path, delimiter: str) -> tuple[dict[str, int], np.ndarray, list[list[str]]]:
    reader = csv.reader(io.StringIO(_decode(path), newline=""), delimiter=delimiter, strict=True)
    rows: list[list[str]] = []
    lines: list[int] = []
    header: list[str] | None = None
    header_line = 1
    try:
        for row in reader:
            if not row or all(not f.strip() for f in row):
                continue
            if header is None:
                header, header_line = [h.strip() for h in row], reader.line_num
                continue
            if len(row) != len(header):
                raise DataError(f"{path}:{reader.line_num}: expected {len(header)} {delimiter!r}-separated fields "
                                f"(the header's), got {len(row)}")
            rows.append(row)
            lines.append(reader.line_num)
    except csv.Error as exc:
        raise DataError(f"{path}:{reader.line_num}: {exc}") from None
    if header is None:
        raise DataError(f"{path}: empty file (no header)")
    dup = next((h for k, h in enumerate(header) if h in header[:k]), None)
    if dup is not None or "" in header:
        raise DataError(f"{path}:{header_line}: the header names column {dup or ''!r} twice or not at all")
    columns = [list(c) for c in zip(*rows, strict=True)] if rows else [[] for _ in header]
    return {h: k for k, h in enumerate(header)}, np.asarray(lines, np.int64), columns


def read_event_log(path: Path, cfg: DataConfig) -> RawEvents:
    """The rows of an event log (`.csv`, `.tsv`, `.inter`) with the columns `cfg` names; a RecBole `.user` / `.item`
    next to a `.inter` add user features and the catalogue order (and titles)."""
    wanted = [c for c in (cfg.event_column, cfg.label_column, *cfg.user_feature_columns) if c is not None]
    cols, lines, columns = read_table(path, (cfg.user_column, cfg.item_column, cfg.time_column))
    if lines.size == 0:
        raise DataError(f"{path}: no events (a header and no rows)")
    order: list[str] = []
    titles: dict[str, str] = {}
    user_file = path.with_suffix(".user") if path.suffix == ".inter" else None
    item_file = path.with_suffix(".item") if path.suffix == ".inter" else None
    if item_file is not None and item_file.is_file():
        icols, _, icolumns = read_table(item_file, ("item_id",))
        order = icolumns[icols["item_id"]]
        title = next((c for c in ("title", "movie_title", "name") if c in icols), None)
        if title is not None:
            titles = {i.strip(): t.strip() for i, t in zip(order, icolumns[icols[title]], strict=True)}
    user_ids, user_vocab = dense_ids(path, lines, cfg.user_column, columns[cols[cfg.user_column]])
    item_ids, item_vocab = dense_ids(path, lines, cfg.item_column, columns[cols[cfg.item_column]], order)
    times = parse_timestamps(path, lines, cfg.time_column, columns[cols[cfg.time_column]])
    raw = RawEvents(f"events:{path}", path, lines, user_ids, item_ids, times, user_vocab, item_vocab,
                    {d: titles[str(r)] for r, d in item_vocab.items() if str(r) in titles},
                    {c: columns[cols[c]] for c in wanted if c in cols})
    from_user_file = [c for c in cfg.user_feature_columns if c not in cols]
    if from_user_file and user_file is not None and user_file.is_file():
        ucols, ulines, ucolumns = read_table(user_file, ("user_id",))
        known = {str(r): d for r, d in user_vocab.items()}
        dense = [known.get(t.strip()) for t in ucolumns[ucols["user_id"]]]
        raw.user_file = user_file
        for c in from_user_file:
            if c in ucols:
                raw.user_columns[c] = {d: (int(line), text) for d, line, text
                                       in zip(dense, ulines.tolist(), ucolumns[ucols[c]], strict=True)
                                       if d is not None}
    return raw


# ---------------------------------------------------------------- the schema


def apply_schema(raw: RawEvents, cfg: DataConfig) -> Interactions:
    """Event types, labels and user features of `raw` as `cfg` describes them; see the module docstring."""
    actions, event_types = _event_types(raw, cfg)
    labels, rule = _labels(raw, cfg, actions, event_types)
    names, vocabs, feats = _user_features(raw, cfg)
    return Interactions(
        user_ids=raw.user_ids.astype(np.int32), item_ids=raw.item_ids.astype(np.int32), action_ids=actions,
        timestamps=raw.timestamps.astype(np.int64), user_vocab=raw.user_vocab, item_vocab=raw.item_vocab,
        user_features=feats, item_titles=raw.item_titles, source=raw.source,
        user_feature_sizes=tuple(max(v.values(), default=0) + 1 for v in vocabs),
        labels=labels, event_types=event_types, user_feature_names=names, user_feature_vocabs=vocabs,
        label_rule=rule, event_column=cfg.event_column)


def _column(raw: RawEvents, key: str, name: str) -> list[str]:
    if name not in raw.columns:
        columns = [c for c in raw.columns] or ["(no other column)"]
        raise DataError(f"{raw.path}: data.{key}={name!r}: no such column in the log (its other columns read: "
                        f"{', '.join(columns)})")
    return raw.columns[name]


def _distinct(texts: list[str]) -> tuple[list[RawId], np.ndarray]:
    """(canonical value of each distinct text, int64 [n] index of each row's text in that list)."""
    tokens = list(dict.fromkeys(texts))
    index = {t: k for k, t in enumerate(tokens)}
    return [canonical(t) for t in tokens], np.fromiter(map(index.__getitem__, texts), np.int64, len(texts))


def _event_types(raw: RawEvents, cfg: DataConfig) -> tuple[np.ndarray, tuple[RawId, ...]]:
    n = len(raw.lines)
    if cfg.event_column is None:
        return np.zeros(n, np.int32), ()
    column = cfg.event_column
    values, codes = _distinct(_column(raw, "event_column", column))
    if "" in values:
        k = int(np.flatnonzero(codes == values.index(""))[0])
        raise data_error(raw.path, int(raw.lines[k]), column, "empty event type")
    if cfg.event_types is not None:
        types = tuple(canonical(str(v)) for v in cfg.event_types)
    else:
        types = tuple(sorted(set(values), key=natural_key))
        if len(types) > MAX_EVENT_TYPES:
            raise DataError(f"{raw.path}: column {column!r} holds {len(types)} distinct values: event types are a "
                            f"small vocabulary (at most {MAX_EVENT_TYPES}); is data.event_column the right column?")
    action_of = {t: k for k, t in enumerate(types)}
    unknown = [k for k, v in enumerate(values) if v not in action_of]
    if unknown:
        row = int(np.flatnonzero(np.isin(codes, unknown))[0])
        raise data_error(raw.path, int(raw.lines[row]), column,
                         f"event type {shown(values[codes[row]])} is not one of data.event_types {list(types)}")
    per_value = np.asarray([action_of[v] for v in values], np.int32)
    return per_value[codes], types


def _labels(raw: RawEvents, cfg: DataConfig, actions: np.ndarray, types: tuple[RawId, ...]
            ) -> tuple[np.ndarray | None, dict[str, Any]]:
    if cfg.label_events is not None:
        wanted = [canonical(str(v)) for v in cfg.label_events]
        missing = [w for w in wanted if w not in types]
        if missing:
            raise DataError(f"{raw.path}: data.label_events: {shown(missing[0])} is not an event type of column "
                            f"{cfg.event_column!r} (its types: {', '.join(map(str, types))})")
        ids = [types.index(w) for w in wanted]
        return np.isin(actions, ids), {"events": wanted}
    if cfg.label_column is None:
        return None, {}
    column = cfg.label_column
    tokens = list(dict.fromkeys(_column(raw, "label_column", column)))
    value_of = {}
    for t in tokens:
        low = t.strip().lower()
        value = canonical(low)
        value_of[t] = True if low in TRUE_LABELS or value == 1 else False if low in FALSE_LABELS or value == 0 else None
    texts = raw.columns[column]
    bad = next((k for k, t in enumerate(texts) if value_of[t] is None), None)
    if bad is not None:
        raise data_error(raw.path, int(raw.lines[bad]), column, f"label {shown(texts[bad])} is not 0/1 or true/false")
    return np.fromiter((value_of[t] for t in texts), np.bool_, len(texts)), {"column": column}


def _user_features(raw: RawEvents, cfg: DataConfig
                   ) -> tuple[tuple[str, ...], tuple[dict[RawId, int], ...], dict[int, tuple[int, ...]]]:
    names = tuple(cfg.user_feature_columns)
    if not names:
        return (), (), {}
    per_feature: list[dict[int, RawId]] = []  # dense user -> raw value
    seen: list[set[RawId]] = []  # every value of the column: the vocabulary (a value no user has now included)
    for name in names:
        if name in raw.columns:
            per_feature.append(_latest_values(raw, raw.columns[name]))
            seen.append({v for v in (canonical(t) for t in set(raw.columns[name])) if v != ""})
        elif name in raw.user_columns:
            per_feature.append({u: canonical(t) for u, (_, t) in raw.user_columns[name].items() if t.strip()})
            seen.append(set(per_feature[-1].values()))
        else:
            where = f" nor in {raw.user_file}" if raw.user_file is not None else ""
            raise DataError(f"{raw.path}: data.user_feature_columns: no column {name!r} in the log{where}")
    vocabs = []
    for name, values, everything in zip(names, per_feature, seen, strict=True):
        if name in raw.fixed_vocabs:
            vocab = raw.fixed_vocabs[name]
            bad = next((v for v in values.values() if v not in vocab), None)
            if bad is not None:
                raise DataError(f"{raw.path}: user feature {name!r}: value {shown(bad)} is not in its vocabulary")
        else:
            vocab = {v: k for k, v in enumerate(sorted(everything, key=natural_key), 1)}
        vocabs.append(vocab)
    users = set().union(*(v.keys() for v in per_feature))
    feats = {u: tuple(vocab.get(values.get(u), 0) for vocab, values in zip(vocabs, per_feature, strict=True))
             for u in sorted(users)}
    missing = len(raw.user_vocab) - len(feats)
    if missing:
        logger.warning("%s: %d users have no user features; they get 0 = unknown", raw.source, missing)
    return names, tuple(vocabs), feats


def _latest_values(raw: RawEvents, texts: list[str]) -> dict[int, RawId]:
    """Dense user -> the value on their latest event (time, then file order) that has one."""
    values, codes = _distinct(texts)
    has = np.asarray([v != "" for v in values], bool)[codes]
    rows = np.flatnonzero(has)
    order = rows[np.lexsort((rows, raw.timestamps[rows], raw.user_ids[rows]))]
    users = raw.user_ids[order]
    last = np.r_[users[1:] != users[:-1], True] if users.size else np.zeros(0, bool)
    return {int(u): values[codes[r]] for u, r in zip(users[last].tolist(), order[last].tolist(), strict=True)}


# ---------------------------------------------------------------- entry point


def event_log_file(path: str | None) -> Path | None:
    """The event log `data.path` names (a `.csv`, `.tsv` or `.inter` file, or the one such file of a directory);
    None for MovieLens (a bundled name, u.data, ratings.dat or a directory holding one)."""
    from mindspore_relaygr.data import movielens

    if path is None or path in movielens.BUNDLED:
        return None
    file = Path(path)
    if file.is_dir():
        if any((file / n).is_file() for n in ("u.data", "ratings.dat")):
            return None
        found = sorted(p for p in file.iterdir() if p.suffix in (*FORMATS, ".inter"))
        if len(found) != 1:
            raise DataError(f"{file}: expected one .csv, .tsv or .inter file (or u.data / ratings.dat) in this "
                            f"directory, found {len(found)}: name the file in data.path")
        return found[0]
    if file.suffix in (*FORMATS, ".inter"):
        return file
    if file.name == "u.data" or file.suffix in MOVIELENS_SUFFIXES:
        return None
    if not file.exists():
        raise DataError(f"{file}: no such file or directory (data.path)")
    raise DataError(f"{file}: not a known event-log format ({file.suffix or 'no suffix'}): name the file .csv "
                    f"(comma-separated, a header row), .tsv (tab-separated, a header row) or .inter (RecBole atomic)")


def load_interactions(cfg: DataConfig) -> Interactions:
    """The interactions `cfg` names: an event log (`.csv`, `.tsv`, `.inter`) or a MovieLens dataset
    (`data.movielens`), with the schema of `cfg` applied."""
    from mindspore_relaygr.data import movielens

    log_file = event_log_file(cfg.path)
    if log_file is not None:
        raw = read_event_log(log_file, cfg)
    else:
        raw = movielens.movielens_events(movielens.load_movielens(cfg.path), cfg)
    data = apply_schema(raw, cfg)
    logger.info("loaded %d events, %d users, %d items, %d event types from %s", len(data), data.num_users,
                data.num_items, data.num_actions, data.source)
    return data
