"""Serving bundle: everything a server needs to start from a trained ranker, verified on load.

A bundle directory holds:

    config.yaml     the resolved config; `model.version` = the bundle's model version
    model.ckpt      the HSTUNet weights (`RelayGRModel.save_checkpoint`)
    items.json      item vocabulary: raw -> dense ids, dense id -> title
    users.json      user vocabulary: raw -> dense ids, dense id -> features, the features' names and their
                    vocabularies (raw value -> id)
    events.json     the event column, its types in action-id order, the label rule of the second task
    prefix_p{P}.mindir                 prefix tokens -> per-layer K [L, h, P, dqk], V [L, h, P, dv]
    candidate_p{P}_s{S}_m{M}.mindir    K, V, past meta, suffix tokens, candidates -> logits [M, tasks]
    candidate_b{B}_p{P}_s{S}_m{M}.mindir   the same for B users at once -> logits [B, M, tasks] (batch buckets
                                       > 1 up to the one holding relay.max_rank_batch; none when it is 1)
    manifest.json   format, model version, and the sha256 and size of every file above

The model version is `<name>-<first 12 hex digits of the checkpoint's sha256>` (name: `bundle_name` of the
data, unless given): it is part of every cache
key, so caches of different weights never mix. The MindIR graphs are pure functions (no pool, reference
ops) built on `HSTUNet.encode`, one file per static shape; by default the covering set (each prefix bucket,
and per prefix bucket the largest suffix and candidate buckets, which padding makes valid for any smaller
request); `all_buckets=True` exports every combination. Their input order is in the manifest.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import re
import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from mindspore_relaygr.config import ConfigError, RelayGRConfig, load_config, save_config
from mindspore_relaygr.errors import BundleError
from mindspore_relaygr.model.graph_inputs import PER_USER, input_names, input_specs

logger = logging.getLogger(__name__)

BUNDLE_FORMAT = 2  # 2: events.json and the user features' vocabularies (raw ids served)
MANIFEST_FILE = "manifest.json"
CONFIG_FILE = "config.yaml"
CHECKPOINT_FILE = "model.ckpt"
ITEMS_FILE = "items.json"
USERS_FILE = "users.json"
EVENTS_FILE = "events.json"
REQUIRED_FILES = (CONFIG_FILE, CHECKPOINT_FILE, ITEMS_FILE, USERS_FILE, EVENTS_FILE)


@dataclass(frozen=True)
class Vocabulary:
    """Raw <-> dense ids of a model's data (items, event types, user features) and side information, as a server
    needs them to speak the catalogue's ids."""

    item_vocab: dict[int | str, int]  # raw item id (an integer, or text: an SKU, an ML-1M title) -> dense id
    user_vocab: dict[int | str, int]  # raw user id -> dense id
    item_titles: dict[int, str]  # dense item id -> title
    user_features: dict[int, tuple[int, ...]]  # dense user id -> feature ids
    user_feature_names: tuple[str, ...] = ()
    event_types: tuple[int | str, ...] = ()  # raw event type of each action id; (): one type, no event column
    user_feature_vocabs: tuple[dict[int | str, int], ...] = ()  # per feature: raw value -> feature id (1..)
    event_column: str | None = None
    label_rule: dict[str, Any] = dataclasses.field(default_factory=dict)

    @classmethod
    def from_interactions(cls, data: Any) -> Vocabulary:
        """From `data.events.Interactions`."""
        return cls(dict(data.item_vocab), dict(data.user_vocab), dict(data.item_titles),
                   {u: tuple(f) for u, f in data.user_features.items()}, tuple(data.user_feature_names),
                   tuple(data.event_types), tuple(dict(v) for v in data.user_feature_vocabs), data.event_column,
                   dict(data.label_rule))

    def items_json(self) -> dict[str, Any]:
        return {"raw_to_dense": {str(k): v for k, v in self.item_vocab.items()},
                "titles": {str(k): v for k, v in sorted(self.item_titles.items())}}

    def users_json(self) -> dict[str, Any]:
        return {"raw_to_dense": {str(k): v for k, v in self.user_vocab.items()},
                "feature_names": list(self.user_feature_names),
                "feature_values": [{str(k): v for k, v in vocab.items()} for vocab in self.user_feature_vocabs],
                "features": {str(k): list(v) for k, v in sorted(self.user_features.items())}}

    def events_json(self) -> dict[str, Any]:
        return {"column": self.event_column, "types": list(self.event_types), "label": self.label_rule}

    @classmethod
    def from_json(cls, items: dict[str, Any], users: dict[str, Any], events: dict[str, Any]) -> Vocabulary:
        return cls({_raw_id(k): int(v) for k, v in items["raw_to_dense"].items()},
                   {_raw_id(k): int(v) for k, v in users["raw_to_dense"].items()},
                   {int(k): str(v) for k, v in items["titles"].items()},
                   {int(k): tuple(int(x) for x in v) for k, v in users["features"].items()},
                   tuple(users["feature_names"]), tuple(events["types"]),
                   tuple({_raw_id(k): int(v) for k, v in vocab.items()} for vocab in users["feature_values"]),
                   events["column"], dict(events["label"]))


