"""The request history type: a user's validated behaviour events (plain numpy).

Shared by the cache (which hashes prefixes of it) and the model (which turns it into tokens); neither
owns it, so neither imports the other for it.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class History:
    """A validated behaviour history: equal-length int arrays, oldest event first."""

    item_ids: np.ndarray  # int32 [n]
    action_ids: np.ndarray  # int32 [n]
    timestamps: np.ndarray  # int64 [n], unix seconds
    user_features: np.ndarray | None = None  # int32 [num user features]
    labels: np.ndarray | None = None  # bool [n], the second task's label of each event (training data only)

    def __len__(self) -> int:
        return int(self.item_ids.shape[0])

    def slice(self, start: int, stop: int | None = None) -> History:
        """Events [start, stop); the user features stay with the history."""
        sl = slice(start, stop)
        return History(self.item_ids[sl], self.action_ids[sl], self.timestamps[sl], self.user_features,
                       None if self.labels is None else self.labels[sl])
