"""Which of a user's earlier items a full-ranking evaluation removes from the ranking: a fixed, stated rule.

A recommender is not asked to recommend what the user already consumed, so the full-ranking protocol removes
earlier items from the ranking (the target itself is always ranked). How many earlier items are removed moves
the metrics a lot (on ML-1M, not filtering at all costs a third of HR@10), so the rule must not depend on the
model: an evaluation that removes the items of "the model's L most recent events" filters more for a longer
model and credits it with the difference. The rules here look only at the user's events before the target:

- `recent200`: the items of the 200 most recent earlier events (the generative-recommenders reference,
  whose models read 200 events; the rule for every comparison with its published table); any `recentN`;
- `all`: every earlier item;
- `none`: nothing removed.

A serving cap or a model's history length changes what the model reads, never what the rule removes.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np

_RECENT = re.compile(r"recent([1-9][0-9]*)")


@dataclass(frozen=True)
class HistoryFilter:
    """Remove the items of the `recent` most recent earlier events (None: every earlier item; 0: none)."""

    recent: int | None

    def __post_init__(self) -> None:
        if self.recent is not None and self.recent < 0:
            raise ValueError(f"recent must be >= 0 or None, got {self.recent}")

    @property
    def name(self) -> str:
        """The rule as `relaygr eval --filter` spells it: recent200, all or none."""
        if self.recent is None:
            return "all"
        return "none" if self.recent == 0 else f"recent{self.recent}"

    @property
    def rule(self) -> str:
        """The rule in words (written next to the metrics in every result JSON)."""
        if self.recent is None:
            return "every item of the user's events before the target removed from the ranking"
        if self.recent == 0:
            return "no item removed from the ranking"
        return f"the items of the user's {self.recent} most recent events before the target removed from the ranking"

    def excluded(self, earlier_items: np.ndarray) -> np.ndarray:
        """The item ids this rule removes, from the item ids of every earlier event (oldest first)."""
        items = np.asarray(earlier_items)
        if self.recent is None:
            return items
        return items[max(0, len(items) - self.recent):]


REFERENCE_FILTER = HistoryFilter(200)
EVERY_EARLIER_ITEM = HistoryFilter(None)
DEFAULT_FILTERS = (REFERENCE_FILTER, EVERY_EARLIER_ITEM)


def parse_filter(text: str) -> HistoryFilter:
    """`recentN` (N >= 1), `all` or `none`; ValueError naming the accepted forms otherwise."""
    value = text.strip().lower()
    if value == "all":
        return EVERY_EARLIER_ITEM
    if value == "none":
        return HistoryFilter(0)
    match = _RECENT.fullmatch(value)
    if match is None:
        raise ValueError(f"filter {text!r}: expected recentN (e.g. recent200, the reference rule), all or none")
    return HistoryFilter(int(match.group(1)))


def check_filters(filters: tuple[HistoryFilter, ...] | list[HistoryFilter]) -> tuple[HistoryFilter, ...]:
    """At least one filter and no name twice (the first is the one a single-number summary uses)."""
    names = [f.name for f in filters]
    if not names:
        raise ValueError("at least one filter is needed")
    if len(set(names)) != len(names):
        raise ValueError(f"filters {names}: a filter is listed twice")
    return tuple(filters)
