"""`relaygr average`: the element-wise mean of checkpoints of one run."""

from __future__ import annotations

import shutil

import numpy as np
import pytest

from mindspore_relaygr.errors import ConfigError
from mindspore_relaygr.train.averaging import mean_weights


def test_mean_of_float_arrays_keeps_integers_and_dtypes():
    a = {"w": np.array([1.0, 2.0], np.float32), "steps": np.array([3], np.int32)}
    b = {"w": np.array([2.0, 5.0], np.float32), "steps": np.array([3], np.int32)}
    c = {"w": np.array([6.0, -1.0], np.float32), "steps": np.array([3], np.int32)}
    mean = mean_weights([a, b, c], ["a", "b", "c"])
    np.testing.assert_array_equal(mean["w"], np.array([3.0, 2.0], np.float32))
    assert mean["w"].dtype == np.float32
    np.testing.assert_array_equal(mean["steps"], [3])


@pytest.mark.parametrize("other, match", [
    ({"w": np.zeros(2, np.float32), "extra": np.zeros(1, np.float32)}, "does not hold the parameters"),
    ({"w": np.zeros(3, np.float32)}, r"float32\[3\]"),
    ({"w": np.zeros(2, np.float64)}, "float64"),
])
def test_checkpoints_of_another_model_are_refused(other, match):
    with pytest.raises(ConfigError, match=match):
        mean_weights([{"w": np.zeros(2, np.float32)}, other], ["first.ckpt", "other.ckpt"])


def test_differing_integer_parameters_and_single_sources_are_refused():
    with pytest.raises(ConfigError, match="integer parameter n"):
        mean_weights([{"n": np.array([1])}, {"n": np.array([2])}], ["a", "b"])
    with pytest.raises(ConfigError, match="at least 2"):
        mean_weights([{"w": np.zeros(1, np.float32)}], ["a"])


def _perturbed_copy(source, target, seed: int) -> dict[str, np.ndarray]:
    """Save `source`'s weights plus seeded noise on every float parameter as `target`; return them."""
    import mindspore as ms

    rng = np.random.default_rng(seed)
    weights = {k: v.asnumpy() for k, v in ms.load_checkpoint(str(source)).items()}
    noisy = {k: (v + rng.normal(0, 0.01, v.shape).astype(v.dtype)) if v.dtype == np.float32 else v
             for k, v in weights.items()}
    ms.save_checkpoint([{"name": k, "data": ms.Tensor(v)} for k, v in noisy.items()], str(target))
    return noisy


def test_average_command_writes_the_mean_a_model_loads(trained_run, tmp_path, capsys):
    import mindspore as ms

    from mindspore_relaygr.cli import main

    run = trained_run.checkpoint.parent
    a = _perturbed_copy(trained_run.checkpoint, tmp_path / "epoch_001.ckpt", seed=1)
    b = _perturbed_copy(trained_run.checkpoint, tmp_path / "epoch_002.ckpt", seed=2)
    shutil.copyfile(run / "config.yaml", tmp_path / "config.yaml")
    shutil.copyfile(run / "vocabulary.json", tmp_path / "vocabulary.json")
    out = tmp_path / "averaged" / "avg.ckpt"
    assert main(["average", "--checkpoints", str(tmp_path / "epoch_001.ckpt"), str(tmp_path / "epoch_002.ckpt"),
                 "--out", str(out)]) == 0
    assert "the mean of 2 checkpoints" in capsys.readouterr().out
    averaged = {k: v.asnumpy() for k, v in ms.load_checkpoint(str(out)).items()}
    assert set(averaged) == set(a)
    for key, value in averaged.items():
        np.testing.assert_allclose(value, (a[key].astype(np.float64) + b[key]) / 2, rtol=0, atol=1e-7, err_msg=key)
    assert (out.parent / "config.yaml").read_text() == (run / "config.yaml").read_text()
    assert (out.parent / "vocabulary.json").read_text() == (run / "vocabulary.json").read_text()  # what ids mean

    from mindspore_relaygr.config import load_config
    from mindspore_relaygr.model.ranker import RelayGRModel

    model = RelayGRModel(load_config(out.parent / "config.yaml"))
    model.load_checkpoint(out)  # strict: every network parameter present
    net_weights = {p.name: p.asnumpy() for p in model.net.get_parameters() if p.name in averaged}
    assert len(net_weights) == len(averaged)
    for key, value in net_weights.items():
        np.testing.assert_array_equal(value, averaged[key], err_msg=key)


def test_average_command_refuses_bad_input_and_keeps_files(trained_run, tmp_path, capsys):
    from mindspore_relaygr.cli import main

    run = trained_run.checkpoint.parent
    src = [str(trained_run.checkpoint), str(tmp_path / "copy.ckpt")]
    shutil.copyfile(trained_run.checkpoint, src[1])
    out = tmp_path / "avg.ckpt"
    out.write_bytes(b"keep me")
    assert main(["average", "--checkpoints", *src, "--out", str(out)]) == 2  # exists
    assert main(["average", "--checkpoints", src[0], src[0], "--out", str(tmp_path / "x.ckpt")]) == 2  # twice
    assert main(["average", "--checkpoints", src[0], str(run / "last.ckpt"), "--out", str(tmp_path / "y.ckpt")]) == 2
    assert main(["average", "--checkpoints", *src, "--out", str(tmp_path / "z.bin")]) == 2
    gone = str(tmp_path / "gone.ckpt")
    assert main(["average", "--checkpoints", src[0], gone, "--out", str(tmp_path / "w.ckpt")]) == 2
    err = capsys.readouterr().err
    for text in ("exists", "listed twice", "not last.ckpt", "ends in .ckpt", "not found"):
        assert text in err
    assert out.read_bytes() == b"keep me"
    assert not any(tmp_path.glob("[xyzw].ckpt"))
    assert main(["average", "--checkpoints", *src, "--out", str(out), "--overwrite"]) == 0
    assert out.stat().st_size > len(b"keep me")
