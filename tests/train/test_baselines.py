"""SASRec baseline: learns a next-item pattern with the sampled softmax, full-ranking scores, seeded runs,
best-epoch restore."""

from __future__ import annotations

import numpy as np
import pytest

from mindspore_relaygr.config import load_config
from mindspore_relaygr.data.sequences import EvalExample, Target
from mindspore_relaygr.model.inputs import History
from mindspore_relaygr.train.baselines import NextItemTarget, SASRecTrainer, as_target
from mindspore_relaygr.train.metrics import full_ranking_ranks

NUM_ITEMS, NUM_USERS, EPOCHS = 40, 48, 10
OVERRIDES = ["train.sasrec_d_model=16", "train.sasrec_num_heads=1", "train.sasrec_num_layers=2",
             "train.sasrec_max_len=8", "train.sasrec_batch_size=16", "train.num_negatives=8", "train.negative_pool=16",
             "train.sasrec_dropout=0.1", f"train.sasrec_epochs={EPOCHS}", "train.sasrec_lr=0.01"]


def history(items) -> History:
    n = len(items)
    return History(np.asarray(items, np.int32), np.zeros(n, np.int32), np.arange(n, dtype=np.int64))


def walks(seed: int = 0) -> dict[int, History]:
    """Every user walks the catalogue: item i is always followed by item i + 1 (wrapping around)."""
    rng = np.random.default_rng(seed)
    out = {}
    for user in range(1, NUM_USERS + 1):
        n, start = int(rng.integers(6, 11)), int(rng.integers(0, NUM_ITEMS))
        out[user] = history((start + np.arange(n)) % NUM_ITEMS + 1)
    return out


@pytest.fixture(scope="module")
def setup(tiny_config_path):
    from mindspore_relaygr.runtime import configure_context

    configure_context(load_config(tiny_config_path).context)  # graph mode on CPU; before any op
    full = walks()
    train = {u: h.slice(0, len(h) - 2) for u, h in full.items()}
    valid = [NextItemTarget(h.slice(0, len(h) - 2), int(h.item_ids[-2])) for h in full.values()]
    test = [NextItemTarget(h.slice(0, len(h) - 1), int(h.item_ids[-1])) for h in full.values()]
    tc = load_config(overrides=OVERRIDES).train
    lines: list[str] = []
    trainer = SASRecTrainer(tc, NUM_ITEMS, seed=3, progress=lines.append).fit(train, valid, eval_every=1)
    return {"tc": tc, "train": train, "valid": valid, "test": test, "trainer": trainer, "lines": lines}


def test_learns_the_next_item_pattern(setup) -> None:
    trainer = setup["trainer"]
    metrics = trainer.evaluate(setup["test"])
    # By chance, with the ~8 history items excluded: HR@10 ~ 10 / 32.
    assert metrics["hr@10"] > 0.8 and metrics["ndcg@10"] > 0.5, metrics
    assert set(metrics) == {"hr@10", "ndcg@10", "hr@50", "ndcg@50", "hr@200", "ndcg@200", "mrr"}
    assert len(trainer.losses) == EPOCHS and trainer.losses[-1] < 0.5 * trainer.losses[0]
    assert len(setup["lines"]) == EPOCHS + 1
    assert "SASRec epoch 1/10 loss" in setup["lines"][0] and "tokens/s" in setup["lines"][0]
    assert "valid HR@10" in setup["lines"][0]


def test_score_all_shape_and_padding_column(setup) -> None:
    trainer, test = setup["trainer"], setup["test"]
    long = history((np.arange(30) + 5) % NUM_ITEMS + 1)  # longer than sasrec_max_len: its last 8 events count
    histories = [c.history for c in test[:19]] + [long, history([])]
    scores = trainer.score_all(histories)
    assert scores.shape == (21, NUM_ITEMS + 1) and scores.dtype == np.float32
    assert np.all(scores[:, 0] == -np.inf) and np.isfinite(scores[:, 1:]).all()
    assert np.abs(scores[:, 1:]).max() <= 1.0 + 1e-5  # cosines
    np.testing.assert_allclose(trainer.score_all([long])[0], trainer.score_all([long.slice(22)])[0], atol=1e-6)
    # Full ranking never ranks the padding column: the best item ranks 1 even though column 0 is excluded.
    best = scores[:19, 1:].argmax(1) + 1
    assert full_ranking_ranks(scores[:19], best, [np.zeros(0, np.int64)] * 19).tolist() == [1] * 19
    # A batch that is not a multiple of sasrec_batch_size scores like the same rows in a full batch.
    np.testing.assert_allclose(trainer.score_all(histories[:3]), scores[:3], atol=1e-6)


def test_score_takes_the_candidate_columns(setup) -> None:
    trainer, test = setup["trainer"], setup["test"]
    examples = [EvalExample(i, c.history, c.target_id, np.array([1, 2, 3], np.int32), c.history.item_ids)
                for i, c in enumerate(test[:5])]
    got = trainer.score(examples)
    full = trainer.score_all([e.history for e in examples])
    assert got.shape == (5, 4) and got.dtype == np.float64
    np.testing.assert_array_equal(got, np.take_along_axis(full, np.stack([e.candidate_ids for e in examples]), 1))


def test_best_epoch_is_restored(setup) -> None:
    trainer = setup["trainer"]
    ndcgs = [e["ndcg@10"] for e in trainer.evals]
    assert [e["epoch"] for e in trainer.evals] == list(range(1, EPOCHS + 1))
    assert trainer.best is trainer.evals[int(np.argmax(ndcgs))]  # the first epoch with the best NDCG@10
    assert trainer.evaluate(setup["valid"])["ndcg@10"] == trainer.best["ndcg@10"]


