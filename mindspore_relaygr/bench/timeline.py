"""Real-timeline workload: MovieLens users' own event streams as ranking load.

A user *visits* where their timeline pauses for longer than `visit_gap_s`. The visit's request
is the user's history before the visit (the most recent `max_len` events); the user's next request
is that history grown by the events of the visit, so revisits, growth and partial cache hits come
from real behaviour instead of a Zipf draw. Visits with fewer than `min_history` past events are
left out (a cold user is not a long-sequence ranking).

Visits are ordered by their real start time and a window of `num_requests` consecutive visits
(its offset drawn from `seed`) is replayed with Poisson arrivals at `qps`: the order of visits and
the growth between them are real, the spacing is compressed to the target load. The pre-infer
signal comes at the arrival, the rank `gap_s` later, as in the synthetic workload.

A saved workload holds the request list and a fingerprint of the dataset; loading it re-reads the
dataset and refuses one whose fingerprint differs, so a replay ranks exactly the saved histories.
"""

from __future__ import annotations

import argparse
import hashlib
import json
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from mindspore_relaygr.bench.workload import Request
from mindspore_relaygr.errors import WorkloadError
from mindspore_relaygr.model.inputs import History

TARGETS_SHARE = 4  # at most num_candidates // TARGETS_SHARE candidates are items of the visit itself


@dataclass(frozen=True)
class TimelineSpec:
    data_path: str = "ml-1m"  # a bundled dataset name or a MovieLens path (see load_movielens)
    num_requests: int = 1000
    qps: float = 2.0
    visit_gap_s: float = 1800.0  # a longer pause in a user's timeline starts a new visit
    min_history: int = 20  # past events a visit needs to be ranked
    max_len: int = 4096  # the serving cap: a request carries the most recent max_len events
    gap_ms: float = 50.0  # mean retrieval -> ranking gap: min_gap_ms + an exponential tail
    min_gap_ms: float = 0.0
    num_candidates: int = 128
    user_features: bool = True  # send the user's features (False for a model without a user token)
    seed: int = 0

    def __post_init__(self) -> None:
        checks = {"num_requests": self.num_requests >= 1, "qps": self.qps > 0, "visit_gap_s": self.visit_gap_s > 0,
                  "min_history": self.min_history >= 1, "max_len": self.max_len >= 1,
                  "num_candidates": self.num_candidates >= 1, "min_gap_ms": 0 <= self.min_gap_ms <= self.gap_ms}
        bad = [name for name, ok in checks.items() if not ok]
        if bad:
            raise WorkloadError(f"timeline spec: invalid {', '.join(f'{b}={getattr(self, b)!r}' for b in bad)}")


@dataclass(frozen=True)
class TimelineRequest(Request):
    end: int = 0  # the user's events [0, end) are their history at this visit (before the max_len cap)
    visit_len: int = 0  # events of this visit (what the user's next request has grown by, at most)


def find_visits(sequences: dict[int, History], visit_gap_s: float, min_history: int) -> np.ndarray:
    """Every visit of every user as rows (real start time, user, end, visit length), in real-time order
    (ties by user). A visit starts at a user's first event and after every pause > visit_gap_s."""
    rows = []
    for user, hist in sequences.items():
        ts = np.asarray(hist.timestamps, dtype=np.int64)
        starts = np.flatnonzero(np.r_[True, np.diff(ts) > visit_gap_s])
        lens = np.diff(np.r_[starts, len(ts)])
        keep = starts >= min_history
        for start, length in zip(starts[keep], lens[keep], strict=True):
            rows.append((int(ts[start]), int(user), int(start), int(length)))
    table = np.array(rows, dtype=np.int64).reshape(-1, 4)
    return table[np.lexsort((table[:, 1], table[:, 0]))]


def fingerprint(sequences: dict[int, History]) -> str:
    """sha256 (16 hex) over every user's items and timestamps in user order: two datasets with the
    same fingerprint give the same histories."""
    digest = hashlib.sha256()
    for user in sorted(sequences):
        hist = sequences[user]
        digest.update(np.int64(user).tobytes())
        digest.update(np.asarray(hist.item_ids, dtype=np.int32).tobytes())
        digest.update(np.asarray(hist.timestamps, dtype=np.int64).tobytes())
    return digest.hexdigest()[:16]


