"""Every path of the model computes the logits of an independent float64 numpy oracle (tests/model/hstu_numpy.py).

test_exactness.py checks the paths against each other (cached == full), so a mistake they share (a bucket, a
mask, the token layout) passes there; here each path is checked against the design's math, on both backends
(fused_cpu: the fused CPU kernels; plain: MindSpore ops), on the batched paths (several users in one graph call:
rank_cached_batch, prefill_batch) and on the training forward.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest

from mindspore_relaygr.history import History
from mindspore_relaygr.model.ranker import CachedRank, PrefillChunk
from tests.conftest import random_history, split_history
from tests.model import hstu_numpy
from tests.model.conftest import shared_tiny
from tests.model.hstu_numpy import HSTUOracle, weights_of

pytestmark = pytest.mark.slow

# Tolerance on logits. The model runs in fp32 (relative rounding ~6e-8 per op), the oracle in float64: over the
# tiny config's 2 layers (LayerNorms, SiLUs, sums of up to 128 attention terms) and the engage logit's 1 /
# temperature = 20x, the largest |model - oracle| measured on the paths below is 8.0e-6 (plain ops, chunked
# prefill, 30 candidates; the batched calls 7.6e-6; fused kernels 5.0e-6; training forward 2.6e-6, its final
# states 5.4e-6) on logits of spread ~1-3 (O(1) weights from randomize_weights). 3e-5 is ~4x that, while one
# relative-bias bucket off moves logits by ~0.5 (test_a_one_bucket_error_is_far_above_the_tolerance): four orders
# of magnitude above it.
ATOL = 3e-5
BACKENDS = ("fused_cpu", "plain")
USER = [1, 3]
SUFFIX = 6  # short-term events ranked on top of a cached prefix (suffix bucket 8)


@pytest.fixture(scope="module", params=BACKENDS)
def model(request):
    """The tiny model on one backend with large random weights (batch buckets 1, 2, 4)."""
    return shared_tiny(request.param, seed=1)


@pytest.fixture(scope="module")
def oracle(model) -> HSTUOracle:
    return HSTUOracle(model.cfg, weights_of(model.net))


def first(h: dict, n: int) -> dict:
    return split_history(h, n)[0]


def events(h: dict, start: int, stop: int | None = None) -> dict:
    """Events [start, stop) of h without the user features (a suffix)."""
    return {k: v[start:stop] for k, v in h.items() if k != "user_features"}


def assert_close(got: np.ndarray, want: np.ndarray, what: str) -> None:
    assert got.shape == want.shape, what
    err = float(np.abs(got - want).max())
    assert err <= ATOL, f"{what}: max |model - oracle| = {err:.3g} > {ATOL}"


def test_rank_full_matches_in_every_candidate_bucket(model, oracle):
    rng = np.random.default_rng(0)
    for n in (55, 63):  # 63 events + the user token fill the 64-token bucket exactly
        h = random_history(rng, n, user_features=USER)
        for m in (1, 8, 9, 32):  # either side of the candidate buckets [8, 32]
            cands = rng.integers(1, 201, m)
            want = oracle.logits(h, cands)
            assert_close(model.rank_full(h, cands, logits=True), want, f"rank_full n={n} m={m}")
    assert want.std(axis=0).min() > 0.5  # logits far from 0: the comparison has something to compare


def test_one_shot_prefill_then_rank_cached(model, oracle):
    rng = np.random.default_rng(1)
    h = random_history(rng, 60, user_features=USER)
    assert model.prefill(0, first(h, 50)) == 50
    for m in (5, 20):  # candidate buckets 8 and 32
        cands = rng.integers(1, 201, m)
        got = model.rank_cached(0, 50, events(h, 50, 50 + SUFFIX), cands, logits=True)
        assert_close(got, oracle.logits(first(h, 50 + SUFFIX), cands), f"suffix of {SUFFIX}, m={m}")
        got = model.rank_cached(0, 50, events(h, 50, 50), cands, logits=True)
        assert_close(got, oracle.logits(first(h, 50), cands), f"empty suffix, m={m}")
    # A slot read for fewer events than it holds: the rest of the history is the suffix.
    cands = rng.integers(1, 201, 7)
    got = model.rank_cached(0, 44, events(h, 44, 52), cands, logits=True)
    assert_close(got, oracle.logits(first(h, 52), cands), "prefix_len 44 of 50 held")


def test_chunked_prefill_then_rank_cached(model, oracle):
    rng = np.random.default_rng(2)
    h = random_history(rng, 70, user_features=USER)
    model.release_slot(1)
    # 24-token chunks: [user + 23 events], [24 events] over 24 past tokens, [13 events] over 48.
    assert list(model.prefill_steps(1, first(h, 60), chunk_len=24)) == [23, 47, 60]
    for m, suffix in ((6, SUFFIX), (30, 0)):
        cands = rng.integers(1, 201, m)
        got = model.rank_cached(1, 60, events(h, 60, 60 + suffix), cands, logits=True)
        assert_close(got, oracle.logits(first(h, 60 + suffix), cands), f"chunked, suffix of {suffix}, m={m}")


def test_a_prefix_extended_from_a_later_start(model, oracle):
    rng = np.random.default_rng(3)
    h = random_history(rng, 70, user_features=USER)
    model.prefill(0, first(h, 25))
    assert model.prefill(0, first(h, 55), start=25) == 55  # 30 events over 26 cached tokens
    cands = rng.integers(1, 201, 8)
    assert_close(model.rank_cached(0, 55, events(h, 55, 55 + SUFFIX), cands, logits=True),
                 oracle.logits(first(h, 55 + SUFFIX), cands), "extended to 55")
    assert model.prefill(0, first(h, 62), start=55) == 62  # and once more, over a 64-token past bucket
    for m, suffix in ((8, SUFFIX), (17, 0)):
        cands = rng.integers(1, 201, m)
        got = model.rank_cached(0, 62, events(h, 62, 62 + suffix), cands, logits=True)
        assert_close(got, oracle.logits(first(h, 62 + suffix), cands), f"extended to 62, suffix of {suffix}")


def test_rank_cached_batch_matches_for_every_user_of_a_batch(model, oracle):
    """Three users in one batched call (batch bucket 4: one padding user), each padded to the batch's largest
    past, suffix and candidate buckets: a one-shot prefix with a suffix, a short prefix with an empty suffix
    and many candidates, an extended prefix read for fewer events than it holds; then two users in smaller
    buckets (batch bucket 2)."""
    rng = np.random.default_rng(6)
    hs = [random_history(rng, 70, user_features=USER) for _ in range(3)]
    for slot in range(3):
        model.release_slot(slot)
    model.prefill(0, first(hs[0], 60))
    model.prefill(1, first(hs[1], 20))
    model.prefill(2, first(hs[2], 30))
    model.prefill(2, first(hs[2], 62), start=30)
    # (slot, events read from the slot, events ranked, candidates)
    batches = [[(0, 60, 66, 5), (1, 20, 20, 30), (2, 50, 58, 1)], [(1, 12, 15, 3), (0, 20, 20, 8)]]
    for batch in batches:
        cands = [rng.integers(1, 201, m) for *_, m in batch]
        requests = [CachedRank(slot, held, events(hs[slot], held, end), c)
                    for (slot, held, end, _), c in zip(batch, cands, strict=True)]
        got = model.rank_cached_batch(requests, logits=True)
        assert len(got) == len(batch)
        for (slot, held, end, m), c, g in zip(batch, cands, got, strict=True):
            assert_close(g, oracle.logits(first(hs[slot], end), c), f"batched rank: slot {slot}, {held} + "
                                                                     f"{end - held} events, m={m}")


def test_prefill_batch_caches_what_the_oracle_ranks(model, oracle):
    """prefill_batch of first chunks mixed with an extension (one graph call), then of two extensions over
    different past buckets; every slot is then ranked (rank_cached) against the oracle."""
    rng = np.random.default_rng(7)
    hs = [random_history(rng, 70, user_features=USER) for _ in range(3)]
    for slot in range(3):
        model.release_slot(slot)
    model.prefill(2, first(hs[2], 25))
    rounds = [[PrefillChunk(0, first(hs[0], 40)), PrefillChunk(1, first(hs[1], 20)),
               PrefillChunk(2, first(hs[2], 55), 25)],
              [PrefillChunk(0, first(hs[0], 62), 40), PrefillChunk(1, first(hs[1], 45), 20)]]
    for chunks in rounds:
        assert model.prefill_batch(chunks) == [len(c.history["item_ids"]) for c in chunks]
        for c in chunks:
            held = len(c.history["item_ids"])
            for m, suffix in ((6, SUFFIX), (20, 0)):
                cands = rng.integers(1, 201, m)
                got = model.rank_cached(c.slot, held, events(hs[c.slot], held, held + suffix), cands, logits=True)
                assert_close(got, oracle.logits(first(hs[c.slot], held + suffix), cands),
                             f"batched prefill: slot {c.slot} from {c.start} to {held}, suffix of {suffix}")


def test_the_training_forward_matches(model, oracle):
    """BatchForward (plain ops on the per-head weights, whatever the model's backend) on a batch of two requests
    laid out as rank_full lays them out: every history token's final state and the candidates' logits."""
    from mindspore import Tensor

    from mindspore_relaygr.model.batch_forward import BatchForward
    from mindspore_relaygr.model.batch_index import RabIndex
    from mindspore_relaygr.train.batches import FORWARD_FIELDS, ranking_row

    cfg = model.cfg
    rng = np.random.default_rng(4)
    hists = [random_history(rng, n, user_features=USER) for n in (40, 63)]
    cands = rng.integers(1, 201, 5)
    bucket = 64
    rows = [ranking_row(cfg, to_history(h), bucket, cands.astype(np.int32), RabIndex(cfg)) for h in hists]
    batch = {k: np.stack([r[k] for r in rows]) for k in FORWARD_FIELDS}
    hidden = BatchForward(model.net, 0.0)(*(Tensor(batch[k]) for k in FORWARD_FIELDS)).asnumpy().astype(np.float64)
    w = oracle.w
    for r, h in enumerate(hists):
        want = oracle.forward(h, cands)
        n_tok = len(want.history_states)
        assert_close(hidden[r, :n_tok], want.history_states, f"row {r}: history states")
        user, cand_states = hidden[r, n_tok - 1], hidden[r, bucket:]
        items = w["item_table"][cands]
        engage = items @ user / (np.linalg.norm(items, axis=1) * np.linalg.norm(user)) / cfg.score_temperature
        head = cand_states @ w["head.weight"].T + w["head.bias"]
        assert_close(np.column_stack([engage, head]), want.logits, f"row {r}: logits")


def to_history(h: dict) -> History:
    return History(h["item_ids"].astype(np.int32), h["action_ids"].astype(np.int32),
                   h["timestamps"].astype(np.int64), np.asarray(h["user_features"], np.int32))


def shifted(fn: Callable[..., np.ndarray]) -> Callable[..., np.ndarray]:
    """A bucket function whose buckets are one higher (clipped to the last)."""
    return lambda values, num_buckets, arg: np.minimum(fn(values, num_buckets, arg) + 1, num_buckets - 1)


@pytest.mark.parametrize("which", ["time_bucket", "position_bucket"])
def test_a_one_bucket_error_is_far_above_the_tolerance(model, oracle, which, monkeypatch):
    """The tolerance could not hide a bucket mistake: an oracle off by one bucket misses the model by far."""
    rng = np.random.default_rng(5)
    h = random_history(rng, 55, user_features=USER)
    cands = rng.integers(1, 201, 8)
    got = model.rank_full(h, cands, logits=True)
    assert_close(got, oracle.logits(h, cands), "unbroken")
    monkeypatch.setattr(hstu_numpy, which, shifted(getattr(hstu_numpy, which)))
    assert np.abs(got - oracle.logits(h, cands)).max() > 1e3 * ATOL
