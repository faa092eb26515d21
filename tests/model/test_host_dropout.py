import numpy as np
import pytest

from mindspore_relaygr.model.host_dropout import apply_dropout, dropout_noise, dropout_threshold


@pytest.fixture(scope="module", autouse=True)
def context(tiny_config_path):
    from mindspore_relaygr import load_config
    from mindspore_relaygr.runtime import configure_context

    configure_context(load_config(tiny_config_path).context)  # before any op: later models set it otherwise


def test_threshold_is_the_rate_in_bytes():
    assert dropout_threshold(0.1) == (26, 256 / 230)
    assert dropout_threshold(0.0) == (0, 1.0)
    assert dropout_threshold(0.5) == (128, 2.0)
    with pytest.raises(ValueError, match=r"\[0, 1\)"):
        dropout_threshold(1.0)


def test_noise_is_seeded_uint8_of_the_given_shapes():
    shapes = [(2, 3, 4), (5,)]
    a = dropout_noise(np.random.default_rng(1), shapes)
    b = dropout_noise(np.random.default_rng(1), shapes)
    assert [x.shape for x in a] == shapes and all(x.dtype == np.uint8 for x in a)
    assert all((x == y).all() for x, y in zip(a, b, strict=True))
    assert not (dropout_noise(np.random.default_rng(2), shapes)[0] == a[0]).all()


def test_apply_keeps_bytes_at_or_above_threshold_and_scales_them():
    from mindspore import Tensor

    threshold, scale = dropout_threshold(0.25)
    x = np.arange(1, 7, dtype=np.float32).reshape(2, 3)
    noise = np.array([[0, 63, 64], [255, 10, 200]], np.uint8)
    got = apply_dropout(Tensor(x), Tensor(noise), threshold, scale).asnumpy()
    np.testing.assert_allclose(got, np.where(noise >= 64, x * 256 / 192, 0.0), rtol=1e-6)
    assert apply_dropout(Tensor(x), None, threshold, scale).asnumpy().tolist() == x.tolist()
    # Kept with probability 1 - p on average, so the expectation is unchanged.
    big = dropout_noise(np.random.default_rng(0), [(200_000,)])[0]
    assert np.mean(big >= threshold) == pytest.approx(0.75, abs=0.005)
