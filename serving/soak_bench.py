"""`relaygr bench soak`: does the relay keep working in a realistic cascade, for minutes, with an instance dying?

Real cascades are not the benchmarks' "every pre-infer is followed by its rank on the same instance". For
`--minutes` (default 10) users arrive open loop (Poisson, `--rate` per second) at nginx in front of
`--instances` instances, each user visit drawn from a stated mix (`SoakMix`, printed and recorded):

* follow     pre-infer, then rank after a retrieval -> ranking gap (uniform in `--gap-ms`);
* orphan     pre-infer and never rank (the user left after retrieval);
* rank_only  rank without a pre-infer;
* late       pre-infer, then rank after a long gap (uniform in `--late-gap-ms`, past a ready TTL).

Independently of its class, each request goes without the X-RelayGR-Affinity header with probability
`--no-header` (nginx then hashes the empty key; a pre-infer without it may be refused with a 400, which is
counted per endpoint, apart from the failures; a rank without it must be answered). A visit comes from a
returning user with probability `--returning`: that user's history has grown by `--growth` events per
earlier visit. A client retries a 503 at once, up to `--retries` times. At `--kill-at` of the run one
instance is SIGKILLed (master and worker) and restarted as `relaygr cluster` starts it (waiting for its
/readyz); nginx routes around it meanwhile.

Per minute (`--bucket-s`) it prints a line; at the end a table, the JSON and a PNG. Per bucket: the share of
ranks served from a cache (device, inflight, partial or dram) among the ranks that had a pre-infer (an
earlier 202 pre-infer of the user, both sent with the affinity header) and among those that followed their
own pre-infer within the gap (class follow: the target, >= 90% in every bucket the kill did not disrupt);
goodput (200 ranks per second); P50/P99 rank latency (from the scheduled send time, retries included);
pre-infer decisions by reason; 400s by endpoint; failures at the client by kind (connection error,
timeout, 5xx after the retries, other 4xx); retries; which instance answered; the RSS of each instance's
worker (its /v1/stats pid -> /proc/PID/status VmRSS, every `--rss-every` s); the orphan share of the
pre-infers sent. A bucket is given by the scheduled time of its request (a rank's: its own).

Both the client and the instances run on this machine's cores. Everything binds 127.0.0.1; the cluster is
stopped by PID at the end, on Ctrl-C (a partial report is still written) and on errors.
"""

from __future__ import annotations

import argparse
import http.client
import math
import os
import shlex
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import requests

from mindspore_relaygr.bench.loadgen import percentile
from mindspore_relaygr.bench.workload import Request, Workload, WorkloadSpec
from mindspore_relaygr.config import RelayGRConfig, load_config, save_config
from mindspore_relaygr.errors import ConfigError
from serving import headers
from serving.cluster_bench import HOST, add_instance_config_args, check_workload, free_port_block
from serving.http_target import JSON_CONTENT, Answer, HTTPTarget, user_id

Say = Callable[[str], None]
CLASSES = ("follow", "orphan", "rank_only", "late")
CACHED = ("device", "inflight", "partial", "dram")  # cache values that count as served from a cache
FAILURES = ("connection", "timeout", "5xx", "4xx", "other")
TARGET_SHARE = 0.9
# The tiny model's full path is predicted at ~2 ms whatever the history, far below the trigger's budget of
# slo_ms * risk_margin = 40 ms, so no pre-infer would be at risk and none admitted. A small risk margin
# (budget 0.5 ms) puts every history at risk while slo_ms, and with it rank admission control, stays as it is.
# The pool is sized for the cascade, as a deployment would size it: an instance holds each admitted pre-infer
# for its gap (followers, ~0.35 s) or its ready TTL (orphans and late ranks, 2 s), i.e. by Little's law about
# 12/s x (0.6 x 0.35 + 0.3 x 2) ~ 10 relays at the default rate, plus returning users' cached prefixes; the
# tiny config's 4 slots (a few KB each) are a unit-test size.
DEFAULT_BENCH_OVERRIDES = ("trigger.risk_margin=0.01", "cache.num_slots=32")
DEFAULT_OUT = "outputs/bench_soak.json"


# ---------------------------------------------------------------------- the mix and the workload
@dataclass(frozen=True)
class SoakMix:
    """What users do; `follow` is what the other classes leave."""

    orphan: float = 0.25
    rank_only: float = 0.10
    late: float = 0.05
    no_header: float = 0.05  # per request
    returning: float = 0.30  # per visit
    retries: int = 2  # immediate retries of a 503
    gap_ms: tuple[float, float] = (100.0, 600.0)
    late_gap_ms: tuple[float, float] = (2000.0, 8000.0)

    def __post_init__(self) -> None:
        for key in ("orphan", "rank_only", "late", "no_header", "returning"):
            if not 0.0 <= getattr(self, key) <= 1.0:
                raise ConfigError(f"mix {key}={getattr(self, key)}: must be in [0, 1]")
        if self.follow < -1e-9:
            raise ConfigError(f"mix: orphan + rank_only + late = {1 - self.follow:.3f} > 1")
        if self.retries < 0:
            raise ConfigError(f"retries={self.retries}: must be >= 0")
        for key in ("gap_ms", "late_gap_ms"):
            low, high = getattr(self, key)
            if not 0 <= low <= high:
                raise ConfigError(f"{key}={low, high}: must be 0 <= low <= high")

    @property
    def follow(self) -> float:
        return 1.0 - self.orphan - self.rank_only - self.late

    def shares(self) -> dict[str, float]:
        return {"follow": max(self.follow, 0.0), "orphan": self.orphan, "rank_only": self.rank_only, "late": self.late}

    def describe(self) -> str:
        shares = ", ".join(f"{k} {v:.0%}" for k, v in self.shares().items())
        return (f"{shares} of visits (follow: rank {self.gap_ms[0]:g}-{self.gap_ms[1]:g} ms after the pre-infer; late: "
                f"{self.late_gap_ms[0]:g}-{self.late_gap_ms[1]:g} ms); {self.no_header:.0%} of requests without the "
                f"affinity header; {self.returning:.0%} of visits by returning users (history grown); a 503 is "
                f"retried at once up to {self.retries}x")


