"""RelayLedger: the one owner of every relayed prefix's lifecycle on an instance.

A relay is device work that makes one cache key ready for a coming rank: a prefill admitted by the
trigger, an extension of the user's cached shorter prefix by the events since (in its own slot), or
a DRAM copy brought back ahead of its rank (a prefetch). Its states:

    ADMITTED -> PREFILLING -> READY -> CONSUMED
                                   \\-> EXPIRED
         \\__________\\__________\\____-> DROPPED

A relay leaves the ledger when it is consumed (a rank used it), expires (READY, and its rank has not
come within `ready_ttl_ms`: the user left after retrieval, the rank was refused or went elsewhere)
or is dropped (no slot, the prefill failed, or its entry was evicted before any rank used it: under
slot pressure when nothing else could go, by a flush or by the exactness audit). Most pre-infers of
a real cascade may never see their rank: expiry is what keeps such orphans from holding the
trigger's footprint for ever. A READY relay inside its TTL is *awaited*: the cache evicts its entry
only when nothing else can go (`awaited()` is what the engine hands the cache for that). Expiry is
evaluated lazily against the clock, under the lock, by every query. A wrong transition raises with
the current state in the message. The trigger's footprint, the engine's waits and the metrics read
the ledger; nothing else keeps a copy of this state. Plain Python, thread-safe (one lock).
"""

from __future__ import annotations

import enum
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field

from mindspore_relaygr.cache.keys import CacheKey

PREFILL, PREFETCH, EXTEND = "prefill", "prefetch", "extend"  # relay kinds; only prefills take a new slot,
KINDS = (PREFILL, PREFETCH, EXTEND)  # so only they count in the trigger's footprint
DROP_REASONS = ("no_slot", "failed", "evicted")


class RelayState(enum.Enum):
    ADMITTED = "admitted"  # queued on the device thread
    PREFILLING = "prefilling"  # its slot is reserved and being written
    READY = "ready"  # the slot holds the prefix; no rank used it yet
    CONSUMED = "consumed"
    EXPIRED = "expired"  # READY, but no rank came within the TTL
    DROPPED = "dropped"


_NEXT = {
    RelayState.ADMITTED: (RelayState.PREFILLING, RelayState.DROPPED),
    RelayState.PREFILLING: (RelayState.READY, RelayState.DROPPED),
    RelayState.READY: (RelayState.CONSUMED, RelayState.EXPIRED, RelayState.DROPPED),
}
LIVE = (RelayState.ADMITTED, RelayState.PREFILLING, RelayState.READY)
PENDING = (RelayState.ADMITTED, RelayState.PREFILLING)


@dataclass
class Relay:
    """One relayed prefix: who, which key, where it is, and the predicted cost of each step."""

    user_id: str
    key: CacheKey
    kind: str  # one of KINDS
    step_ms: list[float]  # predicted cost of each chunk (or copied layer)
    state: RelayState = RelayState.ADMITTED
    steps_done: int = 0
    future: Future = field(default_factory=Future)
    expires_at: float | None = None  # READY: the clock time its rank is waited for until

    def remaining_ms(self) -> float:
        return sum(self.step_ms[self.steps_done:])


@dataclass(frozen=True)
class Footprint:
    """Admitted prefills neither consumed, expired nor dropped (`inflight`), and those not yet READY
    (`pending`)."""

    inflight: int
    pending: int


@dataclass(frozen=True)
class LedgerStats:
    inflight_relays: int
    pending_relays: int
    admitted: int
    consumed: int
    expired: int  # READY relays whose rank did not come within the TTL (orphans)
    dropped_no_slot: int
    dropped_failed: int
    dropped_evicted: int  # READY relays evicted inside their TTL, before any rank used them: wasted prefills


