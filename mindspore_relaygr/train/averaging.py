"""Checkpoint averaging: the element-wise mean of the weights of several checkpoints of one training run.

Averaging the models of the last epochs of a run (Polyak / stochastic weight averaging over the kept
`epoch_NNN.ckpt` files) smooths the epoch-to-epoch noise of the last iterate. The ranker has LayerNorms
only (no batch statistics), so the averaged weights need no recalibration pass.
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from mindspore_relaygr.errors import ConfigError


@dataclass(frozen=True)
class AverageResult:
    """What `average_checkpoints` wrote."""

    path: Path
    sources: list[Path]
    num_parameters: int
    config_copied: Path | None  # the run's config.yaml copied next to `path`, if it was


def mean_weights(weights: list[dict[str, np.ndarray]], names: list[str]) -> dict[str, np.ndarray]:
    """Element-wise mean of same-named float arrays (accumulated in float64); `names[i]` labels `weights[i]`
    in errors. Every source must hold the same parameter names, shapes and dtypes; integer arrays must agree."""
    if len(weights) < 2:
        raise ConfigError(f"averaging needs at least 2 checkpoints, got {len(weights)}")
    first = weights[0]
    for source, other in zip(names[1:], weights[1:], strict=True):
        if set(other) != set(first):
            extra, lacking = sorted(set(other) - set(first)), sorted(set(first) - set(other))
            raise ConfigError(f"{source} does not hold the parameters of {names[0]}: extra {extra[:3]}, "
                              f"lacking {lacking[:3]} (average checkpoints of one model, not last.ckpt)")
        for key, value in other.items():
            if value.shape != first[key].shape or value.dtype != first[key].dtype:
                raise ConfigError(f"{source}: parameter {key} is {value.dtype}{list(value.shape)}, "
                                  f"{names[0]} has {first[key].dtype}{list(first[key].shape)}")
    averaged = {}
    for key, value in first.items():
        if np.issubdtype(value.dtype, np.floating):
            total = np.zeros(value.shape, np.float64)
            for w in weights:
                total += w[key]
            averaged[key] = (total / len(weights)).astype(value.dtype)
        else:
            for source, w in zip(names, weights, strict=True):
                if not np.array_equal(w[key], value):
                    raise ConfigError(f"{source}: integer parameter {key} differs from {names[0]}")
            averaged[key] = value.copy()
    return averaged


def average_checkpoints(paths: list[str | Path], out: str | Path, overwrite: bool = False) -> AverageResult:
    """Write the mean of the checkpoints `paths` (written by `relaygr train`) to `out`.

    Copies the run's config.yaml next to `out` when `out` is in another directory, so `relaygr eval` and
    `export` find it as they do for a training run; refuses to overwrite a file unless `overwrite`.
    """
    import mindspore as ms

    from mindspore_relaygr.train.dataset import VOCABULARY_NAME
    from mindspore_relaygr.train.trainer import CONFIG_NAME

    sources = [Path(p) for p in paths]
    out = Path(out)
    missing = [str(p) for p in sources if not p.is_file()]
    if missing:
        raise ConfigError(f"checkpoint(s) not found: {', '.join(missing)}")
    if len({p.resolve() for p in sources}) != len(sources):
        raise ConfigError("a checkpoint is listed twice: each source must count once")
    if out.resolve() in {p.resolve() for p in sources}:
        raise ConfigError(f"--out {out} is one of the sources")
    if out.suffix != ".ckpt":
        raise ConfigError(f"--out {out}: a checkpoint's name ends in .ckpt (MindSpore appends it otherwise)")
    if out.exists() and not overwrite:
        raise ConfigError(f"{out} exists (pass --overwrite to replace it)")
    weights = [{k: v.asnumpy() for k, v in ms.load_checkpoint(str(p)).items()} for p in sources]
    averaged = mean_weights(weights, [str(p) for p in sources])
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(".tmp.ckpt")
    ms.save_checkpoint([{"name": k, "data": ms.Tensor(v)} for k, v in averaged.items()], str(tmp))
    tmp.replace(out)  # a stopped run never leaves a half-written checkpoint under the final name
    source_config, out_config = sources[0].parent / CONFIG_NAME, out.parent / CONFIG_NAME
    copied = source_config.is_file() and not out_config.exists()
    if copied:
        shutil.copyfile(source_config, out_config)
        source_vocab = sources[0].parent / VOCABULARY_NAME
        if source_vocab.is_file():
            shutil.copyfile(source_vocab, out.parent / VOCABULARY_NAME)
    return AverageResult(out, sources, len(averaged), out_config if copied else None)
