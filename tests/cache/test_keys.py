from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from mindspore_relaygr.cache import CacheKey, prefix_hash
from mindspore_relaygr.history import History


def make_history(n: int = 6, user_features: tuple[int, ...] | None = (3, 1)) -> History:
    feats = None if user_features is None else np.asarray(user_features, np.int32)
    return History(np.arange(1, n + 1, dtype=np.int32), np.arange(n, dtype=np.int32) % 3,
                   1_600_000_000 + 60 * np.arange(n, dtype=np.int64), feats)


def test_hash_is_stable_and_independent_of_input_dtype() -> None:
    h = make_history()
    wide = History(h.item_ids.astype(np.int64), h.action_ids.astype(np.int64), h.timestamps, h.user_features)
    assert prefix_hash(h, 4) == prefix_hash(make_history(), 4) == prefix_hash(wide, 4)
    assert len(prefix_hash(h, 4)) == 32  # 16 bytes, hex
    assert prefix_hash(h, 0) != prefix_hash(h, 4) != prefix_hash(h, 5)


@pytest.mark.parametrize("field", ["item_ids", "action_ids", "timestamps"])
@pytest.mark.parametrize("index", [0, 3])
def test_every_event_field_in_the_prefix_changes_the_key(field: str, index: int) -> None:
    h = make_history()
    arr = getattr(h, field).copy()
    arr[index] += 1
    changed = dataclasses.replace(h, **{field: arr})
    assert CacheKey.for_history("u", "v1", changed, 4) != CacheKey.for_history("u", "v1", h, 4)


def test_user_features_change_the_key() -> None:
    base = prefix_hash(make_history(), 4)
    assert prefix_hash(make_history(user_features=(3, 2)), 4) != base
    assert prefix_hash(make_history(user_features=None), 4) != base
    assert prefix_hash(make_history(user_features=()), 4) != prefix_hash(make_history(user_features=None), 4)


def test_events_after_the_prefix_do_not_change_the_key() -> None:
    h = make_history(6)
    later = History(*(np.concatenate([a[:4], a[4:] + 7]) for a in (h.item_ids, h.action_ids, h.timestamps)),
                    h.user_features)
    assert CacheKey.for_history("u", "v1", later, 4) == CacheKey.for_history("u", "v1", h, 4)
    assert CacheKey.for_history("u", "v1", h.slice(0, 4), 4) == CacheKey.for_history("u", "v1", h, 4)
    assert CacheKey.for_history("u", "v1", later, 5) != CacheKey.for_history("u", "v1", h, 5)


def test_key_fields_and_bad_prefix_len() -> None:
    key = CacheKey.for_history("u7", "v2", make_history(), 3)
    assert (key.user_id, key.model_version, key.prefix_len) == ("u7", "v2", 3)
    assert key != dataclasses.replace(key, user_id="u8") and key != dataclasses.replace(key, model_version="v3")
    with pytest.raises(dataclasses.FrozenInstanceError):
        key.prefix_len = 4  # type: ignore[misc]
    for bad in (-1, 7, 2.0):
        with pytest.raises(ValueError, match=f"num_events={bad!r}"):
            prefix_hash(make_history(), bad)  # type: ignore[arg-type]
