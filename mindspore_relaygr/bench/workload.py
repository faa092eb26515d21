"""Seeded cascade workload: users with long-tailed histories, Zipf revisits, retrieval->rank gaps.

A workload is a list of requests; each has an arrival time (Poisson at `qps`), a user, how many
events that user's history has grown by since their first visit, a retrieval->ranking gap and a
candidate list. Histories are regenerated from (seed, user) on demand, so a workload file stays
small and two runs replay exactly the same requests.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np


@dataclass(frozen=True)
class WorkloadSpec:
    num_users: int = 200
    num_requests: int = 200
    qps: float = 2.0
    median_len: int = 1024  # lognormal history lengths, clipped to [min_len, max_len]
    length_sigma: float = 0.8
    min_len: int = 64
    max_len: int = 4096
    zipf_a: float = 1.2  # user popularity (revisits)
    gap_ms: float = 50.0  # mean retrieval -> ranking gap: min_gap_ms + an exponential tail
    min_gap_ms: float = 0.0  # retrieval and pre-ranking take at least this long (0: purely exponential)
    num_candidates: int = 128
    growth_per_visit: int = 3  # new events between two visits of a user
    num_items: int = 100000
    num_actions: int = 8
    seed: int = 0


@dataclass(frozen=True)
class Request:
    at_s: float  # arrival of the pre-infer signal, seconds from the start
    user: int
    visit: int  # 0 for the first visit; the history grew by visit * growth_per_visit events
    gap_s: float  # ranking request arrives at at_s + gap_s
    candidate_seed: int


@dataclass
class Workload:
    spec: WorkloadSpec
    base_lens: list[int]  # per user, events at the first visit
    requests: list[Request] = field(default_factory=list)
    max_visits: list[int] = field(default_factory=list)  # per user, visits in this workload

    @classmethod
    def generate(cls, spec: WorkloadSpec) -> Workload:
        rng = np.random.default_rng(spec.seed)
        mu = np.log(spec.median_len)
        lens = np.clip(rng.lognormal(mu, spec.length_sigma, spec.num_users), spec.min_len, spec.max_len)
        ranks = np.arange(1, spec.num_users + 1, dtype=np.float64)
        popularity = ranks**-spec.zipf_a / np.sum(ranks**-spec.zipf_a)
        users = rng.choice(spec.num_users, size=spec.num_requests, p=popularity)
        arrivals = np.cumsum(rng.exponential(1.0 / spec.qps, spec.num_requests))
        if not 0 <= spec.min_gap_ms <= spec.gap_ms:
            raise ValueError(f"min_gap_ms must be in [0, gap_ms={spec.gap_ms}], got {spec.min_gap_ms}")
        gaps = spec.min_gap_ms / 1e3 + rng.exponential((spec.gap_ms - spec.min_gap_ms) / 1e3, spec.num_requests)
        visits: dict[int, int] = {}
        requests = []
        for i, user in enumerate(users.tolist()):
            visit = visits.get(user, 0)
            visits[user] = visit + 1
            requests.append(Request(float(arrivals[i]), user, visit, float(gaps[i]), int(rng.integers(2**31))))
        # Room for growth: a user's longest history must stay within max_len.
        max_visits = [visits.get(u, 0) for u in range(spec.num_users)]
        growth = spec.growth_per_visit * np.maximum(np.array(max_visits) - 1, 0)
        base = np.minimum(lens.astype(int), spec.max_len - growth).clip(1)
        return cls(spec, base.tolist(), requests, max_visits)

    def history(self, req: Request) -> dict[str, np.ndarray]:
        """The user's history at this visit: their base events plus the growth since (chronological)."""
        spec = self.spec
        n = self.base_lens[req.user] + req.visit * spec.growth_per_visit
        full_len = self.base_lens[req.user] + spec.growth_per_visit * max(self.max_visits[req.user], 1)
        rng = np.random.default_rng([spec.seed, req.user])
        items = rng.integers(1, spec.num_items + 1, full_len)
        actions = rng.integers(0, spec.num_actions, full_len)
        times = 1_700_000_000 + np.cumsum(rng.integers(1, 3600, full_len))
        return {"item_ids": items[:n], "action_ids": actions[:n], "timestamps": times[:n]}

    def revisit_fraction(self) -> float:
        """Fraction of the requests that revisit a user: their user made an earlier request of this
        workload. Equals 1 - distinct users / requests (0.0 for no requests); computed from the user
        ids, so it stays exact for a trimmed request list."""
        if not self.requests:
            return 0.0
        return 1.0 - len({r.user for r in self.requests}) / len(self.requests)

    def candidates(self, req: Request) -> np.ndarray:
        rng = np.random.default_rng(req.candidate_seed)
        return rng.choice(np.arange(1, self.spec.num_items + 1), size=self.spec.num_candidates, replace=False)

    def save(self, path: str | Path) -> None:
        doc = {"spec": asdict(self.spec), "base_lens": self.base_lens, "max_visits": self.max_visits,
               "requests": [asdict(r) for r in self.requests]}
        Path(path).write_text(json.dumps(doc))

    @classmethod
    def load(cls, path: str | Path) -> Workload:
        doc = json.loads(Path(path).read_text())
        return cls(WorkloadSpec(**doc["spec"]), doc["base_lens"], [Request(**r) for r in doc["requests"]],
                   doc["max_visits"])
