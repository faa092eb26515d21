"""ScatterViewRows (the prefix graph's in-place slot write) against numpy, and a fused prefill storing the same
K/V as the reference ops' head transposes + scatter_update."""

from __future__ import annotations

import numpy as np
import pytest

from tests.conftest import random_history, split_history

pytestmark = pytest.mark.slow

LAYERS, HEADS, D, WIDTH, POOL_ROWS = 3, 2, 4, 21, 60


@pytest.fixture
def write_graph(tiny_config_path):
    """A graph that writes rows of a pool Parameter through the kernel, as KVPool.write_views does (a new one per
    test: MindSpore refuses to run a graph again after one of its kernels failed)."""
    from mindspore import Parameter, Tensor, nn

    from mindspore_relaygr import load_config
    from mindspore_relaygr.model.kernels import load_fused_ops
    from mindspore_relaygr.runtime import configure_context

    configure_context(load_config(tiny_config_path).context)
    fused = load_fused_ops()
    if fused is None:
        pytest.fail("the fused kernels should build here (g++ is present)")

    class Write(nn.Cell):
        def __init__(self) -> None:
            super().__init__()
            self.pool = Parameter(Tensor(np.full((POOL_ROWS, D), -1.0, np.float32)), name="pool",
                                  requires_grad=False)

        def construct(self, ids, at, y0, y1, y2):
            return fused.scatter_view_rows(self.pool, ids, at, y0, y1, y2)

    return Write()


def _write(graph, ids, at, ys):
    from mindspore import Tensor

    done = graph(Tensor(ids.astype(np.int32)), Tensor(np.array(at, np.int64)), *(Tensor(y) for y in ys))
    return done.asnumpy(), graph.pool.asnumpy()


def test_rows_land_in_the_pool_in_place(write_graph):
    rng = np.random.default_rng(0)
    tokens, first_col = 5, 7  # head g of token t at columns first_col + g * D of row t
    ys = [rng.normal(size=(tokens + 2, WIDTH)).astype(np.float32) for _ in range(LAYERS)]
    ids = rng.permutation(POOL_ROWS)[: LAYERS * HEADS * tokens]
    before = write_graph.pool.asnumpy().copy()
    done, pool = _write(write_graph, ids, (first_col, D, WIDTH, D, HEADS), ys)
    assert done.tolist() == [1]
    want = before.copy()
    for i, row in enumerate(ids):
        layer, head, t = i // (HEADS * tokens), (i // tokens) % HEADS, i % tokens
        want[row] = ys[layer][t, first_col + head * D: first_col + (head + 1) * D]
    np.testing.assert_array_equal(pool, want)  # written rows copied exactly, every other row untouched


@pytest.mark.parametrize("ids_shift,at", [(POOL_ROWS, (0, D, WIDTH, D, HEADS)),  # a row id past the pool
                                          (0, (WIDTH - D, D, WIDTH, D, HEADS)),  # a view past y's row
                                          (0, (0, D, WIDTH, D + 1, HEADS))])  # width != the pool's
def test_bad_ids_or_views_are_refused_and_write_nothing(write_graph, ids_shift, at):
    ys = [np.ones((3, WIDTH), np.float32) for _ in range(LAYERS)]
    ids = np.arange(LAYERS * HEADS * 3) + ids_shift
    before = write_graph.pool.asnumpy().copy()
    with pytest.raises(RuntimeError, match="ScatterViewRows"):
        _write(write_graph, ids, at, ys)
    np.testing.assert_array_equal(write_graph.pool.asnumpy(), before)


def test_fused_prefill_stores_what_the_reference_stores(tiny_model, tiny_config_path, tmp_path):
    """One-shot and extended prefills: the slot's K/V equal the reference path's (head-major scatter_update)."""
    from mindspore_relaygr import load_config
    from mindspore_relaygr.model import RelayGRModel

    assert tiny_model.backend.name == "fused_cpu", "the fused prefill should write the pool through the kernel"
    path = tmp_path / "w.ckpt"
    tiny_model.save_checkpoint(path)
    reference = RelayGRModel(load_config(tiny_config_path, ["model.fused_kernels=false", "cache.num_slots=2"]))
    reference.load_checkpoint(path)
    assert reference.backend.name == "plain"
    hist = random_history(np.random.default_rng(21), 90, user_features=[2, 1])
    head, _ = split_history(hist, 50)
    for model in (tiny_model, reference):
        model.prefill(1, head)
        model.prefill(1, hist, start=50)  # extends the slot: the write starts mid-slot
    got, want = tiny_model.export_slot(1), reference.export_slot(1)
    assert got.keys.shape == want.keys.shape and got.num_tokens == 91  # user token + 90 events
    np.testing.assert_allclose(got.keys, want.keys, rtol=0, atol=1e-5)
    np.testing.assert_allclose(got.values, want.values, rtol=0, atol=1e-5)
    np.testing.assert_array_equal(got.timestamps, want.timestamps)
