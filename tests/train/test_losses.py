"""Sampled softmax loss against a numpy implementation; gradients reach the query and both embeddings."""

from __future__ import annotations

import numpy as np
import pytest

ms = pytest.importorskip("mindspore")

from mindspore import Tensor  # noqa: E402

from mindspore_relaygr.train.losses import MIN_TEMPERATURE, l2_normalize, sampled_softmax_loss  # noqa: E402
from mindspore_relaygr.train.negatives import negative_weights  # noqa: E402


@pytest.fixture(scope="module", autouse=True)
def context(tiny_config_path):
    from mindspore_relaygr import load_config
    from mindspore_relaygr.runtime import configure_context

    configure_context(load_config(tiny_config_path).context)  # before any op: later models set it otherwise


def numpy_loss(query, pos_emb, neg_emb, pos_ids, neg_ids, temperature, pick=None):
    """Position by position, in float64; pick [B, N, K]: the pool entries each position uses (None: all)."""
    def norm(x):
        return x / np.sqrt((x * x).sum(-1, keepdims=True) + 1e-6)

    q, p, n = norm(query.astype(np.float64)), norm(pos_emb.astype(np.float64)), norm(neg_emb.astype(np.float64))
    losses = []
    for b in range(query.shape[0]):
        for i in range(query.shape[1]):
            if pos_ids[b, i] <= 0:
                continue
            pos = q[b, i] @ p[b, i] / temperature
            ks = range(neg_emb.shape[1]) if pick is None else pick[b, i]
            negs = [q[b, i] @ n[b, k] / temperature for k in ks if neg_ids[b, k] != pos_ids[b, i]]
            logits = np.array([pos, *negs])
            losses.append(np.log(np.exp(logits - logits.max()).sum()) + logits.max() - pos)
    return float(np.mean(losses)) if losses else 0.0


def random_inputs(seed: int = 0, b: int = 3, n: int = 5, k: int = 7, d: int = 8):
    rng = np.random.default_rng(seed)
    query = rng.normal(size=(b, n, d)).astype(np.float32) * 3.0  # not unit length: the loss normalises
    pos_emb = rng.normal(size=(b, n, d)).astype(np.float32)
    neg_emb = rng.normal(size=(b, k, d)).astype(np.float32) * 0.5
    pos_ids = rng.integers(1, 50, size=(b, n)).astype(np.int32)
    neg_ids = rng.integers(1, 50, size=(b, k)).astype(np.int32)
    pos_ids[0, :2] = 0  # positions without a target
    pos_ids[-1, -1] = 0
    neg_ids[1, 3] = pos_ids[1, 2]  # an accidental hit ...
    neg_emb[1, 3] = pos_emb[1, 2]  # ... with the target's own embedding, as a gather would give
    neg_ids[-1, 0] = neg_ids[-1, -2] = pos_ids[-1, 1]  # two hits of one position
    return query, pos_emb, neg_emb, pos_ids, neg_ids


@pytest.mark.parametrize("temperature", [0.05, 1.0])
def test_matches_numpy(temperature: float) -> None:
    args = random_inputs()
    got = float(sampled_softmax_loss(*(Tensor(a) for a in args), temperature).asnumpy())
    assert got == pytest.approx(numpy_loss(*args, temperature), rel=1e-5, abs=1e-5)


def test_per_position_negatives_from_the_pool_match_numpy() -> None:
    args = random_inputs(seed=5, k=9)
    pick = np.random.default_rng(5).integers(0, 9, size=(3, 5, 4)).astype(np.int32)
    pick[1, 2, :2] = 3  # position (1, 2) picks its accidental hit twice: both are dropped
    pick[0, 3, :3] = 6  # and position (0, 3) one item three times: it counts three times
    weights = negative_weights(pick, args[3], args[4])
    got = float(sampled_softmax_loss(*(Tensor(a) for a in args), 0.05, Tensor(weights)).asnumpy())
    want = numpy_loss(*args, 0.05, pick)
    assert got == pytest.approx(want, rel=1e-5, abs=1e-5)
    assert want != pytest.approx(numpy_loss(*args, 0.05), rel=1e-3)  # the picks matter


