"""Pool geometry: row ids of reads and writes (plain numpy)."""

from __future__ import annotations

import numpy as np
import pytest

from mindspore_relaygr.config import CacheConfig, ModelConfig
from mindspore_relaygr.model.pool import PoolLayout

LAYOUT = PoolLayout(num_slots=3, slot_len=8, num_layers=2, num_heads=2, d_qk=4, d_v=4)


def test_read_ids_are_head_major_and_inside_the_slot():
    kv, times = LAYOUT.read_ids(1, 4)
    lh = 2 * 2
    expect = np.concatenate([(1 * lh + i) * 8 + np.arange(4) for i in range(lh)])
    np.testing.assert_array_equal(kv, expect)
    np.testing.assert_array_equal(times, 8 + np.arange(4))


@pytest.mark.parametrize("slot", [0, 2])
def test_read_views_address_the_rows_read_ids_name(slot):
    """Element (head h, token t, column c) of layer l's K view is the pool row read_ids gives (l, h, t)."""
    layout = PoolLayout(num_slots=3, slot_len=8, num_layers=2, num_heads=2, d_qk=4, d_v=6)
    views = layout.read_views(slot).reshape(2, 2, 4)
    kv, _ = layout.read_ids(slot, 8)
    rows = kv.reshape(2, 2, 8)
    for layer in range(2):
        for part, width in ((0, 4), (1, 6)):
            offset, head_stride, row_stride, w = views[layer, part]
            assert w == width
            for h in range(2):
                for t in range(8):
                    assert offset + h * head_stride + t * row_stride == rows[layer, h, t] * width


def test_write_ids_send_padding_to_distinct_scratch_rows():
    kv, times = LAYOUT.write_ids(2, start=6, count=2, bucket=4)
    assert len(set(kv.tolist())) == kv.size
    np.testing.assert_array_equal(times, [2 * 8 + 6, 2 * 8 + 7, 3 * 8 + 2, 3 * 8 + 3])
    scratch = kv.reshape(4, 4)[:, 2:]
    assert scratch.min() >= 3 * 2 * 2 * 8  # beyond the last slot


def test_write_that_does_not_fit_is_rejected():
    with pytest.raises(ValueError, match="does not fit"):
        LAYOUT.write_ids(0, start=6, count=3, bucket=4)
    with pytest.raises(ValueError, match="slot=3"):
        LAYOUT.check_slot(3)


def test_slots_from_a_byte_budget():
    model = ModelConfig(num_layers=2, num_heads=2, d_qk=4, d_v=4, max_seq_len=8, len_buckets=[8])
    token = (2 * 2 * 8 + 2) * 4
    layout = PoolLayout.from_config(model, CacheConfig(num_slots=None, pool_bytes=token * 8 * 5, max_prefix_len=8))
    assert layout.num_slots == 4 and layout.pool_bytes == token * 8 * 5
    with pytest.raises(ValueError, match="holds no slot"):
        PoolLayout.from_config(model, CacheConfig(num_slots=None, pool_bytes=token * 8, max_prefix_len=8))
