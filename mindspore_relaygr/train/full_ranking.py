"""Full-ranking evaluation (the generative-recommenders protocol): the target among all items.

For each evaluated user: the history (the most recent `max_history_len` events before the target) is scored
against every item id, the earlier items a fixed rule names (`eval_filter`; validation uses the reference
rule: those of the 200 most recent events, whatever the model reads) are removed from the ranking (the target
never is), and the target's 1-based rank gives HR@K / NDCG@K / MRR (`train.metrics`). Our ranker scores items
as candidates (M-FALCON) in chunks of the largest candidate bucket, through the full path or the relay path.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from mindspore_relaygr.config import ModelConfig
from mindspore_relaygr.data.sequences import Target, cap_history
from mindspore_relaygr.model.batch_index import RabIndex
from mindspore_relaygr.model.inputs import History
from mindspore_relaygr.train.batches import FORWARD_FIELDS, history_bucket, ranking_row
from mindspore_relaygr.train.eval_filter import REFERENCE_FILTER, HistoryFilter
from mindspore_relaygr.train.metrics import full_ranking_ranks, ranking_metrics_at, standard_errors_at

KS = (10, 50, 200)
ENGAGE = 0
Progress = Callable[[str], None]


@dataclass(frozen=True)
class RankingCase:
    """One user's full-ranking task."""

    user_id: int
    history: History  # what the model reads: the events before the target, capped
    target_id: int
    earlier_items: np.ndarray  # item ids of every event before the target (uncapped): what a filter reads

    def excluded(self, history_filter: HistoryFilter) -> np.ndarray:
        """The item ids `history_filter` removes from this case's ranking."""
        return history_filter.excluded(self.earlier_items)


def ranking_cases(targets: Mapping[int, Target], max_len: int, max_users: int | None = None) -> list[RankingCase]:
    """Cases for the `targets` of a split (ascending user id; the first `max_users` when given), each history
    capped to `max_len` events; the filter still sees every earlier event."""
    cases = [RankingCase(uid, cap_history(targets[uid].history, max_len), targets[uid].item_id,
                         targets[uid].history.item_ids) for uid in sorted(targets)]
    return cases if max_users is None else cases[:max_users]


def item_chunks(num_items: int, chunk: int) -> list[np.ndarray]:
    """Item ids 1..num_items in consecutive chunks of at most `chunk`."""
    ids = np.arange(1, num_items + 1, dtype=np.int32)
    return [ids[s:s + chunk] for s in range(0, num_items, chunk)]


def full_path_logits(model: Any, history: History, chunks: Sequence[np.ndarray]) -> np.ndarray:
    """Engage logits [num_items + 1] of every item (column 0 = padding, -inf) through `rank_full`."""
    out = np.full(sum(len(c) for c in chunks) + 1, -np.inf, np.float32)
    for ids in chunks:
        out[ids] = model.rank_full(history, ids, logits=True)[:, ENGAGE]
    return out


def relay_path_logits(model: Any, history: History, chunks: Sequence[np.ndarray], suffix_len: int,
                      slot: int = 0) -> np.ndarray:
    """As `full_path_logits` through the relay path: prefill all but the last `suffix_len` events once,
    then `rank_cached` every chunk with those events as the short-term suffix."""
    keep = max(1, len(history) - suffix_len)
    model.prefill(slot, history.slice(0, keep))
    out = np.full(sum(len(c) for c in chunks) + 1, -np.inf, np.float32)
    try:
        for ids in chunks:
            out[ids] = model.rank_cached(slot, keep, history.slice(keep), ids, logits=True)[:, ENGAGE]
    finally:
        model.release_slot(slot)
    return out