def _raw_id(key: str) -> int | str:
    """A raw id read back from JSON: integers stay integers, text ids (SKUs, ML-1M's titles) stay strings, as the
    data reader made them (`data.events.canonical`)."""
    from mindspore_relaygr.data.events import canonical

    value = canonical(key)
    return value if isinstance(value, str) or str(value) == key else key


def bundle_name(data_path: str | None) -> str:
    """The model-version prefix of a model trained on `data.path`: the bundled dataset's name without its hyphens
    ("ml-1m" -> "ml1m"; null: ML-100K), else the file's stem (a directory's name), as [A-Za-z0-9_.-] only."""
    from mindspore_relaygr.data.movielens import BUNDLED

    if data_path is None or data_path in BUNDLED:
        return (data_path or "ml-100k").replace("-", "")
    path = Path(data_path)
    stem = path.name if path.is_dir() else path.stem
    if stem in ("u", "ratings") and not path.is_dir():  # MovieLens' u.data, ratings.dat: the directory names it
        stem = path.resolve().parent.name
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", stem).strip("_.-") or "model"


def sha256_file(path: str | Path) -> str:
    digest = hashlib.sha256()
    with Path(path).open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def model_version(name: str, checkpoint: str | Path) -> str:
    """`<name>-<first 12 hex digits of the checkpoint's sha256>`."""
    return f"{name}-{sha256_file(checkpoint)[:12]}"


# ---------------------------------------------------------------- pure-function graphs