@dataclass
class TimelineWorkload:
    spec: TimelineSpec
    sequences: dict[int, History]
    num_items: int
    requests: list[TimelineRequest] = field(default_factory=list)
    window: tuple[int, int] = (0, 0)  # the replayed visits' positions in the real-time visit order
    visits_available: int = 0

    @classmethod
    def generate(cls, spec: TimelineSpec, sequences: dict[int, History] | None = None,
                 num_items: int | None = None) -> TimelineWorkload:
        """Pick the window of visits and schedule it; `sequences` defaults to spec.data_path's."""
        if sequences is None:
            sequences, num_items = load_sequences(spec.data_path)
        if num_items is None:
            num_items = max(int(h.item_ids.max()) for h in sequences.values() if len(h))
        visits = find_visits(sequences, spec.visit_gap_s, spec.min_history)
        if len(visits) < spec.num_requests:
            raise WorkloadError(f"timeline: {len(visits)} visits have >= {spec.min_history} past events "
                             f"(session gap {spec.visit_gap_s:g} s), fewer than num_requests={spec.num_requests}")
        rng = np.random.default_rng(spec.seed)
        offset = int(rng.integers(0, len(visits) - spec.num_requests + 1))
        chosen = visits[offset:offset + spec.num_requests]
        arrivals = np.cumsum(rng.exponential(1.0 / spec.qps, spec.num_requests))
        gaps = spec.min_gap_ms / 1e3 + rng.exponential((spec.gap_ms - spec.min_gap_ms) / 1e3, spec.num_requests)
        seen: dict[int, int] = {}
        requests = []
        for i, (_, user, end, visit_len) in enumerate(chosen.tolist()):
            requests.append(TimelineRequest(float(arrivals[i]), user, seen.get(user, 0), float(gaps[i]),
                                            int(rng.integers(2**31)), end=end, visit_len=visit_len))
            seen[user] = seen.get(user, 0) + 1
        return cls(spec, sequences, int(num_items), requests, (offset, offset + spec.num_requests), len(visits))

    def with_spec(self, **changes: Any) -> TimelineWorkload:
        """The same visits with other serving parameters (max_len, num_candidates); the schedule is
        kept unless qps changes, which rescales the arrival times."""
        spec = replace(self.spec, **changes)
        scale = self.spec.qps / spec.qps
        requests = [replace(r, at_s=r.at_s * scale) for r in self.requests] if scale != 1 else list(self.requests)
        return replace(self, spec=spec, requests=requests)

    def history(self, req: TimelineRequest) -> History:
        """The user's most recent spec.max_len events before this visit (oldest first)."""
        hist = self.sequences[req.user].slice(max(0, req.end - self.spec.max_len), req.end)
        return hist if self.spec.user_features else replace(hist, user_features=None)

    def candidates(self, req: TimelineRequest) -> np.ndarray:
        """spec.num_candidates distinct items: up to a quarter are items the user picks in this visit,
        the rest uniform (seeded per request); their order is shuffled."""
        rng = np.random.default_rng(req.candidate_seed)
        n = min(self.spec.num_candidates, self.num_items)
        visit_items = np.unique(self.sequences[req.user].item_ids[req.end:req.end + req.visit_len])
        targets = rng.permutation(visit_items)[:max(n // TARGETS_SHARE, 1)]
        rest = np.setdiff1d(np.arange(1, self.num_items + 1), targets)
        out = np.concatenate([targets, rng.choice(rest, size=n - len(targets), replace=False)])
        return rng.permutation(out).astype(np.int64)

    def check_model(self, num_items: int, num_actions: int) -> None:
        """Raise WorkloadError unless a model with these vocabularies can rank every request."""
        max_action = max(int(h.action_ids.max()) for h in self.sequences.values() if len(h))
        if self.num_items > num_items or max_action >= num_actions:
            raise WorkloadError(f"the timeline of {self.spec.data_path} has {self.num_items} items and action ids up "
                                f"to {max_action}; the model has {num_items} items and {num_actions} actions")

    def revisit_fraction(self) -> float:
        """1 - distinct users / requests (0.0 for no requests)."""
        if not self.requests:
            return 0.0
        return 1.0 - len({r.user for r in self.requests}) / len(self.requests)

    def describe(self) -> dict[str, Any]:
        """What the window holds: users, revisits, history lengths, growth between a user's requests."""
        lens = np.array([min(r.end, self.spec.max_len) for r in self.requests])
        last_end: dict[int, int] = {}
        growth = []
        for r in self.requests:
            if r.user in last_end:
                growth.append(r.end - last_end[r.user])
            last_end[r.user] = r.end
        pct = lambda a, q: float(np.percentile(a, q)) if len(a) else float("nan")  # noqa: E731
        return {"requests": len(self.requests), "distinct_users": len(last_end),
                "revisit_fraction": self.revisit_fraction(), "visits_available": self.visits_available,
                "window": list(self.window),
                "history_len": {"p50": pct(lens, 50), "p90": pct(lens, 90), "max": int(lens.max(initial=0))},
                "capped": int(sum(1 for r in self.requests if r.end > self.spec.max_len)),
                "growth_events": {"p50": pct(growth, 50), "p90": pct(growth, 90), "max": int(max(growth, default=0))},
                "duration_s": self.requests[-1].at_s if self.requests else 0.0}

    def save(self, path: str | Path) -> None:
        doc = {"kind": "timeline", "spec": asdict(self.spec), "fingerprint": fingerprint(self.sequences),
               "num_items": self.num_items, "window": list(self.window), "visits_available": self.visits_available,
               "requests": [asdict(r) for r in self.requests]}
        Path(path).write_text(json.dumps(doc))

    @classmethod
    def load(cls, path: str | Path, sequences: dict[int, History] | None = None) -> TimelineWorkload:
        """Read a saved workload; the dataset (spec.data_path unless given) must match its fingerprint."""
        try:
            doc = json.loads(Path(path).read_text())
        except (OSError, json.JSONDecodeError) as exc:
            raise WorkloadError(f"{path}: cannot read a workload file ({exc})") from None
        if not isinstance(doc, dict) or doc.get("kind") != "timeline":
            kind = doc.get("kind") if isinstance(doc, dict) else type(doc).__name__
            raise WorkloadError(f"{path}: not a timeline workload (kind={kind!r})")
        try:
            spec = TimelineSpec(**doc["spec"])
            requests = [TimelineRequest(**r) for r in doc["requests"]]
        except (KeyError, TypeError) as exc:
            raise WorkloadError(f"{path}: malformed timeline workload ({exc})") from None
        if sequences is None:
            sequences, _ = load_sequences(spec.data_path)
        found = fingerprint(sequences)
        if found != doc["fingerprint"]:
            raise WorkloadError(f"{path}: saved from a dataset with fingerprint {doc['fingerprint']}, but "
                             f"{spec.data_path} has {found}: the histories would differ")
        return cls(spec, sequences, int(doc["num_items"]), requests, tuple(doc["window"]), int(doc["visits_available"]))


def load_sequences(data_path: str) -> tuple[dict[int, History], int]:
    """Chronological per-user histories (with user features) and the item count of a MovieLens dataset."""
    from mindspore_relaygr.data.movielens import load_movielens, movielens_interactions
    from mindspore_relaygr.data.sequences import build_sequences

    data = load_movielens(data_path)
    return build_sequences(movielens_interactions(data)), data.num_items


def format_description(info: dict[str, Any]) -> str:
    h, g = info["history_len"], info["growth_events"]
    return (f"{info['requests']} requests of {info['distinct_users']} users (revisits {info['revisit_fraction']:.2f}), "
            f"visits {info['window'][0]}..{info['window'][1]} of {info['visits_available']}; history p50 "
            f"{h['p50']:.0f} p90 {h['p90']:.0f} max {h['max']} events ({info['capped']} capped); growth between a "
            f"user's requests p50 {g['p50']:.0f} p90 {g['p90']:.0f} max {g['max']}; {info['duration_s']:.0f} s of load")


def cmd_timeline(args: argparse.Namespace) -> int:
    spec = TimelineSpec(data_path=args.data, num_requests=args.requests, qps=args.qps, visit_gap_s=args.visit_gap_s,
                        min_history=args.min_history, max_len=args.max_len, gap_ms=args.gap_ms,
                        min_gap_ms=args.min_gap_ms, num_candidates=args.candidates, seed=args.seed)
    workload = TimelineWorkload.generate(spec)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    workload.save(out)
    print(f"[workload] {format_description(workload.describe())}")
    print(f"[workload] wrote {out} (replay it with relaygr bench engine --workload {out})")
    return 0


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add `relaygr workload timeline`."""
    workload = subparsers.add_parser("workload", help="build a replayable workload file")
    kinds = workload.add_subparsers(dest="workload", required=True)
    p = kinds.add_parser("timeline", help="requests from real user timelines (visits in real-time order)")
    defaults = TimelineSpec()
    p.add_argument("--data", default=defaults.data_path, help="bundled dataset name (ml-1m, ml-100k) or path")
    p.add_argument("--requests", type=int, default=defaults.num_requests)
    p.add_argument("--qps", type=float, default=defaults.qps, help="offered load (a bench may rescale it)")
    p.add_argument("--visit-gap-s", type=float, default=defaults.visit_gap_s,
                   help="a longer pause in a user's timeline starts a new visit")
    p.add_argument("--min-history", type=int, default=defaults.min_history, help="past events a visit needs")
    p.add_argument("--max-len", type=int, default=defaults.max_len, help="serving cap (most recent events)")
    p.add_argument("--candidates", type=int, default=defaults.num_candidates)
    p.add_argument("--gap-ms", type=float, default=600.0, help="mean retrieval -> ranking gap (as the headline)")
    p.add_argument("--min-gap-ms", type=float, default=500.0, help="shortest gap (retrieval + pre-ranking)")
    p.add_argument("--seed", type=int, default=defaults.seed)
    p.add_argument("--out", default="outputs/timeline.json")
    p.set_defaults(func=cmd_timeline)
