"""RelayCache over the real tiny model: every cache-served score equals rank_full (R1 + R2)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from mindspore_relaygr import load_config
from mindspore_relaygr.cache import DRAMExpander, KVCacheManager
from mindspore_relaygr.cache.hierarchy import RelayCache
from mindspore_relaygr.model.inputs import validate_history
from tests.cache.checked_manager import CheckedManager
from tests.cache.test_hierarchy import Clock, prefill
from tests.cache.test_hierarchy import rank as cached_rank
from tests.conftest import CONFIGS, ONE_BUCKET, random_history

pytestmark = pytest.mark.slow
TOL = 1e-5


@pytest.fixture(scope="module")
def model():
    from mindspore_relaygr.model import RelayGRModel
    from tests.model.conftest import randomize_weights

    m = RelayGRModel(load_config(CONFIGS / "tiny.yaml", ["cache.num_slots=2", *ONE_BUCKET]))
    randomize_weights(m, seed=5)
    m.ensure_host_arena(32 << 20)  # spills land in the arena: every reload below reads arena memory
    return m


def make_cache(model, clock=None, checked=False):
    """The model's cache tiers; `checked`: its manager checks which entry each eviction takes (needs `clock`)."""
    cfg = model.config
    kwargs = {} if clock is None else {"clock": clock}
    if checked:
        manager = CheckedManager(model.num_slots, model.layout.slot_bytes, cfg.cache.lifetime_ms, clock)
    else:
        manager = KVCacheManager(model.num_slots, model.layout.slot_bytes, cfg.cache.lifetime_ms, **kwargs)
    expander = DRAMExpander(cfg.expander.dram_bytes, cfg.expander.ttl_s, "always", **kwargs)
    return RelayCache(model, manager, expander, model_version=model.version,
                      max_prefix_len=model.layout.slot_len - 1)


EXTEND_CHUNK = 64  # the engine's policy stand-in: extend up to this many new events, in one chunk


def rank(cache, user, h, cands):
    cfg = cache.store.config
    return cached_rank(cache, user, h, cands, cfg.model.max_suffix_len, max_extend=EXTEND_CHUNK)


def hist(rng, n, feats=(1, 2)):
    return validate_history(load_config(CONFIGS / "tiny.yaml").model, random_history(rng, n, user_features=list(feats)))


def test_tiers_on_the_real_model(model):
    cache = make_cache(model)
    rng = np.random.default_rng(0)
    full = hist(rng, 110)
    a, b, c = full.slice(0, 60), hist(rng, 50), hist(rng, 40)
    cands = rng.integers(1, 201, 12)
    assert prefill(cache, "a", a) is not None
    assert rank(cache, "a", full.slice(0, 70), cands)[1] == "device"  # 10-event suffix
    np.testing.assert_allclose(rank(cache, "a", full.slice(0, 70), cands)[0],
                               model.rank_full(full.slice(0, 70), cands), atol=TOL, rtol=0)
    prefill(cache, "b", b)
    prefill(cache, "c", c)  # 2 slots: a is evicted and spilled
    spilled = cache.expander.get(cache.locate("a", a)[1])
    assert np.shares_memory(spilled.keys, model.host_arena._buffer)
    assert np.shares_memory(spilled.values, model.host_arena._buffer)
    del spilled
    scores, tier = rank(cache, "a", full.slice(0, 60), cands)
    assert tier == "dram"
    np.testing.assert_allclose(scores, model.rank_full(full.slice(0, 60), cands), atol=TOL, rtol=0)
    scores, tier = rank(cache, "a", full, cands)  # 50 new events > 16-event suffix: extend
    assert tier == "partial"
    np.testing.assert_allclose(scores, model.rank_full(full, cands), atol=TOL, rtol=0)
    assert rank(cache, "a", full, cands)[1] == "device"  # the entry now holds all 110 events
    stale = type(full)(full.item_ids.copy(), full.action_ids.copy(), full.timestamps.copy(), full.user_features)
    stale.timestamps[:4] -= 1  # same events, earlier timestamps (still in order): never served from the cache
    assert rank(cache, "a", stale, cands) is None


class ModelMachine(RuleBasedStateMachine):
    """Pre-infers and ranks of three users over two slots: evictions happen only as production makes them (a
    prefill or a reload needs a slot; each checked by CheckedManager) and spill to DRAM, which holds every
    copy. So the user's last pre-inferred history is cached until a rank extends its slot to a longer one
    (re-keyed): until then every rank of it must hit, and every hit equals rank_full."""

    model = None
    hits = 0  # over every run: the machine must have checked some

    def __init__(self) -> None:
        super().__init__()
        self.cache = make_cache(self.model, Clock(), checked=True)
        self.rng = np.random.default_rng(1)
        self.histories = {}
        self.cached = {}  # user -> their last pre-inferred history is still cached (device or DRAM)

    @initialize()
    def a_first_visit(self):
        """Every run starts with a pre-infer and its rank, so each checks at least one hit (a random run may
        otherwise never rank a user it pre-inferred)."""
        self.preinfer("a", 40)
        self.rank("a", 4)

    @rule(user=st.sampled_from("abc"), n=st.integers(1, 90))
    def preinfer(self, user, n):
        self.histories[user] = hist(self.rng, n)
        assert prefill(self.cache, user, self.histories[user]) is not None  # a slot can always be freed
        self.cached[user] = True

    @rule(user=st.sampled_from("abc"), extra=st.integers(0, 30))
    def rank(self, user, extra):
        if user not in self.histories:
            return
        h = self.histories[user]
        if extra:
            more = hist(self.rng, extra)
            h = type(h)(np.r_[h.item_ids, more.item_ids], np.r_[h.action_ids, more.action_ids],
                        np.r_[h.timestamps, h.timestamps[-1] + np.arange(1, extra + 1)], h.user_features)
        cands = self.rng.integers(1, 201, 5)
        got = rank(self.cache, user, h, cands)
        assert (got is not None) == self.cached[user], f"rank of {user}: {got and got[1]}, cached={self.cached[user]}"
        if got is None:
            return
        ModelMachine.hits += 1
        assert got[1] in (("partial",) if extra > self.model.config.model.max_suffix_len else ("device", "dram"))
        np.testing.assert_allclose(got[0], self.model.rank_full(h, cands), atol=TOL, rtol=0)
        if got[1] == "partial":  # the slot now holds the longer history: the pre-inferred one is gone
            self.cached[user] = False

    @invariant()
    def budget(self):
        assert self.cache.manager.bytes_in_use() <= self.model.num_slots * self.model.layout.slot_bytes
        assert self.cache.manager.violations == []


def test_random_operations_on_the_real_model(model):
    from hypothesis.stateful import run_state_machine_as_test

    ModelMachine.model, ModelMachine.hits = model, 0
    run_state_machine_as_test(ModelMachine, settings=settings(max_examples=8, stateful_step_count=15,
                                                             deadline=None))
    assert ModelMachine.hits >= 8  # every run ranked from the cache at least once (its first visit)