def test_training_batches(setup) -> None:
    trainer, tc = setup["trainer"], setup["tc"]
    seq, pos, neg, neg_weight = trainer._batch([history(np.arange(1, 16)), history([4, 9])])
    assert seq.shape == pos.shape == (tc.sasrec_batch_size, tc.sasrec_max_len)
    assert seq[0].tolist() == list(range(7, 15)) and pos[0].tolist() == list(range(8, 16))  # the last 9 events
    assert seq[1].tolist() == [0] * 7 + [4] and pos[1].tolist() == [0] * 7 + [9]
    assert not seq[2:].any() and not pos[2:].any()
    assert neg.shape == (tc.sasrec_batch_size, tc.negative_pool) and neg.min() >= 1 and neg.max() <= NUM_ITEMS
    assert neg_weight.shape == (tc.sasrec_batch_size, tc.sasrec_max_len, tc.negative_pool)
    assert (neg_weight.sum(-1) <= tc.num_negatives).all() and neg_weight.min() >= 0  # K draws per position
    assert (neg_weight[pos[:, :, None] == neg[:, None, :]] == 0).all()  # no position draws its own target


def test_seeded_runs_repeat_and_restore_a_chosen_epoch(setup) -> None:
    """Same seed -> the same losses (validation does not perturb training); the parameters of the epoch with
    the best validation NDCG@10 are the ones left at the end."""
    trainer = SASRecTrainer(setup["tc"], NUM_ITEMS, seed=3, progress=lambda _: None)
    scripted = {1: 0.1, 2: 0.3, 3: 0.9, 4: 0.2}
    snapshots: dict[int, dict[str, np.ndarray]] = {}

    def fake_evaluate(cases, ks=(10, 50, 200)):  # records the parameters each epoch ends with
        epoch = len(snapshots) + 1
        snapshots[epoch] = {p.name: p.asnumpy().copy() for p in trainer.net.trainable_params()}
        return {"hr@10": 0.0, "ndcg@10": scripted.get(epoch, 0.5), "mrr": 0.0}

    trainer.evaluate = fake_evaluate
    trainer.fit(setup["train"], setup["valid"][:4], eval_every=1)
    assert trainer.losses == setup["trainer"].losses
    assert trainer.best["epoch"] == 3 and len(trainer.evals) == EPOCHS
    final = {p.name: p.asnumpy() for p in trainer.net.trainable_params()}
    assert final.keys() == snapshots[3].keys()
    for name, value in final.items():
        np.testing.assert_array_equal(value, snapshots[3][name])
    assert any(not np.array_equal(final[n], snapshots[EPOCHS][n]) for n in final)


def test_patience_stops_after_validations_without_a_better_ndcg(setup) -> None:
    trainer = SASRecTrainer(setup["tc"], NUM_ITEMS, seed=3, progress=lambda _: None)
    scripted = iter([0.1, 0.4, 0.3, 0.4, 0.2, 0.9, 0.9, 0.9, 0.9, 0.9])  # best at epoch 2; 0.4 again is no gain
    trainer.evaluate = lambda cases, ks=(10, 50, 200): {"hr@10": 0.0, "ndcg@10": next(scripted), "mrr": 0.0}
    seen: list[tuple[int, bool]] = []
    trainer.fit(setup["train"], setup["valid"][:4], eval_every=1, patience=3,
                after_validation=lambda t, improved: seen.append((t.evals[-1]["epoch"], improved)))
    assert [e["epoch"] for e in trainer.evals] == [1, 2, 3, 4, 5] and trainer.best["epoch"] == 2
    assert seen == [(1, True), (2, True), (3, False), (4, False), (5, False)]
    assert len(trainer.losses) == 5


def test_as_target_accepts_the_evaluation_types() -> None:
    h = history([1, 2])
    expected = NextItemTarget(h, 3)
    assert as_target(expected) is expected
    assert as_target((h, 3)) == expected
    earlier = np.array([9, 1, 2], np.int32)  # the uncapped history the filter reads
    got = as_target(EvalExample(7, h, 3, np.array([5], np.int32), earlier))
    assert got.history is h and got.target_id == 3 and got.earlier_items is earlier
    assert as_target(Target(h, 3, 0, 0)) == expected


def test_dropout_noise(setup) -> None:
    from mindspore import Tensor

    trainer, tc = setup["trainer"], setup["tc"]
    noise = trainer.dropout_noise()
    b, n, d, h = tc.sasrec_batch_size, tc.sasrec_max_len, tc.sasrec_d_model, tc.sasrec_num_heads
    assert [a.shape for a in noise] == [(b, n, d)] + [(b, h, n, n), (b, n, d), (b, n, d), (b, n, d)] * 2
    assert all(a.dtype == np.uint8 for a in noise)
    assert np.mean(np.concatenate([a.ravel() for a in noise]) >= 26) == pytest.approx(230 / 256, abs=0.01)
    # The noise is what turns dropout on: the same batch's loss changes with it (and not without it).
    loss_cell = trainer.step_cell.network
    batch = [Tensor(a) for a in trainer._batch([c.history for c in setup["test"][:4]])]
    plain = [float(loss_cell(*batch).asnumpy()) for _ in range(2)]
    noisy = float(loss_cell(*batch, *(Tensor(a) for a in noise)).asnumpy())
    assert plain[0] == plain[1] and noisy != plain[0]
    zero = SASRecTrainer(load_config(overrides=[*OVERRIDES, "train.sasrec_dropout=0"]).train, NUM_ITEMS)
    assert zero.dropout_noise() == ()


def test_a_temperature_the_sampled_softmax_cannot_take_is_refused(setup) -> None:
    with pytest.raises(ValueError, match="temperature must be >= 0.025"):
        SASRecTrainer(setup["tc"], NUM_ITEMS, temperature=0.01)
