"""`relaygr train / eval / export` through an argparse parser built like the CLI's."""

from __future__ import annotations

import argparse
import json

import pytest

from mindspore_relaygr.errors import BundleError
from mindspore_relaygr.train.commands import register
from tests.conftest import CONFIGS, ONE_BUCKET, cli_overrides
from tests.train.conftest import synthetic_overrides


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="relaygr")
    register(parser.add_subparsers(dest="command", required=True))
    return parser


def _run(argv: list[str]) -> int:
    args = _parser().parse_args(argv)
    return args.func(args)


def test_parser_defaults():
    args = _parser().parse_args(["train"])
    assert args.config.endswith("configs/ml1m.yaml") and args.output_dir is None and not args.resume
    args = _parser().parse_args(["eval", "--checkpoint", "x/best.ckpt"])
    assert (args.config, args.split, args.suffix_len, args.no_baselines) == (None, "test", 8, False)
    assert args.baselines == ["popularity", "sasrec"]
    assert _parser().parse_args(["eval", "--checkpoint", "c", "--baselines", "popularity"]).baselines == ["popularity"]
    with pytest.raises(SystemExit):
        _parser().parse_args(["export"])  # --checkpoint is required


@pytest.mark.slow
def test_train_eval_export_commands(synthetic_data_path, tmp_path, capsys):
    out = tmp_path / "run"
    overrides = cli_overrides([*synthetic_overrides(synthetic_data_path, out), *ONE_BUCKET])
    assert _run(["train", "--config", str(CONFIGS / "tiny.yaml"), *overrides, "-o", "train.epochs=1",
                 "--output-dir", str(out)]) == 0
    assert "best checkpoint" in capsys.readouterr().out
    checkpoint = str(out / "best.ckpt")
    assert _run(["eval", "--checkpoint", checkpoint, "--baselines", "popularity", "--max-users", "10",
                 "--suffix-len", "2"]) == 0
    report = json.loads((out / "eval_test.json").read_text())
    assert report["users"] == 10 and report["paths_agree"]
    assert list(report["rows"]) == ["ours (full path)", "ours (relay path, suffix 2)", "popularity"]
    assert _run(["export", "--checkpoint", checkpoint]) == 0
    printed = capsys.readouterr().out
    assert "bundle" in printed and (out / "bundle" / "manifest.json").is_file()
    with pytest.raises(BundleError, match="already exists"):
        _run(["export", "--checkpoint", checkpoint, "--no-verify"])


@pytest.mark.slow
def test_baseline_checkpoint_is_reused_by_eval(synthetic_data_path, tmp_path, capsys):
    """`relaygr baseline` trains SASRec once; `relaygr eval --sasrec-checkpoint` scores with those weights
    (the same SASRec rows as an eval that loads them again) instead of training another."""
    out = tmp_path / "run"
    overrides = [x for o in [*synthetic_overrides(synthetic_data_path, out), "train.sasrec_epochs=6",
                             "train.eval_every=3"] for x in ("-o", o)]
    config = ["--config", str(CONFIGS / "tiny.yaml"), *overrides]
    assert _run(["baseline", *config, "--output-dir", str(tmp_path / "sasrec")]) == 0
    saved = json.loads((tmp_path / "sasrec" / "sasrec_metrics.json").read_text())
    assert [e["epoch"] for e in saved["evals"]] == [3, 6] and len(saved["epoch_losses"]) == 6
    assert "SASRec checkpoint" in capsys.readouterr().out
    assert _run(["train", *config, "-o", "train.epochs=1", "--output-dir", str(out)]) == 0
    ckpt = str(tmp_path / "sasrec" / "sasrec.ckpt")
    rows = []
    for name in ("a", "b"):
        assert _run(["eval", "--checkpoint", str(out / "best.ckpt"), "--baselines", "sasrec", "--max-users", "12",
                     "--sasrec-checkpoint", ckpt, "--out", str(tmp_path / f"{name}.json")]) == 0
        rows.append(json.loads((tmp_path / f"{name}.json").read_text())["rows"]["SASRec"])
    assert rows[0]["full"] == rows[1]["full"] and rows[0]["full"]["recent200"]["users"] == 12
    printed = capsys.readouterr().err
    assert "SASRec: weights from" in printed and "SASRec epoch" not in printed  # loaded, not trained
    assert _run(["eval", "--checkpoint", str(out / "best.ckpt"), "--baselines", "popularity",
                 "--sasrec-checkpoint", ckpt]) == 2


def test_sasrec_checkpoint_of_another_shape_is_refused(tmp_path, tiny_config_path):
    from mindspore_relaygr import load_config
    from mindspore_relaygr.runtime import configure_context
    from mindspore_relaygr.train.baselines import SASRecTrainer

    configure_context(load_config(tiny_config_path).context)
    small = ["train.sasrec_d_model=8", "train.sasrec_num_heads=1", "train.sasrec_max_len=8",
             "train.sasrec_batch_size=4"]
    SASRecTrainer(load_config(overrides=small).train, 30).save(tmp_path / "s.ckpt")
    wider = load_config(overrides=[*small, "train.sasrec_d_model=16"]).train
    with pytest.raises(ValueError, match="has shape"):
        SASRecTrainer(wider, 30).load(tmp_path / "s.ckpt")


def test_eval_refuses_the_validation_split_of_a_model_that_trained_on_it(tmp_path, capsys):
    from mindspore_relaygr import load_config
    from mindspore_relaygr.config import save_config

    save_config(load_config(CONFIGS / "tiny.yaml", ["train.train_on_valid=true"]), tmp_path / "config.yaml")
    assert _run(["eval", "--checkpoint", str(tmp_path / "best.ckpt"), "--split", "valid"]) == 2
    assert "train.train_on_valid" in capsys.readouterr().err