def test_matches_numpy_in_graph_mode() -> None:
    @ms.jit
    def compiled(query, pos_emb, neg_emb, pos_ids, neg_ids, neg_weight):
        return sampled_softmax_loss(query, pos_emb, neg_emb, pos_ids, neg_ids, 0.05, neg_weight)

    args = random_inputs(seed=3)
    pick = np.random.default_rng(3).integers(0, 7, size=(3, 5, 4))
    got = float(compiled(*(Tensor(a) for a in args), Tensor(negative_weights(pick, args[3], args[4]))).asnumpy())
    assert got == pytest.approx(numpy_loss(*args, 0.05, pick), rel=1e-5, abs=1e-5)


def test_the_lowest_temperature_stays_finite_and_a_lower_one_is_refused() -> None:
    query, pos_emb, neg_emb, pos_ids, neg_ids = random_inputs(seed=4)
    neg_emb[:, 0] = -query[:, 0]  # the most distant negative: its shifted logit is exp(-2 / t)
    args = query, pos_emb, neg_emb, pos_ids, neg_ids
    got = float(sampled_softmax_loss(*(Tensor(a) for a in args), MIN_TEMPERATURE).asnumpy())
    assert np.isfinite(got)
    assert got == pytest.approx(numpy_loss(*args, MIN_TEMPERATURE), rel=1e-4, abs=1e-4)
    with pytest.raises(ValueError, match="below"):
        sampled_softmax_loss(*(Tensor(a) for a in args), MIN_TEMPERATURE / 2)


def test_accidental_hits_and_masked_positions_change_nothing_else() -> None:
    args = query, pos_emb, neg_emb, pos_ids, neg_ids = random_inputs(seed=1)
    base = float(sampled_softmax_loss(*(Tensor(a) for a in args), 0.05).asnumpy())
    # A masked position's query is irrelevant.
    q2 = query.copy()
    q2[0, 0] = 100.0
    got = float(sampled_softmax_loss(Tensor(q2), Tensor(pos_emb), Tensor(neg_emb), Tensor(pos_ids), Tensor(neg_ids),
                                     0.05).asnumpy())
    assert got == pytest.approx(base, rel=1e-6)
    # No valid position at all: 0, not NaN.
    zero = sampled_softmax_loss(Tensor(query), Tensor(pos_emb), Tensor(neg_emb), Tensor(np.zeros_like(pos_ids)),
                                Tensor(neg_ids), 0.05)
    assert float(zero.asnumpy()) == 0.0


def test_l2_normalize() -> None:
    x = np.array([[3.0, 4.0], [0.0, 0.0]], np.float32)
    got = l2_normalize(Tensor(x)).asnumpy()
    np.testing.assert_allclose(got, [[0.6, 0.8], [0.0, 0.0]], atol=1e-6)


def test_gradients_flow() -> None:
    query, pos_emb, neg_emb, pos_ids, neg_ids = random_inputs(seed=2, b=2, n=3, k=4, d=4)
    neg_ids[0, 1] = pos_ids[0, 0]

    def fn(q, p, n):
        return sampled_softmax_loss(q, p, n, Tensor(pos_ids), Tensor(neg_ids), 0.05)

    grads = ms.grad(fn, grad_position=(0, 1, 2))(Tensor(query), Tensor(pos_emb), Tensor(neg_emb))
    for g in grads:
        g = g.asnumpy()
        assert np.isfinite(g).all() and np.abs(g).max() > 0
    # Numerical check of one query coordinate (float64 numpy loss, central difference).
    eps = 1e-3
    qp, qm = query.copy(), query.copy()
    qp[1, 2, 0] += eps
    qm[1, 2, 0] -= eps
    numeric = (numpy_loss(qp, pos_emb, neg_emb, pos_ids, neg_ids, 0.05)
               - numpy_loss(qm, pos_emb, neg_emb, pos_ids, neg_ids, 0.05)) / (2 * eps)
    assert float(grads[0].asnumpy()[1, 2, 0]) == pytest.approx(numeric, rel=2e-2, abs=1e-3)
