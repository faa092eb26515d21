"""The exported model version is named after the data the model was trained on (not `ml1m-` for other data)."""

from __future__ import annotations

import pytest

from mindspore_relaygr.export import bundle_name


@pytest.mark.parametrize(("data_path", "name"), [
    (None, "ml100k"),  # the default data: the bundled ML-100K
    ("ml-1m", "ml1m"),
    ("ml-100k", "ml100k"),
    ("outputs/shop/events.csv", "events"),
    ("/data/clicks 2025.tsv", "clicks_2025"),
    ("logs/shop.inter", "shop"),
    ("~weird~.csv", "weird"),
    ("...csv", "model"),  # nothing usable in the name
])
def test_the_version_prefix_is_the_datas_name(data_path, name):
    assert bundle_name(data_path) == name


def test_movielens_files_are_named_by_their_directory(tmp_path):
    (tmp_path / "ml-100k").mkdir()
    (tmp_path / "ml-100k" / "u.data").write_text("1\t2\t3\t4\n")
    (tmp_path / "shoplog").mkdir()
    assert bundle_name(str(tmp_path / "ml-100k" / "u.data")) == "ml-100k"
    assert bundle_name(str(tmp_path / "ml-100k")) == "ml-100k"
    assert bundle_name(str(tmp_path / "shoplog")) == "shoplog"
