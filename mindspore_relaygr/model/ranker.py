"""`RelayGRModel`: the public face of the ranker (validation, bucketing, graph calls, checkpoints).

Paired paths, as in generative-recommenders: `rank_full` scores from the whole history; `prefill`
caches a prefix's per-layer K/V in a pool slot and `rank_cached` scores from that slot plus the
short-term suffix. Invariant R1: rank_cached(prefill(x)) == rank_full(x) to fp32 tolerance.
Lengths (`start`, `prefix_len`) count events; the optional user token is handled inside.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from mindspore_relaygr.config import RelayGRConfig
from mindspore_relaygr.errors import InvalidRequest
from mindspore_relaygr.model.call_stats import GraphCallStats
from mindspore_relaygr.model.graph_inputs import GRAPHS, check_inputs
from mindspore_relaygr.model.host_arena import HostArena, shared_arena
from mindspore_relaygr.model.inputs import (
    CachedRank,
    History,
    PrefillChunk,
    TokenBatch,
    bucket_for,
    layout_tokens,
    split_timestamps,
    user_offsets,
    validate_candidates,
    validate_history,
)
from mindspore_relaygr.model.pool import EMPTY_TOKENS, PoolLayout, SlotCopy, SlotTokens
from mindspore_relaygr.runtime import configure_context

logger = logging.getLogger(__name__)
WARMUP_REPORT_S = 15.0  # seconds between warm-up progress reports

GRAPH_KINDS = ("full", "prefix", "candidate")


@dataclass(frozen=True)
class _CachedInputs:
    slot: int
    prefix_tok: int  # cached tokens the rank reads (the user token included)
    suffix: History
    cands: np.ndarray


@dataclass(frozen=True)
class _PrefillInputs:
    """A validated prefill chunk: it writes tokens [start_tok, end_tok) of `slot` (user token included)."""

    slot: int
    hist: History
    start: int  # events
    start_tok: int
    end_tok: int
    chunk: int  # its bucket (0: no new token, nothing to write)
    past: int  # the bucket of the slot's tokens it reads (0: it starts the slot)


HistoryLike = Mapping[str, Any] | History


def _sigmoid(x: np.ndarray) -> np.ndarray:
    return (1.0 / (1.0 + np.exp(-x))).astype(np.float32)


class RelayGRModel:
    """HSTU ranker with a full path and a cached-prefix path over a device KV pool."""

    def __init__(self, config: RelayGRConfig) -> None:
        config.model.require_sizes()  # null sizes come from the data: a trained config has them
        configure_context(config.context)
        import mindspore as ms

        from mindspore_relaygr.model.backend import select_backend
        from mindspore_relaygr.model.batched import candidate_batch_graph, prefix_batch_graph
        from mindspore_relaygr.model.network import (
            CandidateGraph,
            FullGraph,
            HSTUNet,
            PrefixGraph,
            SlotReadGraph,
            SlotWriteGraph,
        )
        from mindspore_relaygr.model.pool import KVPool

        self.config = config
        self.cfg = config.model
        ms.set_seed(self.cfg.seed)
        self.layout = PoolLayout.from_config(config.model, config.cache)
        self.net = HSTUNet(self.cfg)
        self.net.set_train(False)
        self.net.assemble_weights()
        self.pool = KVPool(self.layout)
        # One backend for every graph of this model (model/backend.py): plain ops or the fused CPU kernels.
        self.backend = select_backend(self.cfg, config.context.device_target)
        self._graphs = {
            "full": FullGraph(self.net, self.backend),
            "prefix": PrefixGraph(self.net, self.pool, self.backend, with_past=False),
            "extend": PrefixGraph(self.net, self.pool, self.backend, with_past=True),
            "candidate": CandidateGraph(self.net, self.pool, self.backend),
            "candidate_batch": candidate_batch_graph(self.net, self.pool, self.backend),
            "prefix_batch": prefix_batch_graph(self.net, self.pool, self.backend, with_past=False),
            "extend_batch": prefix_batch_graph(self.net, self.pool, self.backend, with_past=True),
            "read_slot": SlotReadGraph(self.pool),
            "write_slot": SlotWriteGraph(self.pool),
        }
        self.prefix_buckets = [b for b in self.cfg.len_buckets if b <= self.layout.slot_len]
        self._user_offsets = user_offsets(self.cfg) if self.cfg.has_user_token else np.zeros(1, np.int32)
        self._user_tokens = 1 if self.cfg.has_user_token else 0
        self._context_action = self.cfg.num_actions
        self._slot_tokens: dict[int, SlotTokens] = {}  # host mirror of each slot's tokens
        self._tensor = ms.Tensor
        self.call_stats = GraphCallStats()
        self.host_arena: HostArena | None = None  # where export_slot puts its copies (else np.empty)

    # ------------------------------------------------------------------ public API
    @property
    def num_slots(self) -> int:
        return self.layout.num_slots

    @property
    def version(self) -> str:
        return self.cfg.version

    def rank_full(self, history: HistoryLike, candidate_ids: Any, logits: bool = False) -> np.ndarray:
        """Scores [M, num_tasks] (probabilities; raw logits with logits=True) of the candidates after the
        whole history."""
        hist = validate_history(self.cfg, history)
        cands = validate_candidates(self.cfg, candidate_ids)
        num_tokens = len(hist) + self._user_tokens
        if num_tokens > self.cfg.max_seq_len:
            raise InvalidRequest("history", f"{len(hist)} events exceed the maximum "
                                            f"{self.cfg.max_seq_len - self._user_tokens}")
        bucket = bucket_for(num_tokens, self.cfg.len_buckets, "history")
        tokens = self._tokens(hist, 0, bucket)
        cand_args = self._candidate_args(cands, num_tokens, self._last_time(hist.timestamps, None))
        last = np.array([max(num_tokens - 1, 0)], np.int32)  # the user-state row (no token at all: padding)
        out = self._call("full", *self._token_args(tokens, hist), *cand_args, last)[: len(cands)]
        return out if logits else _sigmoid(out)

    def prefill(self, slot: int, history: HistoryLike, start: int = 0) -> int:
        """Cache events [start, n) of `history` in `slot`, which must already hold events [0, start).

        Returns the number of events the slot holds afterwards (n).
        """
        q = self._prefill_inputs(slot, history, start)
        self._run_chunks([q])
        return len(q.hist)

    def prefill_batch(self, chunks: Sequence[PrefillChunk]) -> list[int]:
        """`prefill` of several users' chunks in one graph call (model/batched.py, either backend): each chunk is
        cached in its own slot (distinct slots; a slot's first chunk and extensions may mix) exactly as by its
        own `prefill` call, whose event count it returns, in order. The chunks are padded to the largest chunk and
        past buckets among them and to a batch bucket (model.batch_buckets); a single chunk runs the prefix graph."""
        if len(chunks) > self.cfg.batch_buckets[-1]:
            raise InvalidRequest("chunks", f"{len(chunks)} exceed the largest batch bucket "
                                           f"{self.cfg.batch_buckets[-1]}")
        slots = [c.slot for c in chunks]
        if len(set(slots)) != len(slots):
            raise ValueError(f"prefill_batch: slots {slots} repeat; one chunk per slot in a batch")
        prepared = [self._prefill_inputs(c.slot, c.history, c.start) for c in chunks]
        self._run_chunks(prepared)
        return [len(q.hist) for q in prepared]

    def _run_chunks(self, prepared: Sequence[_PrefillInputs]) -> None:
        """Write validated chunks of distinct slots and update their mirrors: one chunk through the prefix (extend)
        graph, several through the batched one, padded to the largest chunk and past buckets among them."""
        todo = [q for q in prepared if q.chunk]  # a chunk of no new token writes nothing
        if not todo:
            return
        chunk, past = max(q.chunk for q in todo), max(q.past for q in todo)
        tokens = [self._tokens(q.hist, q.start, chunk) for q in todo]
        rows = [self._prefill_args(q, t, past) for q, t in zip(todo, tokens, strict=True)]
        if len(rows) == 1:
            self._call("prefix" if past == 0 else "extend", *rows[0])
        else:
            batch = bucket_for(len(rows), self.cfg.batch_buckets, "chunks")
            # Padding users: the first user's inputs, writing scratch rows only (their outputs are dropped).
            rows += [self._prefill_args(todo[0], tokens[0], past, write=False)] * (batch - len(rows))
            self._call("prefix_batch" if past == 0 else "extend_batch",
                       *(np.stack(column) for column in zip(*rows, strict=True)))
        for q, t in zip(todo, tokens, strict=True):
            self._remember(q, t)

    def _prefill_inputs(self, slot: int, history: HistoryLike, start: int) -> _PrefillInputs:
        """Validate a prefill chunk (InvalidRequest naming the field, ValueError for a bad slot)."""
        self.layout.check_slot(slot)
        hist = validate_history(self.cfg, history, "prefix_history")
        if not 0 <= start <= len(hist):
            raise InvalidRequest("start", f"{start} is outside [0, {len(hist)}]")
        start_tok = start + self._user_tokens if start > 0 else 0
        if start > 0 and self.slot_events(slot) < start:
            raise InvalidRequest("start", f"slot {slot} holds {self.slot_events(slot)} events, "
                                          f"cannot extend from {start}")
        end_tok = len(hist) + self._user_tokens
        if end_tok > self.layout.slot_len:
            raise InvalidRequest("prefix_history", f"{len(hist)} events exceed the slot capacity "
                                                   f"{self.layout.slot_len - self._user_tokens}")
        chunk = past = 0
        if end_tok > start_tok:
            chunk = bucket_for(end_tok - start_tok, self.prefix_buckets, "prefix_history")
            past = bucket_for(start_tok, self.prefix_buckets, "start") if start_tok else 0
        return _PrefillInputs(slot, hist, start, start_tok, end_tok, chunk, past)

    def _prefill_args(self, q: _PrefillInputs, tokens: TokenBatch, past: int, write: bool = True) -> tuple:
        """The prefix graph's inputs of one chunk, its past padded to `past` tokens (0: placeholders, the chunk
        starts its slot); write=False: it writes scratch rows only (a padding user, a warm-up call)."""
        bucket = len(tokens.valid)
        write_ids = self.layout.write_ids(q.slot, q.start_tok, tokens.num_valid if write else 0, bucket)
        past_args = self._past_args(q.slot, q.start_tok, past) if past else _no_past()
        return (*self._token_args(tokens, q.hist), *write_ids, *past_args)

    def _remember(self, q: _PrefillInputs, tokens: TokenBatch) -> None:
        """Update the host mirror of q's slot after its chunk is written."""
        new = SlotTokens(tokens.item_ids[:tokens.num_valid], tokens.action_ids[:tokens.num_valid],
                         self._token_times(q.hist)[q.start_tok:])
        self._slot_tokens[q.slot] = self._slot_tokens.get(q.slot, EMPTY_TOKENS).head(q.start_tok).then(new)

    def prefill_steps(self, slot: int, history: HistoryLike, chunk_len: int) -> Iterator[int]:
        """Cache `history` in the empty `slot` in chunks of at most `chunk_len` tokens (`chunk_ends`), each an
        extension of the last. Yields the events cached after each chunk: other device work may run in between
        (a graph call cannot be interrupted, a chunk boundary can)."""
        hist = validate_history(self.cfg, history, "prefix_history")
        start = 0
        for end in self.chunk_ends(len(hist), chunk_len):
            self.prefill(slot, hist.slice(0, end), start=start)
            start = end
            yield end

    def chunk_ends(self, num_events: int, chunk_len: int) -> list[int]:
        """The events cached after each chunk of a prefill of `num_events` events in chunks of at most
        `chunk_len` tokens: the first chunk carries the user token and at least one event."""
        if chunk_len < 1:
            raise ValueError(f"chunk_len={chunk_len!r}: must be >= 1")
        ends, start = [], 0
        while start < num_events:
            first = self._user_tokens if start == 0 else 0
            start = min(num_events, start + max(1, chunk_len - first))
            ends.append(start)
        return ends

    @property
    def batched_ranking(self) -> bool:
        """Whether `rank_cached_batch` runs several users in one graph call (it does, with either backend)."""
        return True

    def rank_cached_batch(self, requests: Sequence[CachedRank], logits: bool = False) -> list[np.ndarray]:
        """`rank_cached` of several users in one graph call (model/batched.py, either backend): each request's
        scores [M_i, num_tasks], in order, equal its own `rank_cached` call. The requests are padded to the
        largest past, suffix and candidate buckets among them and to a batch bucket (model.batch_buckets)."""
        if not requests:
            return []
        if len(requests) > self.cfg.batch_buckets[-1]:
            raise InvalidRequest("requests", f"{len(requests)} exceed the largest batch bucket "
                                             f"{self.cfg.batch_buckets[-1]}")
        prepared = [self._cached_inputs(r.slot, r.prefix_len, r.suffix_history, r.candidate_ids) for r in requests]
        past = max(bucket_for(q.prefix_tok, self.prefix_buckets, "prefix_len") for q in prepared)
        suffix = max(bucket_for(len(q.suffix), self.cfg.suffix_buckets, "suffix_history") for q in prepared)
        cands = max(bucket_for(len(q.cands), self.cfg.candidate_buckets, "candidate_ids") for q in prepared)
        if suffix > self.cfg.attention_block_len:
            raise ValueError(f"a suffix bucket of {suffix} exceeds model.attention_block_len="
                             f"{self.cfg.attention_block_len}: the batched graph runs one query block per user")
        batch = bucket_for(len(prepared), self.cfg.batch_buckets, "requests")
        rows = [self._batched_row(q, past, suffix, cands) for q in prepared]
        rows += [rows[0]] * (batch - len(rows))  # padding users: a copy of the first, its scores dropped
        arrays = [np.stack(column) for column in zip(*rows, strict=True)]
        out = self._call("candidate_batch", *arrays)
        scores = [out[i, : len(q.cands)] for i, q in enumerate(prepared)]
        return scores if logits else [_sigmoid(x) for x in scores]

    def _batched_row(self, q: _CachedInputs, past: int, suffix: int, cands: int) -> tuple[np.ndarray, ...]:
        """One user's inputs of the batched graph, padded to the batch's buckets."""
        tokens = layout_tokens(self.cfg, q.suffix, 0, False, q.prefix_tok, suffix, self._context_action)
        ids, pos, hi, lo = self._candidate_args(q.cands, q.prefix_tok + len(q.suffix), int(q.suffix.timestamps[-1]),
                                                bucket=cands)
        views, time_ids, past_pos, past_valid = self._past_args(q.slot, q.prefix_tok, past)
        return (*self._suffix_args(tokens), views, time_ids, past_pos, past_valid, ids, pos[0], hi[0], lo[0],
                np.int32(len(q.suffix) - 1))

    def rank_cached(self, slot: int, prefix_len: int, suffix_history: HistoryLike,
                    candidate_ids: Any, logits: bool = False) -> np.ndarray:
        """Scores [M, num_tasks] from `slot` (holding `prefix_len` events) + suffix + candidates
        (probabilities; raw logits with logits=True).

        The engage score needs the final state of the history's last event, which a slot does not keep
        (only K/V): with an empty suffix that event is recomputed as a one-event suffix over the rest of the
        slot (the same scores: attention over the past is masked at its length)."""
        q = self._cached_inputs(slot, prefix_len, suffix_history, candidate_ids)
        past_bucket = bucket_for(q.prefix_tok, self.prefix_buckets, "prefix_len")
        suffix_bucket = bucket_for(len(q.suffix), self.cfg.suffix_buckets, "suffix_history")
        tokens = layout_tokens(self.cfg, q.suffix, 0, False, q.prefix_tok, suffix_bucket, self._context_action)
        cand_args = self._candidate_args(q.cands, q.prefix_tok + len(q.suffix), int(q.suffix.timestamps[-1]))
        last = np.array([len(q.suffix) - 1], np.int32)
        out = self._call("candidate", *self._suffix_args(tokens), *self._past_args(slot, q.prefix_tok, past_bucket),
                         *cand_args, last)[: len(q.cands)]
        return out if logits else _sigmoid(out)

    def _cached_inputs(self, slot: int, prefix_len: int, suffix_history: HistoryLike,
                       candidate_ids: Any) -> _CachedInputs:
        """Validate a cached rank; an empty suffix becomes the slot's last event, recomputed over the rest."""
        self.layout.check_slot(slot)
        held = self.slot_events(slot)
        if not isinstance(prefix_len, (int, np.integer)) or not 0 < prefix_len <= held:
            raise InvalidRequest("prefix_len", f"{prefix_len!r} must be in [1, {held}] "
                                               f"(events held by slot {slot})")
        suffix = validate_history(self.cfg, suffix_history, "suffix_history")
        cands = validate_candidates(self.cfg, candidate_ids)
        prefix_tok = prefix_len + self._user_tokens
        if len(suffix) == 0:
            mirror = self._slot_tokens[slot]
            prefix_tok -= 1
            last_event = slice(prefix_tok, prefix_tok + 1)
            suffix = History(mirror.item_ids[last_event], mirror.action_ids[last_event],
                             mirror.timestamps[last_event], suffix.user_features)
        if len(suffix) > self.cfg.max_suffix_len or prefix_tok + len(suffix) > self.cfg.max_seq_len:
            raise InvalidRequest("suffix_history", f"{len(suffix)} events exceed the suffix limit "
                                 f"{min(self.cfg.max_suffix_len, self.cfg.max_seq_len - prefix_tok)}")
        return _CachedInputs(slot, prefix_tok, suffix, cands)

    def slot_events(self, slot: int) -> int:
        """Events cached in `slot` by `prefill` (0 if never written)."""
        held = len(self._slot_tokens.get(slot, EMPTY_TOKENS))
        return max(0, held - self._user_tokens)

    def ensure_host_arena(self, nbytes: int) -> float:
        """Give slot copies (`export_slot`) a pre-touched host arena of at least `nbytes` (the DRAM
        tier's budget), one per process. Returns the seconds spent touching it (0 if it existed)."""
        self.host_arena, seconds = shared_arena(nbytes)
        return seconds

    def _host_empty(self, shape: tuple[int, ...]) -> np.ndarray:
        out = None if self.host_arena is None else self.host_arena.empty(shape)
        return np.empty(shape, np.float32) if out is None else out

    def export_slot(self, slot: int) -> SlotCopy:
        """Copy the valid tokens of `slot` to host memory (the device copy stays)."""
        self.layout.check_slot(slot)
        mirror = self._slot_tokens.get(slot)
        if mirror is None or len(mirror) == 0:
            raise ValueError(f"slot {slot} holds nothing to export")
        count = len(mirror)
        bucket = bucket_for(count, self.prefix_buckets, "slot")
        kv_ids, time_ids = self.layout.read_ids(slot, bucket)
        t0 = time.perf_counter()
        keys, values, hi, lo = self._graphs["read_slot"](self._tensor(kv_ids), self._tensor(time_ids))
        # The gather copies the bucket; host memory keeps only the valid tokens.
        lay = self.layout
        keys = np.stack([k.asnumpy()[:, :count] for k in keys],
                        out=self._host_empty((lay.num_layers, lay.num_heads, count, lay.d_qk)))
        values = np.stack([v.asnumpy()[:, :count] for v in values],
                          out=self._host_empty((lay.num_layers, lay.num_heads, count, lay.d_v)))
        self.call_stats.record("read_slot", [kv_ids.shape, time_ids.shape], (time.perf_counter() - t0) * 1e3)
        return SlotCopy(keys, values, hi.asnumpy()[:count].copy(), lo.asnumpy()[:count].copy(), mirror.copy())

    def import_slot(self, slot: int, copy: SlotCopy) -> None:
        """Write a host copy made by `export_slot` into `slot` (any slot, not only the original)."""
        for _ in self.import_slot_steps(slot, copy):
            pass

    def import_slot_steps(self, slot: int, copy: SlotCopy) -> Iterator[int]:
        """`import_slot` one layer per step (yields the layers written so far, between layers): a
        reload of a long prefix is several graph calls, so other device work can run between them."""
        self.layout.check_slot(slot)
        lay, count = self.layout, copy.num_tokens
        if copy.keys.shape != (lay.num_layers, lay.num_heads, count, lay.d_qk):
            raise ValueError(f"slot copy keys of shape {copy.keys.shape} do not fit this pool")
        bucket = bucket_for(count, self.prefix_buckets, "slot copy")
        pad = ((0, 0), (0, bucket - count), (0, 0))
        kv_ids, time_ids = lay.write_ids(slot, 0, count, bucket)
        kv_ids = kv_ids.reshape(lay.num_layers, -1)
        hi, lo = np.pad(copy.time_hi, (0, bucket - count)), np.pad(copy.time_lo, (0, bucket - count))
        self._slot_tokens.pop(slot, None)  # holds nothing usable until the last layer is written
        for layer in range(lay.num_layers):
            keys = np.pad(copy.keys[layer], pad).reshape(-1, lay.d_qk)
            values = np.pad(copy.values[layer], pad).reshape(-1, lay.d_v)
            self._call("write_slot", kv_ids[layer], time_ids, keys, values, hi, lo)
            if layer < lay.num_layers - 1:
                yield layer + 1
        self._slot_tokens[slot] = copy.tokens.copy()

    def release_slot(self, slot: int) -> None:
        """Forget what `slot` holds (its rows are overwritten by the next prefill)."""
        self._slot_tokens.pop(slot, None)

    def warmup(self, graphs: Sequence[str] = GRAPH_KINDS, max_chunk: int | None = None,
               max_batch: int = 1, max_prefill_batch: int = 1,
               progress: Callable[[str], None] | None = None) -> dict[str, Any]:
        """Compile every bucket of the chosen graphs now, so no request pays for a compile.

        max_chunk: compile prefix graphs (batched ones too) only for chunks up to this many tokens (chunked
        prefill).
        max_batch: with the candidate graph, also compile the batched one for every batch bucket up to the one
        holding this many users (rank_cached_batch; nothing more when 1).
        max_prefill_batch: the same for the prefix graph and prefill_batch.
        progress: told how far the compiles are, every WARMUP_REPORT_S seconds and at the end (a large
        config compiles for minutes).
        """
        unknown = set(graphs) - set(GRAPH_KINDS)
        if unknown:
            raise ValueError(f"graphs={sorted(unknown)}: unknown; choose from {GRAPH_KINDS}")
        t0 = time.perf_counter()
        batched = {"candidate_batch": ("candidate", max_batch, "max_batch"),
                   "prefix_batch": ("prefix", max_prefill_batch, "max_prefill_batch")}
        top_batch = {kind: bucket_for(n, self.cfg.batch_buckets, name) for kind, (_, n, name) in batched.items()}
        kinds = [*graphs] + [kind for kind, (single, n, _) in batched.items() if single in graphs and n > 1]
        todo = [(kind, shape) for kind in kinds for shape in self.graph_shapes(kind)
                if not (kind in ("prefix", "prefix_batch") and max_chunk is not None and shape[-1] > max_chunk)
                and not (kind in top_batch and shape[0] > top_batch[kind])]
        total = len(todo) + (2 * len(self.prefix_buckets) if "prefix" in graphs else 0)
        reported = t0
        for done, (kind, shape) in enumerate(todo, 1):
            self._run_dummy(kind, shape)
            now = time.perf_counter()
            logger.info("warm-up: graph %d of %d compiled (%s %s), %.1f s", done, total, kind, shape, now - t0)
            if progress is not None and now - reported >= WARMUP_REPORT_S:
                progress(f"warm-up: {done} of {total} graph shapes compiled ({kind} {shape}), {now - t0:.0f} s")
                reported = now
        count = len(todo)
        if "prefix" in graphs:
            count += self._warm_slot_copies()
            logger.info("warm-up: graph %d of %d compiled (slot copies), %.1f s", count, total,
                        time.perf_counter() - t0)
        seconds = time.perf_counter() - t0
        self.call_stats.mark_warm()
        logger.info("warm-up compiled %d graph shapes in %.1f s", count, seconds)
        if progress is not None:
            progress(f"warm-up: {count} graph shapes compiled in {seconds:.0f} s")
        return {"graphs": count, "seconds": seconds}

    def _warm_slot_copies(self) -> int:
        """Compile the spill (export) and reload (import) copies of every prefix bucket on slot 0.

        Runs before any request: slot 0 is overwritten with zeros, then released."""
        lay = self.layout
        for tokens in self.prefix_buckets:
            zeros = SlotCopy(np.zeros((lay.num_layers, lay.num_heads, tokens, lay.d_qk), np.float32),
                             np.zeros((lay.num_layers, lay.num_heads, tokens, lay.d_v), np.float32),
                             np.zeros(tokens, np.float32), np.zeros(tokens, np.float32),
                             SlotTokens(np.zeros(tokens, np.int32), np.zeros(tokens, np.int32),
                                        np.zeros(tokens, np.int64)))
            self.import_slot(0, zeros)
            self.export_slot(0)
        self.release_slot(0)
        return 2 * len(self.prefix_buckets)

    def graph_shapes(self, kind: str) -> list[tuple[int, ...]]:
        """Static shapes a graph kind is compiled for: (tokens, candidates), (past, chunk), ..."""
        cfg, pb = self.cfg, self.prefix_buckets
        if kind == "full":
            return [(n, m) for n in cfg.len_buckets for m in cfg.candidate_buckets]
        if kind == "prefix":
            prev = dict(zip(pb, [0] + pb[:-1], strict=True))
            # (0, chunk) starts a slot; (past, chunk) extends one if both can hold >= 1 new token.
            # The largest past bucket counts too: a chunk starting at 3584 tokens reads a 4096 past.
            return [(0, c) for c in pb] + [(p, c) for p in pb for c in pb
                                           if prev[p] + 1 + prev[c] + 1 <= self.layout.slot_len]
        if kind == "candidate":
            return [(p, s, m) for p in pb for s in cfg.suffix_buckets for m in cfg.candidate_buckets]
        if kind == "candidate_batch":  # (users, past, suffix, candidates); one user runs the candidate graph
            return [(b, *shape) for b in cfg.batch_buckets if b > 1 for shape in self.graph_shapes("candidate")]
        if kind == "prefix_batch":  # (users, past, chunk): one user's past bucket meets another's chunk bucket
            return [(b, p, c) for b in cfg.batch_buckets if b > 1 for p in [0, *pb] for c in pb]
        raise ValueError(f"kind={kind!r}: unknown graph kind")

    def save_checkpoint(self, path: str | Path) -> None:
        import mindspore as ms

        from mindspore_relaygr.model.hstu import ASSEMBLED

        ms.save_checkpoint(self.net, str(path), choice_func=lambda name: not name.endswith(ASSEMBLED))

    def load_checkpoint(self, path: str | Path) -> None:
        """Load weights saved by `save_checkpoint`; every network parameter must be present."""
        import mindspore as ms

        from mindspore_relaygr.model.hstu import ASSEMBLED

        params = ms.load_checkpoint(str(path))
        missing, _ = ms.load_param_into_net(self.net, params, strict_load=True)
        missing = [name for name in missing if not name.endswith(ASSEMBLED)]
        if missing:
            raise ValueError(f"checkpoint {path} lacks parameters {missing[:5]}")
        self.net.assemble_weights()

    def refresh_weights(self) -> None:
        """Call after changing `net`'s parameters in place (training steps, set_data): the inference graphs
        read an assembled copy of each layer's W1 (`HSTULayer.assemble_weights`)."""
        self.net.assemble_weights()

    # ------------------------------------------------------------------ internals
    def _call(self, kind: str, *arrays: np.ndarray) -> np.ndarray:
        if kind in GRAPHS:
            check_inputs(kind, arrays, self.backend.reads_views)
        t0 = time.perf_counter()
        out = self._graphs[kind](*(self._tensor(a) for a in arrays)).asnumpy()
        self.call_stats.record(kind, [a.shape for a in arrays], (time.perf_counter() - t0) * 1e3)
        return out

    def _token_times(self, hist: History) -> np.ndarray:
        head = hist.timestamps[:1] if len(hist) else np.zeros(1, np.int64)
        return np.concatenate([head, hist.timestamps]) if self._user_tokens else hist.timestamps

    def _tokens(self, hist: History, start: int, bucket: int) -> TokenBatch:
        with_user = self._user_tokens == 1 and start == 0
        first_pos = start + self._user_tokens if start > 0 else 0
        return layout_tokens(self.cfg, hist, start, with_user, first_pos, bucket, self._context_action)

    def _token_args(self, tokens: TokenBatch, hist: History) -> tuple[np.ndarray, ...]:
        feats = self._user_offsets
        if hist.user_features is not None:
            feats = (hist.user_features + self._user_offsets).astype(np.int32)
        return (tokens.item_ids, tokens.action_ids, feats, tokens.user_row, tokens.positions,
                tokens.times[:, 0].copy(), tokens.times[:, 1].copy(), tokens.valid)

    @staticmethod
    def _suffix_args(tokens: TokenBatch) -> tuple[np.ndarray, ...]:
        return (tokens.item_ids, tokens.action_ids, tokens.positions, tokens.times[:, 0].copy(),
                tokens.times[:, 1].copy(), tokens.valid)

    def _past_args(self, slot: int, num_tokens: int, bucket: int) -> tuple[np.ndarray, ...]:
        if self.backend.reads_views:  # the graphs read the slot in place: they need only its views
            kv, time_ids = self.layout.read_views(slot), self.layout.read_time_ids(slot, bucket)
        else:
            kv, time_ids = self.layout.read_ids(slot, bucket)
        return kv, time_ids, np.arange(bucket, dtype=np.int32), np.arange(bucket) < num_tokens

    def _candidate_args(self, cands: np.ndarray, position: int, last_time: int,
                        bucket: int | None = None) -> tuple[np.ndarray, ...]:
        """Padded candidate ids (to `bucket`, default the smallest that fits) and the one (position, time) all
        candidates share."""
        bucket = bucket or bucket_for(len(cands), self.cfg.candidate_buckets, "candidate_ids")
        ids = np.pad(cands, (0, bucket - len(cands)), constant_values=cands[0]).astype(np.int32)
        hi, lo = split_timestamps(np.array([last_time]))[0]
        return ids, np.array([position], np.int32), np.array([hi], np.float32), np.array([lo], np.float32)

    @staticmethod
    def _last_time(timestamps: np.ndarray, fallback: Any) -> int:
        if len(timestamps):
            return int(timestamps[-1])
        return int(fallback) if fallback is not None else 0

    def _run_dummy(self, kind: str, shape: tuple[int, ...]) -> None:
        """Call a graph once with all-padding inputs; writes go to the scratch rows only."""
        cfg = self.cfg
        hist = History(np.ones(1, np.int32), np.zeros(1, np.int32), np.zeros(1, np.int64),
                       np.zeros(len(cfg.user_feature_sizes), np.int32) if cfg.has_user_token else None)
        if kind == "full":
            n, m = shape
            cand = self._candidate_args(np.ones(m, np.int32), 1, 0)
            self._call("full", *self._token_args(self._tokens(hist, 0, n), hist), *cand, np.zeros(1, np.int32))
        elif kind in ("prefix", "prefix_batch"):
            *users, past, chunk = shape
            q = _PrefillInputs(0, hist, 0, 0, 0, chunk, past)  # writes scratch rows only
            row = self._prefill_args(q, self._tokens(hist, 0, chunk), past, write=False)
            graph = "prefix" if past == 0 else "extend"
            if users:
                self._call(f"{graph}_batch", *(np.stack([a] * users[0]) for a in row))
            else:
                self._call(graph, *row)
        elif kind == "candidate":
            past, suffix, m = shape
            tokens = self._tokens(hist, 0, suffix)
            cand = self._candidate_args(np.ones(m, np.int32), 1, 0)
            self._call("candidate", *self._suffix_args(tokens), *self._past_args(0, 0, past), *cand,
                       np.zeros(1, np.int32))
        else:
            users, past, suffix, m = shape
            ids, pos, hi, lo = self._candidate_args(np.ones(m, np.int32), 1, 0)
            row = (*self._suffix_args(self._tokens(hist, 0, suffix)), *self._past_args(0, 0, past), ids, pos[0],
                   hi[0], lo[0], np.int32(0))
            self._call("candidate_batch", *(np.stack([a] * users) for a in row))


def _no_past() -> tuple[np.ndarray, ...]:
    """Placeholder past inputs of the prefix graph that starts a slot (never read)."""
    return np.zeros(1, np.int32), np.zeros(1, np.int32), np.zeros(1, np.int32), np.zeros(1, np.bool_)