@dataclass(frozen=True)
class Visit:
    request: Request  # arrival (= the pre-infer's send time), user, visit number, gap, candidates
    cls: str  # one of CLASSES
    preinfer_header: bool  # the pre-infer carries the affinity header
    rank_header: bool

    @property
    def sends_preinfer(self) -> bool:
        return self.cls != "rank_only"

    @property
    def sends_rank(self) -> bool:
        return self.cls != "orphan"


@dataclass(frozen=True)
class HistoryShape:
    """History lengths (lognormal, clipped) and growth of returning users; they must fit the model."""

    median_len: int = 64
    min_len: int = 16
    max_len: int = 127
    growth: int = 3  # events a history grows by between two visits
    max_visits: int = 6  # visits of one user at most (keeps the grown history within max_len)
    num_candidates: int = 32

    @property
    def base_cap(self) -> int:
        return self.max_len - self.growth * (self.max_visits - 1)

    def __post_init__(self) -> None:
        if self.max_visits < 1 or self.growth < 0 or self.num_candidates < 1:
            raise ConfigError("max_visits and num_candidates must be >= 1, growth >= 0")
        if not 1 <= self.min_len <= self.base_cap:
            raise ConfigError(f"min_len={self.min_len} must be in [1, max_len - growth * (max_visits - 1) = "
                              f"{self.base_cap}]")


@dataclass
class SoakWorkload:
    workload: Workload  # histories and candidates of every visit (Workload.history / candidates)
    visits: list[Visit]
    duration_s: float

    def events(self) -> list[tuple[float, str, int]]:
        """(send time, endpoint, visit index), in send order (a pre-infer before a rank at the same time)."""
        out = []
        for i, v in enumerate(self.visits):
            if v.sends_preinfer:
                out.append((v.request.at_s, "preinfer", i))
            if v.sends_rank:
                out.append((v.request.at_s + v.request.gap_s, "rank", i))
        out.sort(key=lambda e: (e[0], e[1] == "rank", e[2]))
        return out


def generate_soak(mix: SoakMix, rate: float, duration_s: float, shape: HistoryShape, num_items: int,
                  num_actions: int, seed: int = 0) -> SoakWorkload:
    """Visits arriving at `rate` per second (Poisson) during `duration_s`, classes and headers drawn from
    `mix`; the same seed gives the same visits."""
    if rate <= 0 or duration_s <= 0:
        raise ConfigError(f"rate={rate} and duration={duration_s} s must be > 0")
    rng = np.random.default_rng(seed)
    shares = mix.shares()
    probs = np.array([shares[c] for c in CLASSES])
    probs = probs / probs.sum()
    base_lens: list[int] = []
    counts: list[int] = []  # visits so far per user
    open_users: list[int] = []  # users with visits left
    visits = []
    t = 0.0
    while True:
        # every draw is made on every iteration, in this order: the sequence depends on the seed only
        t += float(rng.exponential(1.0 / rate))
        cls = CLASSES[int(rng.choice(len(CLASSES), p=probs))]
        returning = float(rng.random()) < mix.returning
        pick = float(rng.random())
        length = float(rng.lognormal(math.log(shape.median_len), 0.5))
        gap_u = float(rng.random())
        no_pre, no_rank = float(rng.random()) < mix.no_header, float(rng.random()) < mix.no_header
        cand_seed = int(rng.integers(2**31))
        if t >= duration_s:
            break
        if returning and open_users:
            k = int(pick * len(open_users))
            user = open_users[k]
        else:
            user = len(base_lens)
            base_lens.append(int(np.clip(round(length), shape.min_len, shape.base_cap)))
            counts.append(0)
            open_users.append(user)
            k = len(open_users) - 1
        visit = counts[user]
        counts[user] += 1
        if counts[user] >= shape.max_visits:
            open_users[k] = open_users[-1]  # swap-remove
            open_users.pop()
        low, high = mix.late_gap_ms if cls == "late" else mix.gap_ms
        gap_s = (low + gap_u * (high - low)) / 1e3 if cls in ("follow", "late") else 0.0
        visits.append(Visit(Request(t, user, visit, gap_s, cand_seed), cls, not no_pre, not no_rank))
    spec = WorkloadSpec(num_users=len(base_lens), num_requests=len(visits), qps=rate, median_len=shape.median_len,
                        length_sigma=0.5, min_len=shape.min_len, max_len=shape.max_len, zipf_a=0.0,
                        gap_ms=sum(mix.gap_ms) / 2, min_gap_ms=mix.gap_ms[0], num_candidates=shape.num_candidates,
                        growth_per_visit=shape.growth, num_items=num_items, num_actions=num_actions, seed=seed)
    workload = Workload(spec, base_lens, [v.request for v in visits], counts)
    return SoakWorkload(workload, visits, duration_s)


def mix_summary(soak: SoakWorkload) -> dict[str, Any]:
    """The drawn mix (to compare with the asked one)."""
    n = max(len(soak.visits), 1)
    classes = Counter(v.cls for v in soak.visits)
    pre = [v for v in soak.visits if v.sends_preinfer]
    ranks = [v for v in soak.visits if v.sends_rank]
    lens = [soak.workload.base_lens[v.request.user] + v.request.visit * soak.workload.spec.growth_per_visit
            for v in soak.visits]
    return {"visits": len(soak.visits), "users": len(soak.workload.base_lens),
            "classes": {c: classes.get(c, 0) / n for c in CLASSES},
            "returning": sum(v.request.visit > 0 for v in soak.visits) / n,
            "no_header_preinfer": sum(not v.preinfer_header for v in pre) / max(len(pre), 1),
            "no_header_rank": sum(not v.rank_header for v in ranks) / max(len(ranks), 1),
            "history_len": {"min": min(lens, default=0), "median": float(np.median(lens)) if lens else 0.0,
                            "max": max(lens, default=0)}}