def graph_cells(net: Any) -> tuple[Any, Any, Any]:
    """(prefix cell, candidate cell, batched candidate cell) over `net` (an HSTUNet), on the plain backend
    (MindSpore ops), no pool."""
    from mindspore import nn, ops

    from mindspore_relaygr.model.backend import PlainOps
    from mindspore_relaygr.model.batched import heads_batched_logits
    from mindspore_relaygr.model.hstu import take

    backend = PlainOps()  # MindIR runs anywhere MindSpore does: no custom kernels

    def split(stacked, count: int) -> tuple:
        """[count, ...] -> count tensors [...]: Slice, since integer indexing is slow on CPU."""
        return tuple(ops.squeeze(take(stacked, i, i + 1), 0) for i in range(count))

    class OnNet(nn.Cell):
        def __init__(self) -> None:
            super().__init__(auto_prefix=False)  # leave the net's parameter names (checkpoint keys) alone
            self.net, self.backend = net, backend
            self.num_layers = len(net.layers)

    class PrefixKV(OnNet):
        """Prefix tokens -> (K [L, h, P, dqk], V [L, h, P, dv]) of every layer."""

        def construct(self, item_ids, action_ids, user_feats, user_row, pos, hi, lo, valid):
            x = self.net.add_user_token(self.net.embed(item_ids, action_ids, pos), user_feats, user_row)
            keys, values, _, _ = self.net.encode(x, (pos, hi, lo, valid), None, None, None, self.backend)
            return ops.stack(keys), ops.stack(values)

    class CandidateLogits(OnNet):
        """Prefix K/V and meta + suffix tokens + candidates -> candidate logits [M, tasks]; `last` [1] is the row
        of the last suffix event (the user state)."""

        def construct(self, keys, values, past_pos, past_hi, past_lo, past_valid, item_ids, action_ids, pos, hi,
                      lo, valid, cand_ids, cand_pos, cand_hi, cand_lo, last):
            x = self.net.embed(item_ids, action_ids, pos)
            cand = self.net.embed_candidates(cand_ids, cand_pos)
            keys, values = split(keys, self.num_layers), split(values, self.num_layers)  # encode takes them per layer
            views = tuple((keys[i], None, values[i], None) for i in range(len(keys)))  # graph mode: no zip(strict=)
            past = (views, past_pos, past_hi, past_lo, past_valid)
            _, _, hidden, user = self.net.encode(x, (pos, hi, lo, valid), past, cand, (cand_pos, cand_hi, cand_lo),
                                                 self.backend, last)
            return self.net.logits(user, hidden, cand_ids)

    class BatchedCandidateLogits(OnNet):
        """The candidate graph for B users at once: K [B, L, h, P, dqk], V [B, L, h, P, dv] and every other input
        of CandidateLogits with a leading B axis (cand_pos, cand_hi, cand_lo and last: [B]) -> logits [B, M, tasks],
        each user's equal to its own CandidateLogits call."""

        def construct(self, keys, values, past_pos, past_hi, past_lo, past_valid, item_ids, action_ids, pos, hi,
                      lo, valid, cand_ids, cand_pos, cand_hi, cand_lo, last):
            users = item_ids.shape[0]
            keys, values = split(keys, users), split(values, users)
            pasts = []
            for i in range(users):
                pasts.append((split(keys[i], self.num_layers), split(values[i], self.num_layers), past_hi[i],
                              past_lo[i]))
            return heads_batched_logits(self.net, self.backend, (item_ids, action_ids, pos, hi, lo, valid), pasts,
                                        (past_pos, past_valid), (cand_ids, cand_pos, cand_hi, cand_lo), last)

    return PrefixKV(), CandidateLogits(), BatchedCandidateLogits()


def _sizes(config: RelayGRConfig, **sizes: int) -> dict[str, int]:
    m = config.model
    return {"features": max(1, len(m.user_feature_sizes)), "layers": m.num_layers, "heads": m.num_heads,
            "d_qk": m.d_qk, "d_v": m.d_v, **sizes}


def prefix_input_specs(config: RelayGRConfig, bucket: int) -> list[dict[str, Any]]:
    """The exported prefix graph's inputs for `bucket` tokens (model/graph_inputs.py)."""
    return input_specs("export_prefix", _sizes(config, tokens=bucket))


def candidate_input_specs(config: RelayGRConfig, past: int, suffix: int, cands: int) -> list[dict[str, Any]]:
    """The exported candidate graph's inputs (model/graph_inputs.py)."""
    return input_specs("export_candidate", _sizes(config, past=past, suffix=suffix, candidates=cands))


def batched_candidate_input_specs(config: RelayGRConfig, users: int, past: int, suffix: int, cands: int
                                  ) -> list[dict[str, Any]]:
    """The exported candidate graph's inputs for B = `users` users at once (model/graph_inputs.py)."""
    return input_specs("export_candidate_batch", _sizes(config, users=users, past=past, suffix=suffix,
                                                        candidates=cands))


def export_batch_buckets(config: RelayGRConfig) -> list[int]:
    """The batch buckets (> 1) a bundle exports: up to the one holding relay.max_rank_batch users."""
    from mindspore_relaygr.model.inputs import buckets_up_to

    return [b for b in buckets_up_to(config.model.batch_buckets, config.relay.max_rank_batch) if b > 1]


