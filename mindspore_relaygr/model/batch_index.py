"""Host-side (numpy) relative-bias bucket indices for the batched training graph (`model.batch_forward`)."""

from __future__ import annotations

import numpy as np

from mindspore_relaygr.config import ModelConfig
from mindspore_relaygr.model.hstu import position_buckets, time_thresholds
from mindspore_relaygr.model.inputs import TIME_HI_UNIT


class RabIndex:
    """Host-side bucket index of (query, key) pairs, the numpy twin of `RelativeBias.index` (fp32 time
    differences as the graphs compute them, so buckets agree bit-wise)."""

    def __init__(self, cfg: ModelConfig) -> None:
        self.pos_lut = position_buckets(cfg.num_pos_buckets, cfg.max_seq_len)
        self.thresholds = time_thresholds(cfg.num_time_buckets, cfg.time_bucket_scale)
        self.num_pos = cfg.num_pos_buckets
        self.mask_index = cfg.num_pos_buckets * cfg.num_time_buckets

    def __call__(self, q_pos: np.ndarray, q_time: np.ndarray, k_pos: np.ndarray, k_time: np.ndarray,
                 visible: np.ndarray) -> np.ndarray:
        """int32 [Q, K]: q_pos [Q], q_time [Q, 2] (hi, lo float32), likewise the keys; visible [Q, K] bool."""
        rel = np.clip(q_pos[:, None] - k_pos[None, :], 0, len(self.pos_lut) - 1)
        hi = q_time[:, None, 0] - k_time[None, :, 0]
        lo = q_time[:, None, 1] - k_time[None, :, 1]
        dt = np.abs(hi * np.float32(TIME_HI_UNIT) + lo).astype(np.float32)
        idx = np.searchsorted(self.thresholds, dt, side="right") * self.num_pos + self.pos_lut[rel]
        return np.where(visible, idx, self.mask_index).astype(np.int32)