# ---------------------------------------------------------------------- outcomes and per-minute rows
@dataclass(frozen=True)
class SoakOutcome:
    endpoint: str  # preinfer | rank
    visit: int  # index into SoakWorkload.visits
    cls: str
    user: int
    scheduled_s: float  # send time, seconds from the start of the load
    latency_ms: float  # from the scheduled send time to the final answer (retries included)
    status: int  # final HTTP status; 0: no answer
    result: str = ""  # pre-infer: trigger reason; rank: cache tier; else http_<status>
    instance: str = ""  # X-RelayGR-Instance of the final answer
    header: bool = True  # sent with the affinity header
    attempts: int = 1
    failure: str = ""  # "" or one of FAILURES (a 400 is not a failure: counted on its own)
    error: str = ""


def _ok(o: SoakOutcome) -> bool:
    return o.status == (202 if o.endpoint == "preinfer" else 200)


def _share(cached: int, n: int) -> dict[str, Any]:
    return {"ranks": n, "cached": cached, "share": cached / n if n else None}


def bucket_of(t_s: float, bucket_s: float, num_buckets: int) -> int:
    return min(max(int(t_s // bucket_s), 0), num_buckets - 1)


def aggregate(outcomes: list[SoakOutcome], bucket_s: float, duration_s: float,
              rss: list[dict[str, Any]] | None = None, disrupted: tuple[int, ...] = (),
              kill_bucket: int | None = None, target: float = TARGET_SHARE) -> list[dict[str, Any]]:
    """One row per bucket of `bucket_s` seconds over `duration_s` (the last one also takes what was sent
    after it). `disrupted`: buckets from the kill to the instance's return, exempt from the target."""
    num_buckets = max(math.ceil(duration_s / bucket_s - 1e-9), 1)
    # users' first accepted pre-infer sent with the header: a later rank "had a pre-infer"
    first_pre: dict[int, float] = {}
    pre_of_visit: dict[int, SoakOutcome] = {}
    for o in outcomes:
        if o.endpoint == "preinfer":
            pre_of_visit[o.visit] = o
            if _ok(o) and o.header:
                first_pre[o.user] = min(first_pre.get(o.user, math.inf), o.scheduled_s)
    rows = []
    for b in range(num_buckets):
        start = b * bucket_s
        length = min(bucket_s, duration_s - start) if b < num_buckets - 1 else max(duration_s - start, 1e-9)
        rows.append({"minute": b, "start_s": start, "length_s": length, "kill": b == kill_bucket,
                     "disrupted": b in disrupted, "visits": 0, "preinfers_sent": 0, "orphan_preinfers": 0,
                     "ranks_sent": 0, "ranks_ok": 0, "_lat": [], "tiers": Counter(), "_wp": [0, 0], "_fo": [0, 0],
                     "preinfer_reasons": Counter(), "status_400": {"preinfer": 0, "rank": 0},
                     "no_header": {"preinfer": 0, "rank": 0, "rank_ok": 0},
                     "failed": dict.fromkeys(FAILURES, 0), "failed_by_endpoint": {"preinfer": 0, "rank": 0},
                     "retries": 0, "answered_by": Counter()})
    for o in outcomes:
        row = rows[bucket_of(o.scheduled_s, bucket_s, num_buckets)]
        row["retries"] += o.attempts - 1
        if o.instance:
            row["answered_by"][o.instance] += 1
        if o.status == 400:
            row["status_400"][o.endpoint] += 1
        if o.failure:
            row["failed"][o.failure] += 1
            row["failed_by_endpoint"][o.endpoint] += 1
        if not o.header:
            row["no_header"][o.endpoint] += 1
        if o.endpoint == "preinfer":
            row["preinfers_sent"] += 1
            row["orphan_preinfers"] += o.cls == "orphan"
            if _ok(o):
                row["preinfer_reasons"][o.result] += 1
            if o.cls != "rank_only":  # a visit's arrival is its pre-infer (rank_only: its rank)
                row["visits"] += 1
            continue
        row["ranks_sent"] += 1
        row["visits"] += o.cls == "rank_only"
        if not _ok(o):
            continue
        row["ranks_ok"] += 1
        row["_lat"].append(o.latency_ms)
        row["tiers"][o.result] += 1
        if not o.header:
            row["no_header"]["rank_ok"] += 1
            continue
        cached = o.result in CACHED
        if first_pre.get(o.user, math.inf) <= o.scheduled_s:
            row["_wp"][0] += 1
            row["_wp"][1] += cached
        pre = pre_of_visit.get(o.visit)
        if o.cls == "follow" and pre is not None and _ok(pre) and pre.header:
            row["_fo"][0] += 1
            row["_fo"][1] += cached
    for row in rows:
        lat = row.pop("_lat")
        (n_wp, c_wp), (n_fo, c_fo) = row.pop("_wp"), row.pop("_fo")
        row["with_preinfer"] = _share(c_wp, n_wp)
        row["followed"] = _share(c_fo, n_fo)
        row["goodput_rps"] = row["ranks_ok"] / row["length_s"]
        row["p50_ms"] = percentile(lat, 50) if lat else None
        row["p99_ms"] = percentile(lat, 99) if lat else None
        row["orphan_share"] = row["orphan_preinfers"] / row["preinfers_sent"] if row["preinfers_sent"] else None
        row["tiers"] = dict(sorted(row["tiers"].items()))
        row["preinfer_reasons"] = dict(sorted(row["preinfer_reasons"].items()))
        row["answered_by"] = dict(sorted(row["answered_by"].items()))
        share = row["followed"]["share"]
        row["target_met"] = None if share is None else share >= target
        row["rss_mb"] = {}
    cpu: dict[tuple[int, str], list[float]] = {}
    for sample in rss or []:
        b = bucket_of(sample["t_s"], bucket_s, num_buckets)
        inst = sample["instance"]
        if sample.get("rss_mb") is not None:
            rows[b]["rss_mb"][inst] = max(rows[b]["rss_mb"].get(inst, 0.0), sample["rss_mb"])
        if sample.get("cpu_cores") is not None:
            cpu.setdefault((b, inst), []).append(sample["cpu_cores"])
    for row in rows:
        row["cpu_cores"] = {inst: sum(v) / len(v) for (b, inst), v in sorted(cpu.items()) if b == row["minute"]}
    return rows


def _fmt(v: float | None, spec: str) -> str:
    return "-" if v is None else format(v, spec)


def row_line(row: dict[str, Any], bucket_s: float) -> str:
    """The progress line of one bucket."""
    mark = " KILL" if row["kill"] else (" (disrupted)" if row["disrupted"] else "")
    fo, wp = row["followed"], row["with_preinfer"]
    fails = sum(row["failed"].values())
    reasons = ",".join(f"{k}:{v}" for k, v in row["preinfer_reasons"].items())
    rss = ",".join(f"{k}:{v:.0f}" for k, v in sorted(row["rss_mb"].items()))
    cpu = ",".join(f"{k}:{v:.2f}" for k, v in sorted(row["cpu_cores"].items()))
    return (f"min {row['minute']:>2}{mark} [{row['start_s']:.0f}-{row['start_s'] + row['length_s']:.0f} s]: "
            f"hit followed {_fmt(fo['share'], '.2f')} ({fo['cached']}/{fo['ranks']}), with pre-infer "
            f"{_fmt(wp['share'], '.2f')}; goodput {row['goodput_rps']:.1f} r/s, p99 {_fmt(row['p99_ms'], '.0f')} ms; "
            f"pre-infers {row['preinfers_sent']} (orphans {_fmt(row['orphan_share'], '.2f')}) {reasons}; "
            f"400 pre/rank {row['status_400']['preinfer']}/{row['status_400']['rank']}; failed {fails} "
            f"{ {k: v for k, v in row['failed'].items() if v} or ''}; retries {row['retries']}; "
            f"RSS MB {rss or '-'}; CPU cores {cpu or '-'}")


def format_table(report: dict[str, Any]) -> str:
    rows = report["per_minute"]
    insts = sorted({i for r in rows for i in r["rss_mb"]} | {f"i{k}" for k in range(report["instances"])})
    head = (f"{'min':>4} {'':4} | {'followed':>14} {'w/ pre':>6} | {'good/s':>6} {'p50':>5} {'p99':>6} | "
            f"{'pre':>4} {'orph':>4} {'adm':>4} {'foot':>4} {'load':>4} {'n_a_r':>5} {'cach':>4} {'infl':>4} | "
            f"{'400p':>4} {'400r':>4} | {'conn':>4} {'tmo':>4} {'5xx':>4} {'4xx':>4} {'retr':>4} | {'cores':>5} | "
            + " ".join(f"{'RSS ' + i:>8}" for i in insts))
    title = (f"bench soak: {report['instances']} instances behind nginx, {report['rate']:g} users/s, "
             f"{report['minutes']:g} min in buckets of {report['bucket_s']:g} s; hit = served from device, inflight, "
             f"partial or dram; target: followed >= {TARGET_SHARE:.0%} outside the kill")
    lines = [title, head, "-" * len(head)]
    for r in rows:
        fo, reasons, f = r["followed"], r["preinfer_reasons"], r["failed"]
        mark = "KILL" if r["kill"] else ("dis" if r["disrupted"] else ("ok" if r["target_met"] else
                                                                      ("" if r["target_met"] is None else "MISS")))
        followed = f"{_fmt(fo['share'], '.2f')} {fo['cached']:>4}/{fo['ranks']:<4}"
        lines.append(
            f"{r['minute']:>4} {mark:4} | {followed:>14} {_fmt(r['with_preinfer']['share'], '6.2f'):>6} | "
            f"{r['goodput_rps']:>6.1f} {_fmt(r['p50_ms'], '5.0f'):>5} {_fmt(r['p99_ms'], '6.0f'):>6} | "
            f"{r['preinfers_sent']:>4} {_fmt(r['orphan_share'], '4.2f'):>4} {reasons.get('admitted', 0):>4} "
            f"{reasons.get('footprint', 0):>4} {reasons.get('load', 0):>4} {reasons.get('not_at_risk', 0):>5} "
            f"{reasons.get('already_cached', 0):>4} {reasons.get('inflight', 0):>4} | "
            f"{r['status_400']['preinfer']:>4} {r['status_400']['rank']:>4} | {f['connection']:>4} {f['timeout']:>4} "
            f"{f['5xx']:>4} {f['4xx']:>4} {r['retries']:>4} | "
            f"{_fmt(sum(r['cpu_cores'].values()) if r['cpu_cores'] else None, '5.2f'):>5} | "
            + " ".join(f"{_fmt(r['rss_mb'].get(i), '8.0f'):>8}" for i in insts))
    kill = report.get("kill")
    if kill:
        lines.append(f"kill: {kill['instance']} SIGKILLed at {kill['at_s']:.1f} s (minute {kill['minute']}); "
                     + (f"ready again at {kill['ready_s']:.1f} s (minute {kill['ready_minute']}, restart took "
                        f"{kill['restart_s']:.1f} s); {kill['answers_after_restart']} answers from it afterwards"
                        if kill.get("ready_s") is not None else f"not back: {kill.get('error')}"))
    s = report["summary"]
    lines.append(f"followed their pre-infer: {_fmt(s['followed_share'], '.3f')} served from a cache outside the "
                 f"disrupted minutes; target met in {s['target_met_minutes']} of {s['target_minutes']} minutes. "
                 f"Failed at the client: {s['failed']}; 400s: {s['status_400']}")
    return "\n".join(lines)


# ---------------------------------------------------------------------- HTTP
class SoakTarget(HTTPTarget):
    """HTTPTarget's bodies and kept-alive connections, with the affinity header optional."""

    def send(self, endpoint: str, req: Request, with_header: bool) -> Answer:
        hdrs = dict(JSON_CONTENT)
        if with_header:
            hdrs[headers.AFFINITY] = headers.encode_affinity(user_id(req.user))
        return self._connection().post(f"{self._path_prefix}/v1/{endpoint}", self._body(endpoint, req), hdrs)


def send_with_retries(target: SoakTarget, soak: SoakWorkload, endpoint: str, index: int, scheduled: float,
                      start: float, retries: int) -> SoakOutcome:
    """One request of the workload, a 503 retried at once up to `retries` times; never raises."""
    visit = soak.visits[index]
    header = visit.preinfer_header if endpoint == "preinfer" else visit.rank_header
    attempts, status, result, instance, failure, error = 0, 0, "", "", "", ""
    while True:
        attempts += 1
        try:
            answer = target.send(endpoint, visit.request, header)
        except TimeoutError as exc:  # before OSError: it is one
            status, instance, failure, error = 0, "", "timeout", f"{type(exc).__name__}: {exc}"
            break
        except (OSError, http.client.HTTPException) as exc:
            status, instance, failure, error = 0, "", "connection", f"{type(exc).__name__}: {exc}"
            break
        status = answer.status
        instance = answer.headers.get(headers.INSTANCE.lower(), "")
        if status == 503 and attempts <= retries:
            continue
        break
    if status in (200, 202) and status == (202 if endpoint == "preinfer" else 200):
        try:
            body = answer.json()
            result = str(body["reason"] if endpoint == "preinfer" else body["cache"])
        except (ValueError, KeyError, TypeError) as exc:
            failure, error = "other", f"unreadable answer: {exc}"
    elif status:
        result = f"http_{status}"
        if status >= 500:
            failure = "5xx"
        elif status != 400:
            failure = "4xx" if 400 <= status < 500 else "other"
        if failure:
            error = answer.body[:200].decode(errors="replace")
    latency = (time.perf_counter() - scheduled) * 1e3
    return SoakOutcome(endpoint, index, visit.cls, visit.request.user, scheduled - start, latency, status, result,
                       instance, header, attempts, failure, error)


def cpu_seconds(pid: int) -> float | None:
    """User + system CPU time of `pid` so far (None if it is gone)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return None


def rss_mb(pid: int) -> float | None:
    """VmRSS of `pid` in MB (None if it is gone)."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


# ---------------------------------------------------------------------- the run
@dataclass(frozen=True)
class SoakSpec:
    """What `relaygr bench soak` runs."""

    config_path: str
    run_dir: Path
    overrides: tuple[str, ...] = ()  # the instances' overrides: the bench's defaults, then the user's
    instances: int = 2
    minutes: float = 10.0
    # users per second: half of the 48/s at which two tiny instances (4 slots each) began to lose hits to
    # `footprint` refusals (followed share 0.93-0.97) and their rank P99 rose to 94-133 ms, on 2 shared cores
    rate: float = 24.0
    kill_at: float | None = 0.5  # fraction of the run; None: no kill
    kill_instance: str = "i0"
    bucket_s: float = 60.0
    rss_every_s: float = 5.0
    max_workers: int = 32
    timeout_s: float = 30.0  # client read timeout and nginx proxy_read_timeout
    ready_timeout_s: float = 900.0
    seed: int = 0
    mix: SoakMix = SoakMix()
    shape: HistoryShape = HistoryShape()

    def __post_init__(self) -> None:
        if self.instances < 1 or self.minutes <= 0 or self.rate <= 0 or self.bucket_s <= 0:
            raise ConfigError("instances >= 1, minutes, rate and bucket_s > 0")
        if self.kill_at is not None and not 0 < self.kill_at < 1:
            raise ConfigError(f"kill_at={self.kill_at}: must be in (0, 1)")
        if self.kill_at is not None and self.kill_instance not in [f"i{k}" for k in range(self.instances)]:
            raise ConfigError(f"kill_instance={self.kill_instance!r}: not one of i0..i{self.instances - 1}")
        if self.rss_every_s <= 0 or self.max_workers < 1 or self.timeout_s <= 0:
            raise ConfigError("rss_every_s and timeout_s must be > 0, max_workers >= 1")

    @property
    def duration_s(self) -> float:
        return self.minutes * 60.0


@dataclass
class _Run:
    """Shared state of the threads of one run."""

    start: float = 0.0
    stop: threading.Event = field(default_factory=threading.Event)
    lock: threading.Lock = field(default_factory=threading.Lock)  # outcomes, rss, kill
    cluster_lock: threading.Lock = field(default_factory=threading.Lock)  # members: kill/restart vs stop
    outcomes: list[SoakOutcome] = field(default_factory=list)
    rss: list[dict[str, Any]] = field(default_factory=list)
    kill: dict[str, Any] = field(default_factory=dict)

    def now(self) -> float:
        return time.perf_counter() - self.start


def disrupted_buckets(kill: dict[str, Any], bucket_s: float, duration_s: float) -> tuple[int, ...]:
    """The buckets from the kill to the killed instance's return (to the end when it did not return)."""
    if not kill or kill.get("at_s") is None:
        return ()
    n = max(math.ceil(duration_s / bucket_s - 1e-9), 1)
    first = bucket_of(kill["at_s"], bucket_s, n)
    last = bucket_of(kill["ready_s"], bucket_s, n) if kill.get("ready_s") is not None else n - 1
    return tuple(range(first, last + 1))


def _rows(run: _Run, bench: SoakSpec) -> list[dict[str, Any]]:
    with run.lock:
        outcomes, rss, kill = list(run.outcomes), list(run.rss), dict(run.kill)
    n = max(math.ceil(bench.duration_s / bench.bucket_s - 1e-9), 1)
    kill_bucket = bucket_of(kill["at_s"], bench.bucket_s, n) if kill.get("at_s") is not None else None
    return aggregate(outcomes, bench.bucket_s, bench.duration_s, rss,
                     disrupted_buckets(kill, bench.bucket_s, bench.duration_s), kill_bucket)


def _sample_rss(run: _Run, urls: dict[str, str], every_s: float) -> None:
    session = requests.Session()
    session.trust_env = False  # loopback only
    last: dict[int, tuple[float, float]] = {}  # pid -> (time, CPU seconds) at its previous sample
    client = (run.now(), sum(os.times()[:2]))
    while not run.stop.wait(every_s):
        for name, url in urls.items():
            try:
                pid = int(session.get(f"{url}/v1/stats", timeout=(1, 5)).json()["pid"])
            except (requests.RequestException, ValueError, KeyError, TypeError):
                continue  # dead or restarting: no sample
            mb, cpu, t = rss_mb(pid), cpu_seconds(pid), run.now()
            if mb is None or cpu is None:
                continue
            prev = last.get(pid)
            last[pid] = (t, cpu)
            cores = (cpu - prev[1]) / (t - prev[0]) if prev and t > prev[0] else None
            with run.lock:
                run.rss.append({"t_s": t, "instance": name, "pid": pid, "rss_mb": mb, "cpu_cores": cores})
        t, cpu = run.now(), sum(os.times()[:2])  # this process: the load generator
        with run.lock:
            run.rss.append({"t_s": t, "instance": "client", "pid": os.getpid(), "rss_mb": None,
                            "cpu_cores": (cpu - client[1]) / (t - client[0]) if t > client[0] else None})
        client = (t, cpu)
    session.close()


def _kill_and_restart(run: _Run, cluster: Any, bench: SoakSpec, say: Say) -> None:
    at_s = bench.kill_at * bench.duration_s
    if run.stop.wait(max(at_s - run.now(), 0.0)):
        return
    name = bench.kill_instance
    try:
        with run.cluster_lock:
            if run.stop.is_set():
                return
            t = run.now()
            old_pid = cluster.kill_instance(name)
            with run.lock:
                run.kill.update(instance=name, at_s=t, old_pid=old_pid)
            say(f"SIGKILLed instance {name} (gunicorn master pid {old_pid}) at {t:.1f} s; restarting it")
            new = cluster.restart_instance(name)
            with run.lock:
                run.kill.update(restart_started_s=run.now(), new_pid=new.pid)
        cluster.wait_ready(name, bench.ready_timeout_s)
        t_ready = run.now()
        with run.lock:
            run.kill.update(ready_s=t_ready, restart_s=t_ready - t)
        say(f"instance {name} ready again at {t_ready:.1f} s ({t_ready - t:.1f} s after the kill)")
    except Exception as exc:  # noqa: BLE001 - recorded; the run goes on with the instance down
        with run.lock:
            run.kill["error"] = f"{type(exc).__name__}: {exc}"
        if not run.stop.is_set():
            say(f"restart of {name} failed: {exc}")


def _report_progress(run: _Run, bench: SoakSpec, scheduled: Counter, last_event_s: float, say: Say) -> None:
    """Print each bucket's line once its requests are answered (or `timeout_s` after it ends)."""
    n = max(math.ceil(bench.duration_s / bench.bucket_s - 1e-9), 1)
    b = 0
    while b < n and not run.stop.wait(0.5):
        end = min((b + 1) * bench.bucket_s, bench.duration_s) if b < n - 1 else max(bench.duration_s, last_event_s)
        if run.now() < end:
            continue
        with run.lock:
            done = sum(1 for o in run.outcomes if bucket_of(o.scheduled_s, bench.bucket_s, n) == b)
        if done < scheduled[b] and run.now() < end + bench.timeout_s + 5:
            continue
        say(row_line(_rows(run, bench)[b], bench.bucket_s))
        b += 1


def run_soak(bench: SoakSpec, soak: SoakWorkload, say: Say) -> dict[str, Any]:
    """Start the cluster, send the workload, kill and restart an instance; the cluster is always stopped."""
    from serving.cluster import Cluster, ClusterSpec

    config = load_config(bench.config_path, list(bench.overrides))
    spec = ClusterSpec(port=free_port_block(bench.instances + 1), num_instances=bench.instances, run_dir=bench.run_dir,
                       config_path=bench.config_path, overrides=bench.overrides, host=HOST,
                       read_timeout_s=bench.timeout_s, max_body_bytes=config.serving.max_content_length,
                       max_conns=config.serving.threads)
    events = soak.events()
    n = max(math.ceil(bench.duration_s / bench.bucket_s - 1e-9), 1)
    scheduled = Counter(bucket_of(t, bench.bucket_s, n) for t, _, _ in events)
    target = SoakTarget(f"http://{HOST}:{spec.port}", soak.workload, timeout_s=(2.0, bench.timeout_s))
    say(f"encoding {len(events)} request bodies")
    target.prepare([v.request for v in soak.visits])
    cluster = Cluster(spec)
    run = _Run()
    threads: list[threading.Thread] = []
    interrupted = False
    startup_s = 0.0
    pool = ThreadPoolExecutor(bench.max_workers, thread_name_prefix="soak")
    try:
        say(f"starting nginx + {bench.instances} instances (logs in {bench.run_dir / 'logs'})")
        t0 = time.perf_counter()
        cluster.start(bench.ready_timeout_s)
        startup_s = time.perf_counter() - t0
        say(f"ready in {startup_s:.0f} s: nginx on http://{HOST}:{spec.port}; sending {len(soak.visits)} visits "
            f"({len(events)} requests) over {bench.minutes:g} min")
        run.start = time.perf_counter()
        urls = {i: f"http://{HOST}:{p}" for i, p in zip(spec.instance_ids, spec.instance_ports, strict=True)}
        last_event_s = events[-1][0] if events else 0.0
        threads = [threading.Thread(target=_sample_rss, args=(run, urls, bench.rss_every_s), daemon=True),
                   threading.Thread(target=_report_progress, args=(run, bench, scheduled, last_event_s, say),
                                    daemon=True)]
        if bench.kill_at is not None:
            threads.append(threading.Thread(target=_kill_and_restart, args=(run, cluster, bench, say), daemon=True))
        for t in threads:
            t.start()

        def call(endpoint: str, index: int, at: float) -> None:
            outcome = send_with_retries(target, soak, endpoint, index, at, run.start, bench.mix.retries)
            with run.lock:
                run.outcomes.append(outcome)

        futures = []
        for at_s, endpoint, index in events:
            at = run.start + at_s
            delay = at - time.perf_counter()
            if delay > 0:
                time.sleep(delay)
            futures.append(pool.submit(call, endpoint, index, at))
        for f in futures:
            f.result()
        threads[1].join(timeout=bench.timeout_s + 10)  # the last buckets' lines
    except KeyboardInterrupt:
        interrupted = True
        say("interrupted: stopping the cluster, writing what was measured")
    finally:
        run.stop.set()
        pool.shutdown(wait=False, cancel_futures=True)
        with run.cluster_lock:
            cluster.stop()
        target.close()
        for t in threads:
            t.join(timeout=5)
    return build_report(run, bench, soak, config, startup_s, interrupted, events)


def build_report(run: _Run, bench: SoakSpec, soak: SoakWorkload, config: RelayGRConfig, startup_s: float,
                 interrupted: bool, events: list[tuple[float, str, int]]) -> dict[str, Any]:
    rows = _rows(run, bench)
    with run.lock:
        outcomes, rss, kill = list(run.outcomes), list(run.rss), dict(run.kill)
    n = len(rows)
    if kill:
        kill["minute"] = bucket_of(kill["at_s"], bench.bucket_s, n)
        if kill.get("ready_s") is not None:
            kill["ready_minute"] = bucket_of(kill["ready_s"], bench.bucket_s, n)
            kill["answers_after_restart"] = sum(1 for o in outcomes if o.instance == kill["instance"]
                                                and o.scheduled_s >= kill["ready_s"] and o.status)
        kill["failed_requests"] = [
            {"t_s": round(o.scheduled_s, 3), "minute": bucket_of(o.scheduled_s, bench.bucket_s, n),
             "endpoint": o.endpoint, "failure": o.failure, "status": o.status, "error": o.error[:160]}
            for o in sorted(outcomes, key=lambda o: o.scheduled_s)
            if o.failure and o.scheduled_s >= kill["at_s"] - bench.timeout_s
            and o.scheduled_s <= kill.get("ready_s", math.inf) + 10][:200]
    undisrupted = [r for r in rows if not r["disrupted"]]
    fo_n = sum(r["followed"]["ranks"] for r in undisrupted)
    fo_c = sum(r["followed"]["cached"] for r in undisrupted)
    judged = [r for r in undisrupted if r["target_met"] is not None]
    failed = Counter()
    for r in rows:
        failed.update({k: v for k, v in r["failed"].items() if v})
    summary = {
        "requests_scheduled": len(events), "requests_answered": sum(1 for o in outcomes if o.status),
        "followed_share": fo_c / fo_n if fo_n else None, "followed_ranks": fo_n,
        "target_minutes": len(judged), "target_met_minutes": sum(1 for r in judged if r["target_met"]),
        "failed": dict(failed),
        "status_400": {e: sum(r["status_400"][e] for r in rows) for e in ("preinfer", "rank")},
        "no_header_ranks_answered": sum(r["no_header"]["rank_ok"] for r in rows),
        "no_header_ranks_sent": sum(r["no_header"]["rank"] for r in rows),
        "retries": sum(r["retries"] for r in rows),
        "preinfer_reasons": dict(sum((Counter(r["preinfer_reasons"]) for r in rows), Counter())),
        "tiers": dict(sum((Counter(r["tiers"]) for r in rows), Counter())),
    }
    return {"bench": "soak", "config": bench.config_path, "overrides": list(bench.overrides),
            "instances": bench.instances, "minutes": bench.minutes, "rate": bench.rate, "bucket_s": bench.bucket_s,
            "duration_s": bench.duration_s, "kill_at": bench.kill_at, "seed": bench.seed,
            "mix": {**asdict(bench.mix), "follow": bench.mix.follow, "described": bench.mix.describe()},
            "mix_drawn": mix_summary(soak), "history": asdict(bench.shape),
            "client": {"max_workers": bench.max_workers, "timeout_s": bench.timeout_s,
                       "rss_every_s": bench.rss_every_s},
            "slo_ms": config.trigger.slo_ms, "risk_margin": config.trigger.risk_margin,
            "num_slots": config.cache.num_slots, "startup_s": startup_s, "interrupted": interrupted,
            "target_share": TARGET_SHARE, "cached_tiers": list(CACHED), "kill": kill or None,
            "minutes_table": None, "per_minute": rows, "rss": rss, "summary": summary}


# ---------------------------------------------------------------------- command line
def register(bench_subparsers: argparse._SubParsersAction) -> None:
    """Add `relaygr bench soak` to the `relaygr bench` subcommands."""
    d, shape = SoakMix(), HistoryShape()
    p = bench_subparsers.add_parser("soak", help="minutes of a realistic cascade (orphan pre-infers, ranks without "
                                                 "pre-infer, missing affinity headers, retries) on N instances behind "
                                                 "nginx, one instance killed and restarted half-way")
    add_instance_config_args(p, "tiny")
    p.add_argument("--instances", type=int, default=2)
    p.add_argument("--minutes", type=float, default=10.0, help="length of the load (fractions allowed)")
    p.add_argument("--rate", type=float, default=SoakSpec.rate, help="arriving users (visits) per second")
    p.add_argument("--kill-at", type=float, default=0.5, help="SIGKILL an instance at this fraction of the run")
    p.add_argument("--no-kill", action="store_true", help="no instance is killed")
    p.add_argument("--kill-instance", default="i0", help="the instance killed")
    p.add_argument("--orphan", type=float, default=d.orphan, help="share of visits that pre-infer and never rank")
    p.add_argument("--rank-only", type=float, default=d.rank_only, help="share of visits that rank without pre-infer")
    p.add_argument("--late", type=float, default=d.late, help="share of visits that rank after --late-gap-ms")
    p.add_argument("--no-header", type=float, default=d.no_header,
                   help="share of requests sent without the affinity header")
    p.add_argument("--returning", type=float, default=d.returning,
                   help="share of visits by a returning user (history grown by --growth per visit)")
    p.add_argument("--retries", type=int, default=d.retries, help="immediate retries of a 503")
    p.add_argument("--gap-ms", type=float, nargs=2, default=list(d.gap_ms), metavar=("LOW", "HIGH"),
                   help="retrieval -> ranking gap of the follow visits (uniform)")
    p.add_argument("--late-gap-ms", type=float, nargs=2, default=list(d.late_gap_ms), metavar=("LOW", "HIGH"))
    p.add_argument("--median-len", type=int, default=shape.median_len, help="median history length (events)")
    p.add_argument("--min-len", type=int, default=shape.min_len)
    p.add_argument("--max-len", type=int, default=None, help="longest history (default: what the model takes)")
    p.add_argument("--growth", type=int, default=shape.growth, help="events a history grows by per visit")
    p.add_argument("--max-visits", type=int, default=shape.max_visits, help="visits of one user at most")
    p.add_argument("--candidates", type=int, default=shape.num_candidates)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--bucket-s", type=float, default=60.0, help="length of a reported 'minute' (s)")
    p.add_argument("--rss-every", type=float, default=5.0, help="RSS sampling period (s)")
    p.add_argument("--max-workers", type=int, default=32, help="client threads (bounded pool)")
    p.add_argument("--timeout", type=float, default=30.0, help="client read timeout = nginx proxy_read_timeout (s)")
    p.add_argument("--ready-timeout", type=float, default=900.0, help="max start-up / restart time (s)")
    p.add_argument("--no-bench-overrides", action="store_true",
                   help=f"do not apply the bench's default overrides {list(DEFAULT_BENCH_OVERRIDES)}")
    p.add_argument("--out", default=DEFAULT_OUT,
                   help="the JSON; the plot (.png), the resolved config (.config.yaml) and the logs (_run/) beside it")
    p.set_defaults(func=cmd_bench_soak)


def spec_from_args(args: argparse.Namespace) -> tuple[SoakSpec, RelayGRConfig]:
    bench_overrides = [] if args.no_bench_overrides else list(DEFAULT_BENCH_OVERRIDES)
    overrides = (*bench_overrides, *args.override)
    config = load_config(args.config, list(overrides))
    model = config.model
    capacity = model.max_seq_len - (1 if model.user_feature_sizes else 0)
    shape = HistoryShape(median_len=args.median_len, min_len=args.min_len,
                         max_len=min(args.max_len or capacity, capacity), growth=args.growth,
                         max_visits=args.max_visits, num_candidates=args.candidates)
    mix = SoakMix(orphan=args.orphan, rank_only=args.rank_only, late=args.late, no_header=args.no_header,
                  returning=args.returning, retries=args.retries, gap_ms=tuple(args.gap_ms),
                  late_gap_ms=tuple(args.late_gap_ms))
    out = Path(args.out).with_suffix("")
    bench = SoakSpec(config_path=str(Path(args.config).resolve()), run_dir=out.with_name(out.name + "_run").resolve(),
                     overrides=overrides, instances=args.instances, minutes=args.minutes, rate=args.rate,
                     kill_at=None if args.no_kill else args.kill_at, kill_instance=args.kill_instance,
                     bucket_s=args.bucket_s, rss_every_s=args.rss_every, max_workers=args.max_workers,
                     timeout_s=args.timeout, ready_timeout_s=args.ready_timeout, seed=args.seed, mix=mix, shape=shape)
    return bench, config


def cmd_bench_soak(args: argparse.Namespace) -> int:
    from mindspore_relaygr.bench import plots
    from mindspore_relaygr.bench.machine import machine_info
    from mindspore_relaygr.bench.model_bench import write_report
    from serving.cluster import sigterm_interrupts

    say = lambda msg: print(f"[soak] {msg}", file=sys.stderr, flush=True)  # noqa: E731
    bench, config = spec_from_args(args)
    soak = generate_soak(bench.mix, bench.rate, bench.duration_s, bench.shape, config.model.num_items,
                         config.model.num_actions, bench.seed)
    check_workload(config, soak.workload.spec)
    drawn = mix_summary(soak)
    say(f"config {args.config}; overrides {list(bench.overrides)} (bench defaults "
        f"{[] if args.no_bench_overrides else list(DEFAULT_BENCH_OVERRIDES)}: every history at risk)")
    say(f"mix: {bench.mix.describe()}")
    say(f"{bench.rate:g} users/s for {bench.minutes:g} min: {drawn['visits']} visits of {drawn['users']} users, "
        f"histories {drawn['history_len']['min']}..{drawn['history_len']['max']} events, {bench.shape.num_candidates} "
        f"candidates; kill: " + (f"{bench.kill_instance} at {bench.kill_at:.0%}" if bench.kill_at else "none"))
    machine = machine_info()  # before the servers start: measured after they stop, the CPU is still busy
    with sigterm_interrupts():  # SIGTERM stops nginx and the instances, like Ctrl-C
        report = run_soak(bench, soak, say)
    out = Path(args.out).with_suffix("")
    json_path, png_path, cfg_path = (out.with_name(out.name + ext) for ext in (".json", ".png", ".config.yaml"))
    report["command"] = shlex.join(["relaygr", *sys.argv[1:]]) if sys.argv[1:3] == ["bench", "soak"] else None
    report["args"] = {k: v for k, v in vars(args).items() if k != "func"}
    report["bench_overrides"] = [] if args.no_bench_overrides else list(DEFAULT_BENCH_OVERRIDES)
    report["user_overrides"] = list(args.override)
    report["machine"] = machine
    table = format_table(report)
    report["minutes_table"] = table.splitlines()
    write_report(report, json_path)
    save_config(load_config(bench.config_path, list(bench.overrides)), cfg_path)
    plots.plot_soak(report, png_path)
    print(table)
    print(f"[soak] wrote {json_path}, {png_path} and {cfg_path}")
    return 130 if report["interrupted"] else 0
