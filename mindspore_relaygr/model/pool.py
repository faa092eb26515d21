"""Device KV pool: head-major K and V rows plus token timestamps, in three flat Parameters.

K row id of (slot s, layer l, head g, token t) = ((s * L + l) * H + g) * slot_len + t, so reading
the first P tokens of a slot yields [L, H, P, d] directly (no transpose on the ranking path).
Timestamps are one (hi, lo) row per token: row id = s * slot_len + t. After the last slot a
scratch region of one slot receives the padded rows of a bucketed write, so the row ids of a chunk
are distinct and no mask is needed (in a batched prefill, padding rows of different users may share a
scratch row: nothing reads them). Reads gather and writes scatter exactly the rows asked for: the
cost of either does not depend on the number of slots.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from mindspore import Parameter, Tensor, nn, ops
from mindspore import dtype as mstype
from mindspore.common.initializer import initializer

from mindspore_relaygr.config import CacheConfig, ModelConfig

FLOAT_BYTES = 4
TIME_COLUMNS = 2


@dataclass(frozen=True)
class PoolLayout:
    """Geometry of the pool and its row ids; plain numpy, shared by graphs and bookkeeping."""

    num_slots: int
    slot_len: int  # tokens per slot
    num_layers: int
    num_heads: int
    d_qk: int
    d_v: int

    @classmethod
    def from_config(cls, model: ModelConfig, cache: CacheConfig) -> PoolLayout:
        probe = cls(1, cache.max_prefix_len, model.num_layers, model.num_heads, model.d_qk, model.d_v)
        num_slots = cache.num_slots
        if num_slots is None:
            num_slots = int(cache.pool_bytes // probe.slot_bytes) - 1  # scratch costs one slot
            if num_slots < 1:
                raise ValueError(f"cache.pool_bytes={cache.pool_bytes:g} holds no slot of "
                                 f"{probe.slot_bytes} bytes (plus one scratch slot)")
        return cls(num_slots, cache.max_prefix_len, model.num_layers, model.num_heads, model.d_qk, model.d_v)

    @property
    def token_bytes(self) -> int:
        """Device bytes of one cached token (all layers' K and V, and its timestamp)."""
        return (self.num_layers * self.num_heads * (self.d_qk + self.d_v) + TIME_COLUMNS) * FLOAT_BYTES

    @property
    def slot_bytes(self) -> int:
        return self.token_bytes * self.slot_len

    @property
    def pool_bytes(self) -> int:
        return self.slot_bytes * (self.num_slots + 1)

    @property
    def kv_rows(self) -> int:
        return (self.num_slots + 1) * self.num_layers * self.num_heads * self.slot_len

    @property
    def time_rows(self) -> int:
        return (self.num_slots + 1) * self.slot_len

    def check_slot(self, slot: int) -> None:
        if isinstance(slot, bool) or not isinstance(slot, (int, np.integer)) or not 0 <= slot < self.num_slots:
            raise ValueError(f"slot={slot!r}: must be an int in [0, {self.num_slots})")

    def _kv_base(self, slot: int) -> np.ndarray:
        """Row id of token 0 of every (layer, head) of `slot`: [L, H, 1]."""
        lh = np.arange(self.num_layers * self.num_heads).reshape(self.num_layers, self.num_heads, 1)
        return (slot * self.num_layers * self.num_heads + lh) * self.slot_len

    def read_ids(self, slot: int, bucket: int) -> tuple[np.ndarray, np.ndarray]:
        """(K/V row ids [L*H*bucket], time row ids [bucket]) of the first `bucket` tokens."""
        kv = (self._kv_base(slot) + np.arange(bucket)).reshape(-1)
        return kv.astype(np.int32), self.read_time_ids(slot, bucket)

    def read_time_ids(self, slot: int, bucket: int) -> np.ndarray:
        """Time row ids [bucket] of the first `bucket` tokens of `slot`."""
        return (slot * self.slot_len + np.arange(bucket)).astype(np.int32)

    def read_views(self, slot: int) -> np.ndarray:
        """The fused attention kernel's views of `slot`: int64 [L * 8], per layer the K view then the V view, each
        (offset of head 0 token 0, head stride, row stride, width) in elements of the K / V pool."""
        first = self._kv_base(slot)[:, 0, 0]  # row of head 0, token 0 of each layer
        views = np.empty((self.num_layers, 2, 4), np.int64)
        views[:, 0] = np.stack([first * self.d_qk, np.full_like(first, self.slot_len * self.d_qk),
                                np.full_like(first, self.d_qk), np.full_like(first, self.d_qk)], axis=1)
        views[:, 1] = np.stack([first * self.d_v, np.full_like(first, self.slot_len * self.d_v),
                                np.full_like(first, self.d_v), np.full_like(first, self.d_v)], axis=1)
        return views.reshape(-1)

    def write_ids(self, slot: int, start: int, count: int, bucket: int) -> tuple[np.ndarray, np.ndarray]:
        """Row ids for tokens [start, start+count) of `slot`, padded to `bucket` with scratch rows."""
        if start < 0 or count < 0 or start + count > self.slot_len or count > bucket or bucket > self.slot_len:
            raise ValueError(f"write of tokens [{start}, {start + count}) in a bucket of {bucket} "
                             f"does not fit a slot of {self.slot_len} tokens")
        t = np.arange(bucket)
        kv = self._kv_base(self.num_slots) + t  # scratch rows, one distinct row per padded token
        kv[:, :, :count] = self._kv_base(slot) + start + t[:count]
        times = self.num_slots * self.slot_len + t
        times[:count] = slot * self.slot_len + start + t[:count]
        return kv.reshape(-1).astype(np.int32), times.astype(np.int32)


@dataclass(frozen=True)
class SlotTokens:
    """Host mirror of the tokens a slot holds (user token included, oldest first): their timestamps, and
    the item and action ids a rank needs to recompute the last one (see RelayGRModel.rank_cached)."""

    item_ids: np.ndarray  # int32 [T]
    action_ids: np.ndarray  # int32 [T]
    timestamps: np.ndarray  # int64 [T]

    def __len__(self) -> int:
        return int(self.timestamps.shape[0])

    def head(self, count: int) -> SlotTokens:
        return SlotTokens(self.item_ids[:count], self.action_ids[:count], self.timestamps[:count])

    def then(self, more: SlotTokens) -> SlotTokens:
        """These tokens followed by `more`."""
        return SlotTokens(*(np.concatenate([a, b]) for a, b in zip(
            (self.item_ids, self.action_ids, self.timestamps), (more.item_ids, more.action_ids, more.timestamps),
            strict=True)))

    def copy(self) -> SlotTokens:
        return SlotTokens(self.item_ids.copy(), self.action_ids.copy(), self.timestamps.copy())

    @property
    def nbytes(self) -> int:
        return self.item_ids.nbytes + self.action_ids.nbytes + self.timestamps.nbytes


EMPTY_TOKENS = SlotTokens(np.zeros(0, np.int32), np.zeros(0, np.int32), np.zeros(0, np.int64))


@dataclass(frozen=True)
class SlotCopy:
    """Host copy of the valid tokens of one slot: what the DRAM tier keeps."""

    keys: np.ndarray  # float32 [L, H, T, d_qk]
    values: np.ndarray  # float32 [L, H, T, d_v]
    time_hi: np.ndarray  # float32 [T]
    time_lo: np.ndarray  # float32 [T]
    tokens: SlotTokens  # the host mirror of the tokens

    @property
    def timestamps(self) -> np.ndarray:
        return self.tokens.timestamps

    @property
    def num_tokens(self) -> int:
        return len(self.tokens)

    @property
    def nbytes(self) -> int:
        return sum(a.nbytes for a in (self.keys, self.values, self.time_hi, self.time_lo)) + self.tokens.nbytes


class KVPool(nn.Cell):
    """The pool Parameters and their in-place read/write, used inside the compiled graphs."""

    def __init__(self, layout: PoolLayout) -> None:
        super().__init__()
        self.layout = layout

        def zeros(name: str, shape: tuple[int, int]) -> Parameter:
            # initializer() is lazy: no host-side copy of the pool is ever made.
            return Parameter(initializer("zeros", shape, mstype.float32), name=name, requires_grad=False)

        self.keys = zeros("kv_pool_keys", (layout.kv_rows, layout.d_qk))
        self.values = zeros("kv_pool_values", (layout.kv_rows, layout.d_v))
        self.time_hi = Parameter(initializer("zeros", (layout.time_rows,), mstype.float32),
                                 name="kv_pool_time_hi", requires_grad=False)
        self.time_lo = Parameter(initializer("zeros", (layout.time_rows,), mstype.float32),
                                 name="kv_pool_time_lo", requires_grad=False)

    def read(self, kv_ids: Tensor, time_ids: Tensor) -> tuple[tuple, tuple, Tensor, Tensor]:
        """-> (K [H, P, d_qk] per layer), (V [H, P, d_v] per layer), time hi [P], time lo [P].

        One gather per layer and tensor kind: the result is used in place, never sliced again.
        """
        lay = self.layout
        per_layer = kv_ids.shape[0] // lay.num_layers
        keys, values = (), ()
        for layer in range(lay.num_layers):
            ids = ops.slice(kv_ids, (layer * per_layer,), (per_layer,))
            keys += (ops.reshape(ops.gather(self.keys, ids, 0), (lay.num_heads, -1, lay.d_qk)),)
            values += (ops.reshape(ops.gather(self.values, ids, 0), (lay.num_heads, -1, lay.d_v)),)
        return (keys, values) + self.read_times(time_ids)

    def layer_views(self, views: Tensor) -> tuple:
        """Per layer (keys, K at, values, V at): the slot's K/V read in place by the fused attention kernel
        (FusedCpuOps.read_past).

        `views` is PoolLayout.read_views(slot) (computed on the host: the graph only slices it), so no gather
        copies the cached K/V and no ops build the view offsets.
        """
        out = ()
        for layer in range(self.layout.num_layers):
            out += ((self.keys, ops.slice(views, (8 * layer,), (4,)),
                     self.values, ops.slice(views, (8 * layer + 4,), (4,))),)
        return out

    def read_times(self, time_ids: Tensor) -> tuple[Tensor, Tensor]:
        """Timestamps (hi [P], lo [P]) of a slot's first P tokens."""
        return ops.gather(self.time_hi, time_ids, 0), ops.gather(self.time_lo, time_ids, 0)

    def write(self, kv_ids: Tensor, time_ids: Tensor, keys: Tensor, values: Tensor, hi: Tensor,
              lo: Tensor) -> Tensor:
        """Scatter K/V [L*H*C, d] and times [C] in place (scatter_update: the pool is not copied)."""
        return self.with_times(ops.scatter_update(self.keys, kv_ids, keys),
                               ops.scatter_update(self.values, kv_ids, values), time_ids, hi, lo)

    def with_times(self, keys_done: Tensor, values_done: Tensor, time_ids: Tensor, hi: Tensor, lo: Tensor) -> Tensor:
        """Scatter the times of a K/V write (keys_done, values_done: its results); the result depends on all four
        writes."""
        done = (ops.scatter_update(self.time_hi, time_ids, hi), ops.scatter_update(self.time_lo, time_ids, lo))
        return ops.depend(ops.depend(ops.depend(keys_done, values_done), done[0]), done[1])