def mindir_plan(config: RelayGRConfig, all_buckets: bool = False) -> dict[str, dict[str, Any]]:
    """File stem -> {graph, inputs}: the MindIR files a bundle holds."""
    m = config.model
    prefix_buckets = [b for b in m.len_buckets if b <= config.cache.max_prefix_len]
    suffixes = m.suffix_buckets if all_buckets else m.suffix_buckets[-1:]
    cand_buckets = m.candidate_buckets if all_buckets else m.candidate_buckets[-1:]
    plan = {f"prefix_p{p}": {"graph": "prefix", "inputs": prefix_input_specs(config, p)} for p in prefix_buckets}
    for p in prefix_buckets:
        for s in suffixes:
            for c in cand_buckets:
                plan[f"candidate_p{p}_s{s}_m{c}"] = {"graph": "candidate",
                                                     "inputs": candidate_input_specs(config, p, s, c)}
                for b in export_batch_buckets(config):
                    plan[f"candidate_b{b}_p{p}_s{s}_m{c}"] = {
                        "graph": "candidate_batch", "inputs": batched_candidate_input_specs(config, b, p, s, c)}
    return plan


def _zeros(spec: dict[str, Any]) -> Any:
    from mindspore import Tensor

    return Tensor(np.zeros(spec["shape"], dtype=np.dtype(spec["dtype"])))


def export_mindir(model: Any, config: RelayGRConfig, out_dir: str | Path, all_buckets: bool = False
                  ) -> dict[str, dict[str, Any]]:
    """Write the MindIR files of `mindir_plan` into `out_dir`; returns file name -> {graph, inputs, outputs}."""
    import mindspore as ms

    cells = dict(zip(("prefix", "candidate", "candidate_batch"), graph_cells(model.net), strict=True))
    for cell in cells.values():
        cell.set_train(False)
    files = {}
    for stem, entry in mindir_plan(config, all_buckets).items():
        t0 = time.perf_counter()
        cell = cells[entry["graph"]]
        ms.export(cell, *(_zeros(s) for s in entry["inputs"]), file_name=str(Path(out_dir) / stem),
                  file_format="MINDIR")
        outputs = ["keys", "values"] if entry["graph"] == "prefix" else ["logits"]
        files[f"{stem}.mindir"] = {**entry, "outputs": outputs}
        logger.info("exported %s.mindir in %.1f s", stem, time.perf_counter() - t0)
    return files


# ---------------------------------------------------------------- bundle write / verify / load


