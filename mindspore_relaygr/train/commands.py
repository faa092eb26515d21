"""`relaygr train`, `baseline`, `eval`, `average`, `export`, `lengths` and `caps`: registered on the CLI by
`register(subparsers)`."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from mindspore_relaygr.config import RelayGRConfig, load_config
from mindspore_relaygr.shipped_configs import config_arg, config_help
from mindspore_relaygr.train.eval_filter import DEFAULT_FILTERS, HistoryFilter, check_filters, parse_filter

BASELINES = ("popularity", "sasrec")
SASREC_CHECKPOINT = "sasrec.ckpt"


def _progress(tag: str):
    def say(msg: str) -> None:
        print(f"[{tag}] {msg}", file=sys.stderr, flush=True)

    return say


def _checkpoint_config(args: argparse.Namespace) -> RelayGRConfig:
    """--config, or the resolved config.yaml that training wrote next to --checkpoint."""
    path = args.config or Path(args.checkpoint).parent / "config.yaml"
    return load_config(path, args.override)


def cmd_train(args: argparse.Namespace) -> int:
    from mindspore_relaygr.train.trainer import CONFIG_NAME, METRICS_NAME, train

    overrides = [*args.override, *([f"train.output_dir={args.output_dir}"] if args.output_dir else [])]
    cfg = load_config(args.config, overrides)
    say = _progress("train")
    say(f"config {args.config}: d={cfg.model.d_model}, {cfg.model.num_layers} layers, {cfg.train.epochs} epochs, "
        f"output {cfg.train.output_dir}")
    t0 = time.perf_counter()
    result = train(cfg, progress=say, resume=args.resume, distributed=args.distributed)
    best = result.best
    if "valid_hr@10" in best:
        print(f"best checkpoint: {result.checkpoint} (epoch {best['epoch']}, valid HR@10 {best['valid_hr@10']:.4f}, "
              f"NDCG@10 {best['valid_ndcg@10']:.4f}, all items)")
    else:  # train.train_on_valid: no validation
        print(f"checkpoint: {result.checkpoint} (epoch {best['epoch']}; the validation events trained)")
    rate = "" if result.tokens_per_s is None else f", {result.tokens_per_s:,.0f} tokens/s"
    print(f"wrote {result.output_dir / CONFIG_NAME} and {result.output_dir / METRICS_NAME}; "
          f"{result.steps} steps{rate}, wall time {time.perf_counter() - t0:.0f} s")
    return 0


def cmd_baseline(args: argparse.Namespace) -> int:
    import json

    from mindspore_relaygr.config import save_config
    from mindspore_relaygr.train.dataset import prepare_data
    from mindspore_relaygr.train.evaluate import train_sasrec

    cfg = load_config(args.config, args.override)
    out = Path(args.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    say = _progress("baseline")
    say(f"SASRec ({cfg.train.sasrec_num_layers} layers, d={cfg.train.sasrec_d_model}, batch "
        f"{cfg.train.sasrec_batch_size}, up to {cfg.train.sasrec_epochs} epochs), output {out}")
    save_config(cfg, out / "config.yaml")
    t0 = time.perf_counter()

    def write_report(trainer, finished: bool) -> None:
        report = {"model": "SASRec", "finished": finished, "best": trainer.best, "evals": trainer.evals,
                  "epoch_losses": trainer.losses, "train_seconds": time.perf_counter() - t0,
                  "checkpoint": SASREC_CHECKPOINT}
        (out / "sasrec_metrics.json").write_text(json.dumps(report, indent=2) + "\n")

    def after_validation(trainer, improved: bool) -> None:  # a stopped run keeps its best epoch so far
        if improved:
            trainer.save(out / SASREC_CHECKPOINT)
        write_report(trainer, finished=False)

    sasrec = train_sasrec(cfg, prepare_data(cfg), say, after_validation)
    sasrec.save(out / SASREC_CHECKPOINT)
    write_report(sasrec, finished=True)
    report = json.loads((out / "sasrec_metrics.json").read_text())
    chosen = (f"epoch {sasrec.best['epoch']}, valid HR@10 {sasrec.best['hr@10']:.4f}, NDCG@10 "
              f"{sasrec.best['ndcg@10']:.4f}" if sasrec.best else f"epoch {len(sasrec.losses)}, no validation")
    print(f"SASRec checkpoint: {out / SASREC_CHECKPOINT} ({chosen}); use it with relaygr eval --sasrec-checkpoint; "
          f"wall time {report['train_seconds']:.0f} s")
    return 0


def _filters_ok(args: argparse.Namespace) -> bool:
    try:
        check_filters(args.filter)
    except ValueError as exc:
        print(f"--filter: {exc}", file=sys.stderr)
        return False
    return True


def cmd_eval(args: argparse.Namespace) -> int:
    from mindspore_relaygr.train.evaluate import format_table, run_evaluation, write_report

    if not _filters_ok(args):
        return 2
    cfg = _checkpoint_config(args)
    if args.split == "valid" and cfg.train.train_on_valid:
        print("--split valid: this model trained on the validation events (train.train_on_valid); evaluate "
              "--split test", file=sys.stderr)
        return 2
    t0 = time.perf_counter()
    baselines = () if args.no_baselines else tuple(args.baselines)
    if args.sasrec_checkpoint and "sasrec" not in baselines:
        print("--sasrec-checkpoint needs the sasrec baseline (see --baselines)", file=sys.stderr)
        return 2
    report = run_evaluation(cfg, args.checkpoint, args.split, args.suffix_len, baselines, args.max_users,
                            progress=_progress("eval"), sasrec_checkpoint=args.sasrec_checkpoint,
                            filters=args.filter)
    report["wall_seconds"] = time.perf_counter() - t0
    print(format_table(report))
    out = Path(args.out) if args.out else Path(args.checkpoint).parent / f"eval_{args.split}.json"
    write_report(report, out)
    print(f"wrote {out}; wall time {report['wall_seconds']:.0f} s")
    return 0 if report["paths_agree"] else 1


def cmd_caps(args: argparse.Namespace) -> int:
    from mindspore_relaygr.train.cap_curve import format_caps, quality_vs_cap, write_caps

    if not _filters_ok(args):
        return 2
    cfg = _checkpoint_config(args)
    report = quality_vs_cap(cfg, args.checkpoint, args.caps, args.split, args.max_users, progress=_progress("caps"),
                            filters=args.filter)
    print(format_caps(report))
    out = Path(args.out) if args.out else Path(args.checkpoint).parent / f"caps_{args.split}.json"
    write_caps(report, out)
    print(f"wrote {out} and {out.with_suffix('.png').name}")
    return 0


def cmd_ties(args: argparse.Namespace) -> int:
    import json

    from mindspore_relaygr.bench.machine import machine_info
    from mindspore_relaygr.train.tie_order import format_ties, tie_order_spread

    if not _filters_ok(args):
        return 2
    if len(set(args.seeds)) != len(args.seeds):
        print(f"--seeds {args.seeds}: a seed is listed twice", file=sys.stderr)
        return 2
    report = tie_order_spread(_checkpoint_config(args), args.checkpoint, args.seeds, args.filter, args.max_users,
                              progress=_progress("ties"))
    report["machine"] = machine_info()
    print(format_ties(report))
    out = Path(args.out) if args.out else Path(args.checkpoint).parent / "ties_test.json"
    out.write_text(json.dumps(report, indent=2) + "\n")
    print(f"wrote {out}")
    return 0


def cmd_average(args: argparse.Namespace) -> int:
    from mindspore_relaygr.train.averaging import average_checkpoints

    result = average_checkpoints(args.checkpoints, args.out, overwrite=args.overwrite)
    names = ", ".join(p.name for p in result.sources)
    print(f"wrote {result.path}: the mean of {len(result.sources)} checkpoints ({names}), "
          f"{result.num_parameters} parameters" + (f"; copied {result.config_copied}" if result.config_copied else ""))
    return 0


def cmd_export(args: argparse.Namespace) -> int:
    from mindspore_relaygr.export import (
        Vocabulary,
        bundle_name,
        check_mindir,
        check_mindir_batch,
        export_batch_buckets,
        export_bundle,
        load_bundle,
    )
    from mindspore_relaygr.model.ranker import RelayGRModel
    from mindspore_relaygr.train.dataset import check_checkpoint, prepare_data

    say = _progress("export")
    t0 = time.perf_counter()
    data = prepare_data(_checkpoint_config(args))  # the vocabularies the bundle serves, from the training data
    cfg = data.config
    check_checkpoint(cfg, args.checkpoint, data.interactions)
    model = RelayGRModel(cfg)
    model.load_checkpoint(args.checkpoint)
    name = args.name or bundle_name(cfg.data.path)
    out = Path(args.out_dir) if args.out_dir else Path(args.checkpoint).parent / "bundle"
    say(f"exporting {args.checkpoint} to {out} (MindIR: {'every bucket' if args.all_buckets else 'covering set'})")
    export_bundle(model, cfg, Vocabulary.from_interactions(data.interactions), out, name, args.all_buckets,
                  args.overwrite)
    bundle_cfg, bundle_model = load_bundle(out)
    say(f"bundle verified and loaded: model version {bundle_cfg.model.version}")
    if not args.no_verify:
        example = data.eval_set("test", 1)[0]
        diff = check_mindir(out, bundle_model, example.history, example.candidate_ids)
        say(f"MindIR prefix -> candidate vs rank_full on user {example.user_id}: max |diff| {diff:.2e}")
        if export_batch_buckets(bundle_cfg):
            pair = data.eval_set("test", 2)
            diff = max(diff, check_mindir_batch(out, bundle_model, [(e.history, e.candidate_ids) for e in pair]))
            say(f"batched MindIR candidate graph vs rank_full on users {', '.join(str(e.user_id) for e in pair)}: "
                f"max |diff| {diff:.2e}")
        if diff > 1e-5:
            print(f"MindIR scores differ from the model by {diff:.2e} (> 1e-5)", file=sys.stderr)
            return 1
    files = sorted(p.name for p in out.iterdir())
    print(f"bundle {out} ({bundle_cfg.model.version}): {', '.join(files)}; wall time {time.perf_counter() - t0:.0f} s")
    return 0


def cmd_lengths(args: argparse.Namespace) -> int:
    from mindspore_relaygr.train.length_curve import CURVE_JSON, CURVE_PLOT, format_curve, run_length_curve

    t0 = time.perf_counter()
    rows = run_length_curve(args.config, args.lengths, args.output_dir, args.override, args.max_users,
                            progress=_progress("lengths"), context=args.context)
    print(format_curve(rows))
    out = Path(args.output_dir)
    print(f"wrote {out / CURVE_JSON} and {out / CURVE_PLOT}; wall time {time.perf_counter() - t0:.0f} s")
    return 0


def _positive_lengths(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"history length must be a whole number, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"history length must be >= 1, got {value}")
    return value


def _cap(text: str) -> int | str:
    """A history cap: a positive number of events, or "all" (the model's longest history)."""
    return "all" if text.strip().lower() == "all" else _positive_lengths(text)


def _filter(text: str) -> HistoryFilter:
    try:
        return parse_filter(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _filter_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--filter", type=_filter, nargs="+", default=list(DEFAULT_FILTERS), metavar="RULE",
        help="which earlier items full ranking removes, fixed whatever the model reads: recentN (the items of the "
             "N most recent earlier events; recent200 is the generative-recommenders reference), all (every "
             "earlier item) or none; several give one table each, the first is the summary's "
             "(default: recent200 all)")


def _config_args(parser: argparse.ArgumentParser, default: str | None) -> None:
    help_text = config_help() if default else config_help().replace("%(default)s", "config.yaml next to --checkpoint")
    parser.add_argument("--config", type=config_arg, default=default, help=help_text)
    parser.add_argument("-o", "--override", action="append", default=[], metavar="SECTION.KEY=VALUE",
                        help="override a config value (repeatable), e.g. -o train.epochs=2")


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the train / eval / export subcommands to the `relaygr` parser."""
    train = subparsers.add_parser("train", help="train the ranker (best checkpoint, config and metrics JSON)")
    _config_args(train, "ml1m")
    train.add_argument("--output-dir", help="where to write (overrides train.output_dir)")
    train.add_argument("--resume", action="store_true",
                       help="continue from last.ckpt and train_state.json in the output directory")
    train.add_argument("--distributed", action="store_true",
                       help="one data-parallel worker under msrun (see scripts/run_distribute_train.sh)")
    train.set_defaults(func=cmd_train)

    base = subparsers.add_parser("baseline", help="train the SASRec baseline (same loss, data, model selection)")
    _config_args(base, "ml1m")
    base.add_argument("--output-dir", default="outputs/sasrec", help="sasrec.ckpt, config.yaml, sasrec_metrics.json")
    base.set_defaults(func=cmd_baseline)

    ev = subparsers.add_parser("eval", help="leave-one-out HR@10/NDCG@10/MRR/AUC: ours (full and relay) + baselines")
    ev.add_argument("--checkpoint", required=True, help="checkpoint written by `relaygr train`")
    _config_args(ev, None)
    ev.add_argument("--split", choices=("test", "valid"), default="test")
    ev.add_argument("--suffix-len", type=int, default=8, help="events ranked as the suffix on the relay path")
    ev.add_argument("--max-users", type=int, default=None, help="evaluate only the first N users")
    ev.add_argument("--baselines", nargs="+", choices=BASELINES, default=list(BASELINES),
                    help="baselines in the same run (default: both; SASRec trains for train.sasrec_epochs)")
    ev.add_argument("--no-baselines", action="store_true", help="skip every baseline")
    ev.add_argument("--sasrec-checkpoint", help="SASRec weights from `relaygr baseline` instead of training one")
    _filter_args(ev)
    ev.add_argument("--out", help="report JSON (default: eval_<split>.json next to the checkpoint)")
    ev.set_defaults(func=cmd_eval)

    avg = subparsers.add_parser("average", help="average the weights of checkpoints of one run (e.g. its last epochs)")
    avg.add_argument("--checkpoints", nargs="+", required=True, help="epoch_NNN.ckpt files written by `relaygr train`")
    avg.add_argument("--out", required=True, help="the averaged checkpoint (.ckpt); config.yaml is copied next to it")
    avg.add_argument("--overwrite", action="store_true", help="replace an existing --out file")
    avg.set_defaults(func=cmd_average)

    ex = subparsers.add_parser("export", help="write a serving bundle (config, checkpoint, vocab, MindIR)")
    ex.add_argument("--checkpoint", required=True, help="checkpoint written by `relaygr train`")
    _config_args(ex, None)
    ex.add_argument("--out-dir", help="bundle directory (default: bundle/ next to the checkpoint)")
    ex.add_argument("--name", help="model version prefix (default: the data's name: the event log's file name, "
                                   "ml1m for data.path ml-1m)")
    ex.add_argument("--all-buckets", action="store_true", help="MindIR for every bucket combination")
    ex.add_argument("--overwrite", action="store_true", help="replace an existing bundle directory")
    ex.add_argument("--no-verify", action="store_true", help="skip the MindIR-vs-model score check")
    ex.set_defaults(func=cmd_export)

    ln = subparsers.add_parser("lengths", help="quality vs history length: train + evaluate one ranker per length")
    _config_args(ln, "ml1m")
    ln.add_argument("--lengths", type=_positive_lengths, nargs="+", default=[50, 100, 200, 400, 800, 2314],
                    help="longest history (events) of each ranker")
    ln.add_argument("--output-dir", default="outputs/lengths", help="one len_<L>/ run per length, and the curve")
    ln.add_argument("--max-users", type=int, default=None, help="evaluate only the first N test users")
    ln.add_argument("--context", metavar="CAPS_JSON",
                    help="a `relaygr caps` report (one model, its input capped) drawn beside the curve")
    ln.set_defaults(func=cmd_lengths)

    caps = subparsers.add_parser("caps", help="quality of one trained model vs the serving cap on its histories")
    caps.add_argument("--checkpoint", required=True, help="checkpoint written by `relaygr train`")
    _config_args(caps, None)
    caps.add_argument("--caps", type=_cap, nargs="+", required=True,
                      help="history caps (most recent events), each at most the model's history length, or all")
    _filter_args(caps)
    caps.add_argument("--split", choices=("test", "valid"), default="test")
    caps.add_argument("--max-users", type=int, default=None, help="evaluate only the first N users")
    caps.add_argument("--out", help="JSON, with a PNG next to it (default: caps_<split>.json next to the checkpoint)")
    caps.set_defaults(func=cmd_caps)

    ties = subparsers.add_parser("ties", help="how much the order of equal timestamps moves the test metrics")
    ties.add_argument("--checkpoint", required=True, help="checkpoint written by `relaygr train`")
    _config_args(ties, None)
    ties.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3, 4, 5],
                      help="data.tie_seed of each random order (the file order is always measured too)")
    ties.add_argument("--max-users", type=int, default=None, help="evaluate only the first N users")
    _filter_args(ties)
    ties.add_argument("--out", help="report JSON (default: ties_test.json next to the checkpoint)")
    ties.set_defaults(func=cmd_ties)
