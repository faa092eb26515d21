"""warmup() compiles the prefix graphs and the spill/reload copies, and leaves the pool empty."""

from __future__ import annotations

import pytest

from mindspore_relaygr import load_config
from tests.conftest import CONFIGS

pytestmark = pytest.mark.slow


def test_prefix_warmup_covers_slot_copies_and_leaves_slot_zero_free():
    from mindspore_relaygr.model import RelayGRModel

    model = RelayGRModel(load_config(CONFIGS / "tiny.yaml", ["cache.num_slots=2"]))
    report = model.warmup(graphs=("prefix",))
    assert report["graphs"] == len(model.graph_shapes("prefix")) + 2 * len(model.prefix_buckets)
    with pytest.raises(ValueError, match="holds nothing"):
        model.export_slot(0)
