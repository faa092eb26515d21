"""Rank movies for a real MovieLens user through a running server (the last step of run_demo.sh).

    python -m serving.demo_client --bundle outputs/demo/bundle --url http://127.0.0.1:8080

Takes a user's history before their held-out (test) movie and that movie among the same 100 sampled
unseen movies as `relaygr eval`. It pre-infers the history minus its last `--suffix` events (the
long-term prefix, known at retrieval time), waits `--gap-ms` (what retrieval and pre-ranking take
in a cascade), then ranks with the whole history (the suffix = events
that arrived since), prints the top movies with titles, the cache tier that served the rank and
the timings. For contrast, a second user is ranked without a pre-infer (computed in full). Requests carry the
catalogue's raw ids (ML-1M's item ids are movie titles), as a caller's would.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from serving.client import RelayGRClient, Timed


def _say(msg: str) -> None:
    print(f"[demo] {msg}", file=sys.stderr, flush=True)


def _pick_users(examples: list[Any], raw_user: int | None, user_vocab: dict[int, int]) -> tuple[Any, Any]:
    """(the demo user: --user or the longest history, a contrast user: the next longest)."""
    by_len = sorted(examples, key=lambda e: (-len(e.history), e.user_id))
    if raw_user is None:
        return by_len[0], by_len[1]
    dense = user_vocab.get(raw_user)
    chosen = [e for e in examples if e.user_id == dense]
    if not chosen:
        raise SystemExit(f"user {raw_user} is not an evaluated MovieLens user (unknown id or fewer than "
                         "3 ratings)")
    other = next(e for e in by_len if e.user_id != dense)
    return chosen[0], other


def _timings(t: Timed) -> str:
    server = t.body["timings_ms"]
    parts = [f"{k} {server[k]:.1f}" for k in ("wait", "queue", "compute", "total") if k in server]
    return f"client {t.client_ms:.1f} ms; server " + ", ".join(parts) + " ms"


def _print_top(rank: Timed, candidate_ids: np.ndarray, target: int, titles: dict[int, str], k: int) -> None:
    body = rank.body
    scores = np.asarray(body["scores"])
    tasks = body["tasks"]
    print(f"{'#':>3}  {'movie':52} " + " ".join(f"{t:>12}" for t in tasks))
    for pos, idx in enumerate(body["ranking"][:k], 1):
        item = int(candidate_ids[idx])
        mark = "  <- watched next" if item == target else ""
        title = titles.get(item, f"item {item}")[:52]
        print(f"{pos:>3}  {title:52} " + " ".join(f"{s:12.3f}" for s in scores[idx]) + mark)
    order = body["ranking"]
    target_pos = 1 + next(i for i, idx in enumerate(order) if int(candidate_ids[idx]) == target)
    print(f"the movie this user actually rated next ({titles.get(target, target)}) is ranked "
          f"#{target_pos} of {len(candidate_ids)}")


def raw_history(history: Any, vocab: Any) -> dict[str, list]:
    """A dense `History` in the catalogue's raw ids: item ids, event types, user-feature values (None: unknown)."""
    items = {d: r for r, d in vocab.item_vocab.items()}
    out: dict[str, list] = {"item_ids": [items[int(i)] for i in history.item_ids],
                            "timestamps": [int(t) for t in history.timestamps]}
    if vocab.event_types:
        out["action_ids"] = [vocab.event_types[int(a)] for a in history.action_ids]
    if history.user_features is not None and vocab.user_feature_vocabs:
        values = [{i: r for r, i in v.items()} for v in vocab.user_feature_vocabs]
        out["user_features"] = [v.get(int(f)) for v, f in zip(values, history.user_features, strict=True)]
    return out


def run(args: argparse.Namespace) -> int:
    import dataclasses

    from mindspore_relaygr.export import load_bundle_config, load_vocabulary
    from mindspore_relaygr.train.dataset import prepare_data

    config = load_bundle_config(args.bundle)
    if args.data:
        config = dataclasses.replace(config, data=dataclasses.replace(config.data, path=args.data))
    vocab = load_vocabulary(args.bundle)
    dataset = config.data.path or "ml-100k"
    _say(f"loading the data ({dataset}) and the test split")
    data = prepare_data(config)
    examples = data.eval_set("test")
    user, other = _pick_users(examples, args.user, vocab.user_vocab)
    raw_of = {d: r for r, d in vocab.user_vocab.items()}

    client = RelayGRClient(args.url)
    try:
        state = client.wait_ready(args.ready_timeout, progress=_say)
        _say(f"server ready: model {state.get('model_version')}")
        hist, cands = user.history, user.candidate_ids
        n = len(hist)
        suffix = min(args.suffix, n - 1)
        user_id = f"{Path(dataset).name}-user-{raw_of[user.user_id]}"
        print(f"\nuser {raw_of[user.user_id]}: {n} rated movies before the held-out one; "
              f"pre-infer the first {n - suffix}, rank with all {n} against {len(cands)} candidates")
        items = {d: r for r, d in vocab.item_vocab.items()}
        raw_cands = [items[int(c)] for c in cands]
        pre = client.preinfer(user_id, raw_history(hist.slice(0, n - suffix), vocab), num_candidates=len(cands))
        print(f"pre-infer: admitted={pre.body['admitted']} ({pre.body['reason']}), predicted full inference "
              f"{pre.body['predicted_full_ms']:.1f} ms, instance {pre.body['instance']}, "
              f"answered in {pre.client_ms:.1f} ms")
        time.sleep(args.gap_ms / 1e3)  # retrieval and pre-ranking run before the ranking request comes
        rank = client.rank(user_id, raw_history(hist, vocab), raw_cands)  # where did the held-out movie land?
        print(f"rank: cache tier '{rank.body['cache']}', {_timings(rank)}\n")
        _print_top(rank, cands, user.target_id, vocab.item_titles, args.top_k)

        other_id = f"{Path(dataset).name}-user-{raw_of[other.user_id]}"
        cold = client.rank(other_id, raw_history(other.history, vocab), [items[int(c)] for c in other.candidate_ids])
        print(f"\ncontrast: user {raw_of[other.user_id]} ({len(other.history)} movies) ranked without a "
              f"pre-infer: cache tier '{cold.body['cache']}', {_timings(cold)}")
    finally:
        client.close()
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m serving.demo_client", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--bundle", required=True, help="the bundle the server runs (`relaygr export`)")
    parser.add_argument("--url", default="http://127.0.0.1:8080")
    parser.add_argument("--user", type=int, default=None, help="raw MovieLens user id (default: longest history)")
    parser.add_argument("--data", default=None, help="the data's path (default: the bundle config's data.path)")
    parser.add_argument("--suffix", type=int, default=8, help="events that arrive between pre-infer and rank")
    parser.add_argument("--gap-ms", type=float, default=100.0, help="retrieval -> ranking gap before the rank")
    parser.add_argument("--top-k", type=int, default=10)
    parser.add_argument("--ready-timeout", type=float, default=900.0)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
