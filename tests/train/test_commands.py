"""`relaygr train / eval / export` through an argparse parser built like the CLI's."""

from __future__ import annotations

import argparse
import json

import pytest

from mindspore_relaygr.errors import BundleError
from mindspore_relaygr.train.commands import register
from tests.conftest import CONFIGS
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
    overrides = [x for o in synthetic_overrides(synthetic_data_path, out) for x in ("-o", o)]
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