class RelayLedger:
    """Relays by cache key (one live relay per key), indexed by user."""

    def __init__(self, ready_ttl_ms: float, clock: Callable[[], float] = time.monotonic) -> None:
        """`ready_ttl_ms`: how long a READY relay waits for its rank before it expires."""
        if not ready_ttl_ms > 0:
            raise ValueError(f"ready_ttl_ms={ready_ttl_ms!r}: must be > 0")
        self.ready_ttl_s = ready_ttl_ms / 1e3
        self._clock = clock
        self.lock = threading.RLock()  # callers may hold it across a trigger decision and `admit`
        self._relays: dict[CacheKey, Relay] = {}
        self._by_user: dict[str, dict[CacheKey, Relay]] = {}
        self._admitted = 0
        self._consumed = 0
        self._expired = 0
        self._dropped = dict.fromkeys(DROP_REASONS, 0)

    # ---- transitions ----
    def admit(self, user_id: str, key: CacheKey, kind: str, step_ms: list[float]) -> Relay:
        """A new relay of `key` (ADMITTED); `key` must not have a live relay."""
        if kind not in KINDS:
            raise ValueError(f"kind={kind!r}: must be one of {KINDS}")
        if key.user_id != user_id:
            raise ValueError(f"key {key} does not belong to user {user_id!r}")
        with self.lock:
            if key in self._relays:
                raise ValueError(f"cannot admit {key}: already relayed (state {self._relays[key].state.name})")
            relay = Relay(user_id, key, kind, list(step_ms))
            self._relays[key] = relay
            self._by_user.setdefault(user_id, {})[key] = relay
            self._admitted += 1
            return relay

    def start(self, key: CacheKey) -> None:
        """The device thread reserved the relay's slot and begins writing it."""
        self._move(key, RelayState.PREFILLING)

    def step_done(self, key: CacheKey) -> None:
        """One chunk (or copied layer) of a PREFILLING relay finished."""
        with self.lock:
            relay = self._get(key, "count a step of")
            if relay.state is not RelayState.PREFILLING:
                raise ValueError(f"cannot count a step of {key}: state is {relay.state.name}, need PREFILLING")
            relay.steps_done += 1

    def ready(self, key: CacheKey) -> None:
        """The relay's slot holds its prefix; its rank is awaited for `ready_ttl_ms` from now."""
        with self.lock:
            relay = self._move(key, RelayState.READY)
            relay.steps_done = len(relay.step_ms)
            relay.expires_at = self._clock() + self.ready_ttl_s

    def consume(self, key: CacheKey) -> bool:
        """A rank used `key`: a READY relay of it is consumed (True); no relay of it (or an expired one)
        is a no-op (False)."""
        with self.lock:
            self._expire_due()
            relay = self._relays.get(key)
            if relay is None or relay.state is not RelayState.READY:
                return False
            self._finish(relay, RelayState.CONSUMED)
            self._consumed += 1
            return True

    def drop(self, key: CacheKey, reason: str) -> None:
        """Abandon the live relay of `key`."""
        if reason not in DROP_REASONS:
            raise ValueError(f"reason={reason!r}: must be one of {DROP_REASONS}")
        with self.lock:
            self._finish(self._move_check(key, RelayState.DROPPED), RelayState.DROPPED)
            self._dropped[reason] += 1

    def on_evicted(self, key: CacheKey) -> bool:
        """The cache dropped `key`'s device entry: a READY relay of it is dropped unused (True)."""
        with self.lock:
            relay = self._relays.get(key)
            if relay is None or relay.state is not RelayState.READY:
                return False
            self._finish(relay, RelayState.DROPPED)
            self._dropped["evicted"] += 1
            return True

    # ---- queries ----
    def get(self, key: CacheKey) -> Relay | None:
        with self.lock:
            self._expire_due()
            return self._relays.get(key)

    def of_user(self, user_id: str) -> list[Relay]:
        """The user's live relays, longest prefix first."""
        with self.lock:
            self._expire_due()
            relays = list(self._by_user.get(user_id, {}).values())
        return sorted(relays, key=lambda r: -r.key.prefix_len)

    def pending(self) -> list[Relay]:
        """Relays whose device work has not finished (ADMITTED or PREFILLING)."""
        with self.lock:
            return [r for r in self._relays.values() if r.state in PENDING]

    def awaited(self) -> frozenset[CacheKey]:
        """Keys of the READY relays inside their TTL: their rank may still come, so their device entries
        are the last to be evicted and are never rewritten in place."""
        with self.lock:
            self._expire_due()
            return frozenset(k for k, r in self._relays.items() if r.state is RelayState.READY)

    def footprint(self) -> Footprint:
        """What the trigger bounds: admitted prefills only (a prefetch reuses a copy the trigger never
        admitted), expired ones no longer."""
        with self.lock:
            self._expire_due()
            prefills = [r for r in self._relays.values() if r.kind == PREFILL]
            return Footprint(len(prefills), sum(r.state in PENDING for r in prefills))

    def stats(self) -> LedgerStats:
        with self.lock:
            fp = self.footprint()
            return LedgerStats(fp.inflight, fp.pending, self._admitted, self._consumed, self._expired,
                               *(self._dropped[r] for r in DROP_REASONS))

    # ---- internals ----
    def _expire_due(self) -> None:
        """READY relays past their TTL expire (lock held)."""
        now = self._clock()
        due = [r for r in self._relays.values() if r.state is RelayState.READY and r.expires_at <= now]
        for relay in due:
            self._finish(relay, RelayState.EXPIRED)
            self._expired += 1

    def _get(self, key: CacheKey, action: str) -> Relay:
        relay = self._relays.get(key)
        if relay is None:
            raise ValueError(f"cannot {action} {key}: no live relay")
        return relay

    def _move_check(self, key: CacheKey, state: RelayState) -> Relay:
        relay = self._get(key, f"move to {state.name}")
        if state not in _NEXT.get(relay.state, ()):
            raise ValueError(f"cannot move {key} to {state.name}: state is {relay.state.name}")
        return relay

    def _move(self, key: CacheKey, state: RelayState) -> Relay:
        with self.lock:
            relay = self._move_check(key, state)
            relay.state = state
            return relay

    def _finish(self, relay: Relay, state: RelayState) -> None:
        relay.state = state
        del self._relays[relay.key]
        mine = self._by_user[relay.user_id]
        del mine[relay.key]
        if not mine:
            del self._by_user[relay.user_id]