def export_bundle(model: Any, config: RelayGRConfig, vocab: Vocabulary, out_dir: str | Path, name: str = "relaygr",
                  all_buckets: bool = False, overwrite: bool = False) -> Path:
    """Write a serving bundle of `model` (weights) and `config` to `out_dir`; returns the directory.

    The bundle is assembled in a temporary sibling directory and renamed into place, so a reader never
    sees a half-written bundle. An existing `out_dir` is replaced only with `overwrite=True`."""
    out = Path(out_dir)
    if out.exists() and not overwrite:
        raise BundleError(f"bundle directory {out} already exists (pass overwrite=True / --overwrite)")
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    try:
        model.save_checkpoint(tmp / CHECKPOINT_FILE)
        version = model_version(name, tmp / CHECKPOINT_FILE)
        resolved = dataclasses.replace(config, model=dataclasses.replace(config.model, version=version))
        save_config(resolved, tmp / CONFIG_FILE)
        (tmp / ITEMS_FILE).write_text(json.dumps(vocab.items_json(), ensure_ascii=False) + "\n", encoding="utf-8")
        (tmp / USERS_FILE).write_text(json.dumps(vocab.users_json(), ensure_ascii=False) + "\n", encoding="utf-8")
        (tmp / EVENTS_FILE).write_text(json.dumps(vocab.events_json(), ensure_ascii=False) + "\n", encoding="utf-8")
        graphs = export_mindir(model, resolved, tmp, all_buckets)
        _write_manifest(tmp, version, graphs)
        publish_modes(tmp)
        if out.exists():
            shutil.rmtree(out)
        tmp.rename(out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    logger.info("bundle %s written to %s", version, out)
    return out


def publish_modes(root: Path) -> None:
    """Make a bundle readable like an installed package: directories 0755, files 0644. mkdtemp makes the
    directory private and MindSpore writes checkpoints and MindIR files 0400, yet a bundle is an artifact
    that other accounts (a service user) serve from."""
    root.chmod(0o755)
    for path in root.rglob("*"):
        path.chmod(0o755 if path.is_dir() else 0o644)


def _write_manifest(root: Path, version: str, graphs: dict[str, dict[str, Any]]) -> None:
    import mindspore as ms

    files = {p.name: {"sha256": sha256_file(p), "bytes": p.stat().st_size} for p in sorted(root.iterdir())}
    manifest = {"format": BUNDLE_FORMAT, "model_version": version, "mindspore": ms.__version__,
                "created_unix": int(time.time()), "files": files, "mindir": graphs}
    (root / MANIFEST_FILE).write_text(json.dumps(manifest, indent=2) + "\n")


def _read_json(root: Path, name: str) -> Any:
    try:
        return json.loads((root / name).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise BundleError(f"bundle {root}: {name} is unreadable or corrupt ({exc})") from exc


def verify_bundle(path: str | Path) -> dict[str, Any]:
    """Check that every file of the manifest exists with its recorded size and sha256; returns the manifest."""
    root = Path(path)
    if not root.is_dir():
        raise BundleError(f"bundle {root}: not a directory")
    if not (root / MANIFEST_FILE).is_file():
        raise BundleError(f"bundle {root}: {MANIFEST_FILE} is missing")
    manifest = _read_json(root, MANIFEST_FILE)
    fmt = manifest.get("format") if isinstance(manifest, dict) else None
    if fmt != BUNDLE_FORMAT or not isinstance(manifest.get("files"), dict):
        raise BundleError(f"bundle {root}: {MANIFEST_FILE} has format {fmt!r} or no file list; expected format "
                          f"{BUNDLE_FORMAT}")
    files = manifest["files"]
    for name in REQUIRED_FILES:
        if name not in files:
            raise BundleError(f"bundle {root}: {MANIFEST_FILE} does not list {name}")
    for name, meta in files.items():
        file = root / name
        if not file.is_file():
            raise BundleError(f"bundle {root}: file {name} is missing")
        if file.stat().st_size != meta["bytes"] or sha256_file(file) != meta["sha256"]:
            raise BundleError(f"bundle {root}: file {name} is corrupt (size or sha256 differs from {MANIFEST_FILE})")
    return manifest


def load_bundle_config(path: str | Path, overrides: list[str] | None = None) -> RelayGRConfig:
    """The verified bundle's config (with overrides, e.g. cache sizes); its model version must match."""
    root = Path(path)
    manifest = verify_bundle(root)
    try:
        config = load_config(root / CONFIG_FILE, overrides)
    except ConfigError as exc:
        raise BundleError(f"bundle {root}: {CONFIG_FILE} is invalid: {exc}") from exc
    if config.model.version != manifest["model_version"]:
        raise BundleError(f"bundle {root}: model.version={config.model.version!r} differs from the manifest's "
                          f"{manifest['model_version']!r}")
    return config


def load_bundle(path: str | Path, overrides: list[str] | None = None) -> tuple[RelayGRConfig, Any]:
    """Verify a bundle and build its `RelayGRModel` with the bundled weights -> (config, model)."""
    from mindspore_relaygr.model.ranker import RelayGRModel

    root = Path(path)
    config = load_bundle_config(root, overrides)
    model = RelayGRModel(config)
    try:
        model.load_checkpoint(root / CHECKPOINT_FILE)
    except (ValueError, RuntimeError) as exc:
        raise BundleError(f"bundle {root}: {CHECKPOINT_FILE} does not fit the model: {exc}") from exc
    return config, model


def load_vocabulary(path: str | Path) -> Vocabulary:
    """The item/user vocabularies of a bundle (call `verify_bundle` first; `load_bundle` does)."""
    root = Path(path)
    return Vocabulary.from_json(*(_read_json(root, name) for name in (ITEMS_FILE, USERS_FILE, EVENTS_FILE)))


# ---------------------------------------------------------------- MindIR load check


def _pick_candidate_graph(manifest: dict[str, Any], past: int, suffix: int, cands: int, users: int | None = None
                          ) -> tuple[str, int, int, int]:
    """(file, users bucket, suffix bucket, candidate bucket) of the smallest bundled candidate graph that fits:
    the single-user graph (users None), or a batched one (`candidate_batch`) for that many users."""
    graph = "candidate" if users is None else "candidate_batch"
    fits = []
    for name, entry in manifest["mindir"].items():
        if entry["graph"] != graph:
            continue
        shapes = {spec["name"]: spec["shape"] for spec in entry["inputs"]}
        b = 1 if users is None else shapes["item_ids"][0]
        s, m = shapes["item_ids"][-1], shapes["cand_ids"][-1]
        if shapes["past_pos"][-1] == past and b >= (users or 1) and s >= suffix and m >= cands:
            fits.append((b, s, m, name))
    if not fits:
        raise BundleError(f"no bundled {graph} graph takes {users or 1} user(s) with a prefix of {past} tokens, "
                          f"{suffix} suffix events and {cands} candidates")
    b, s, m, name = min(fits)
    return name, b, s, m


def _mindir_request(config: RelayGRConfig, history: Any, candidate_ids: Any, prefix_len: int) -> Any:
    """One request split for the MindIR graphs: (history, candidates, prefix length, prefix tokens, past bucket)."""
    from mindspore_relaygr.model.inputs import bucket_for, validate_candidates, validate_history

    cfg = config.model
    hist, cands = validate_history(cfg, history), validate_candidates(cfg, candidate_ids)
    prefix_len = min(prefix_len, len(hist) - 1)
    prefix_tok = prefix_len + (1 if cfg.has_user_token else 0)
    past = bucket_for(prefix_tok, [b for b in cfg.len_buckets if b <= config.cache.max_prefix_len], "prefix_len")
    return hist, cands, prefix_len, prefix_tok, past


def _mindir_inputs(root: Path, config: RelayGRConfig, request: Any, past: int, suffix_bucket: int,
                   cand_bucket: int) -> tuple[np.ndarray, ...]:
    """The exported candidate graph's inputs of one request (model/graph_inputs.py order), its K/V from the
    prefix graph."""
    import mindspore as ms
    from mindspore import Tensor, nn

    from mindspore_relaygr.train.feeds import candidate_inputs, last_time, prefix_inputs, suffix_inputs

    cfg = config.model
    hist, cands, prefix_len, prefix_tok, _ = request
    prefix, suffix = hist.slice(0, prefix_len), hist.slice(prefix_len)
    prefix_cell = nn.GraphCell(ms.load(str(root / f"prefix_p{past}.mindir")))
    keys, values = prefix_cell(*(Tensor(a) for a in prefix_inputs(cfg, hist, past, prefix_len)))
    past_meta, suffix_arrays = suffix_inputs(cfg, hist, prefix_len, past, suffix_bucket)
    cand = candidate_inputs(cfg, cands, prefix_tok + len(suffix), last_time(suffix, last_time(prefix)), cand_bucket)
    return (keys.asnumpy(), values.asnumpy(), *past_meta, *suffix_arrays, *cand,
            np.array([len(suffix) - 1], np.int32))


def _probabilities(logits: np.ndarray) -> np.ndarray:
    return (1.0 / (1.0 + np.exp(-logits))).astype(np.float32)


def mindir_scores(bundle_dir: str | Path, config: RelayGRConfig, history: Any, candidate_ids: Any,
                  prefix_len: int) -> np.ndarray:
    """Probabilities [M, tasks] from the bundle's MindIR graphs: events [0, prefix_len) through the prefix graph,
    its K/V with the remaining events and the candidates through the candidate graph (at least the last event:
    its final state is the user state)."""
    import mindspore as ms
    from mindspore import Tensor, nn

    root = Path(bundle_dir)
    manifest = verify_bundle(root)
    request = _mindir_request(config, history, candidate_ids, prefix_len)
    hist, cands, prefix_len, _, past = request
    name, _, suffix_bucket, cand_bucket = _pick_candidate_graph(manifest, past, len(hist) - prefix_len, len(cands))
    inputs = _mindir_inputs(root, config, request, past, suffix_bucket, cand_bucket)
    logits = nn.GraphCell(ms.load(str(root / name)))(*(Tensor(a) for a in inputs)).asnumpy()
    return _probabilities(logits[: len(cands)])


def mindir_batch_scores(bundle_dir: str | Path, config: RelayGRConfig, requests: list[tuple[Any, Any, int]]
                        ) -> list[np.ndarray]:
    """Probabilities [M_i, tasks] of several requests (history, candidate_ids, prefix_len) through one call of a
    bundled batched candidate graph (each user's K/V from the prefix graph), padded to the largest past, suffix
    and candidate buckets among them and to the graph's batch bucket (a copy of the first request)."""
    import mindspore as ms
    from mindspore import Tensor, nn

    root = Path(bundle_dir)
    manifest = verify_bundle(root)
    prepared = [_mindir_request(config, *request) for request in requests]
    past = max(r[4] for r in prepared)
    suffix = max(len(r[0]) - r[2] for r in prepared)
    name, users, suffix_bucket, cand_bucket = _pick_candidate_graph(manifest, past, suffix,
                                                                    max(len(r[1]) for r in prepared), len(prepared))
    rows = [_mindir_inputs(root, config, r, past, suffix_bucket, cand_bucket) for r in prepared]
    rows += [rows[0]] * (users - len(rows))
    arrays = [np.stack(column) for column in zip(*rows, strict=True)]
    per_user = {i for i, n in enumerate(input_names("export_candidate")) if n in PER_USER}
    arrays = [a[:, 0] if i in per_user else a for i, a in enumerate(arrays)]
    logits = nn.GraphCell(ms.load(str(root / name)))(*(Tensor(a) for a in arrays)).asnumpy()
    return [_probabilities(logits[i, : len(r[1])]) for i, r in enumerate(prepared)]


def check_mindir(bundle_dir: str | Path, model: Any, history: Any, candidate_ids: Any, suffix_len: int = 8) -> float:
    """Max |MindIR prefix -> candidate scores - model.rank_full scores| for one request."""
    from mindspore_relaygr.model.inputs import validate_history

    num_events = len(validate_history(model.cfg, history))
    prefix_len = max(1, num_events - min(suffix_len, model.cfg.max_suffix_len))
    scores = mindir_scores(bundle_dir, model.config, history, candidate_ids, prefix_len)
    return float(np.abs(scores - model.rank_full(history, candidate_ids)).max())


def check_mindir_batch(bundle_dir: str | Path, model: Any, requests: list[tuple[Any, Any]], suffix_len: int = 8
                       ) -> float:
    """Max |batched MindIR scores - model.rank_full scores| over several requests (history, candidate_ids) ranked
    in one call of a bundled batched candidate graph."""
    from mindspore_relaygr.model.inputs import validate_history

    split = []
    for history, candidate_ids in requests:
        num_events = len(validate_history(model.cfg, history))
        split.append((history, candidate_ids, max(1, num_events - min(suffix_len, model.cfg.max_suffix_len))))
    scores = mindir_batch_scores(bundle_dir, model.config, split)
    return max(float(np.abs(s - model.rank_full(h, c)).max()) for s, (h, c) in zip(scores, requests, strict=True))