class BatchedScorer:
    """Engage logits of every item for many histories at once through the batched training forward
    (dropout off): `batch_size` users per graph call, grouped by length bucket. The engage logit of an item
    is the cosine of the history's user state (the last token's final state) with the item's embedding over
    the temperature, as `rank_full` computes it (tests compare them); far fewer graph calls. Used to validate
    during training."""

    def __init__(self, net: Any, cfg: ModelConfig, num_items: int, batch_size: int = 32) -> None:
        from mindspore import nn, ops

        from mindspore_relaygr.model.batch_forward import BatchForward

        self.cfg, self.batch_size, self.rab = cfg, batch_size, RabIndex(cfg)
        self.no_candidates = np.zeros(0, np.int32)
        forward = BatchForward(net, 0.0)

        class ScoreAll(nn.Cell):
            def __init__(self) -> None:
                super().__init__(auto_prefix=False)
                self.forward, self.net = forward, net

            def construct(self, item_ids, action_ids, pos, user_feats, user_row, valid, hist_idx, cand_idx, last):
                hidden = self.forward(item_ids, action_ids, pos, user_feats, user_row, valid, hist_idx, cand_idx)
                b, n, d = hidden.shape
                user = ops.gather(ops.reshape(hidden, (b * n, d)), last, 0)  # [B, d]: rows b * n + last_b
                items = ops.slice(self.net.item_table, (1, 0), (num_items, d))
                return self.net.engage_matrix(user, items)  # [B, num_items]

        self.cell = ScoreAll()
        self.cell.set_train(False)

    def ranks(self, cases: Sequence[RankingCase], history_filter: HistoryFilter = REFERENCE_FILTER) -> np.ndarray:
        """1-based full-ranking ranks of every case's target, the items `history_filter` names removed."""
        return self.ranks_by_filter(cases, (history_filter,))[history_filter.name]

    def ranks_by_filter(self, cases: Sequence[RankingCase],
                        filters: Sequence[HistoryFilter]) -> dict[str, np.ndarray]:
        """`ranks` under every filter (filter name -> ranks), the scores computed once."""
        from mindspore import Tensor

        by_bucket: dict[int, list[int]] = {}
        for i, case in enumerate(cases):
            by_bucket.setdefault(history_bucket(self.cfg, len(case.history)), []).append(i)
        ranks = {f.name: np.zeros(len(cases), np.int64) for f in filters}
        for bucket, members in sorted(by_bucket.items()):
            for s in range(0, len(members), self.batch_size):
                chunk = members[s:s + self.batch_size]
                rows = [ranking_row(self.cfg, cases[i].history, bucket, self.no_candidates, self.rab) for i in chunk]
                rows += [rows[-1]] * (self.batch_size - len(rows))  # a full batch: one graph shape per bucket
                arrays = [Tensor(np.stack([r[k] for r in rows])) for k in FORWARD_FIELDS]
                last = np.array([i * bucket + int(r["valid"].sum()) - 1 for i, r in enumerate(rows)], np.int32)
                logits = self.cell(*arrays, Tensor(last)).asnumpy()[: len(chunk)]
                scores = np.concatenate([np.full((len(chunk), 1), -np.inf, np.float32), logits], axis=1)
                for f in filters:
                    ranks[f.name][chunk] = batch_ranks(scores, [cases[i] for i in chunk], f)
        return ranks


def batch_ranks(scores: np.ndarray, cases: Sequence[RankingCase], history_filter: HistoryFilter) -> np.ndarray:
    """Ranks for precomputed scores [B, num_items + 1] (one row per case), `history_filter`'s items removed."""
    return full_ranking_ranks(scores, np.array([c.target_id for c in cases]),
                              [c.excluded(history_filter) for c in cases])


def metrics_of(ranks: np.ndarray) -> dict[str, Any]:
    """HR@K, NDCG@K (K in 10, 50, 200) and MRR of 1-based ranks, the number of users, and each metric's
    standard error over those users under "se"."""
    return {**ranking_metrics_at(ranks, KS), "users": int(len(ranks)), "se": standard_errors_at(ranks, KS)}
