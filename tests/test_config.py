"""Config: YAML -> typed dataclasses; unknown keys and bad values raise with key and value."""

from __future__ import annotations

import pytest

from mindspore_relaygr.config import ConfigError, load_config, save_config
from tests.conftest import CONFIGS


@pytest.mark.parametrize("name", sorted(p.name for p in CONFIGS.glob("*.yaml")))
def test_shipped_configs_load(name):
    cfg = load_config(CONFIGS / name)
    assert cfg.cache.max_prefix_len in cfg.model.len_buckets


def test_overrides_are_typed():
    cfg = load_config(CONFIGS / "tiny.yaml", ["cache.num_slots=3", "trigger.slo_ms=20", "model.len_buckets=[32, 128]"])
    assert (cfg.cache.num_slots, cfg.trigger.slo_ms, cfg.model.len_buckets) == (3, 20.0, [32, 128])
    assert isinstance(cfg.trigger.slo_ms, float)


@pytest.mark.parametrize(("override", "message"), [
    ("cache.nope=1", "cache.nope=1: unknown key"),
    ("nope.x=1", "nope: unknown section"),
    ("cache.num_slots=abc", "cache.num_slots='abc': must be an integer"),
    ("cache.num_slots=0", "cache.num_slots=0: must be > 0"),
    ("model.len_buckets=[64, 32, 128]", "must be strictly increasing"),
    ("model.len_buckets=[32, 64]", "the last bucket must equal model.max_seq_len=128"),
    ("cache.max_prefix_len=100", "cache.max_prefix_len=100: must be one of model.len_buckets"),
    ("relay.miss_policy=maybe", "relay.miss_policy='maybe'"),
    ("context.device_target=TPU", "context.device_target='TPU'"),
    ("model.enable=true", "model.enable=True: unknown key"),
    ("model.dropout=true", "model.dropout=True: must be a finite number"),
    ("cache.num_slots", "expected section.key=value"),
    # one serving schema: the config file is held to the limits the server enforces
    ("serving.max_content_length=10", "serving.max_content_length=10: must be >= 1024 bytes"),
    ("serving.admin_token=short", "serving.admin_token='<hidden>': must have >= 8 characters"),
    ("serving.instance_id=a b", "serving.instance_id='a b'"),
    ("router.instances=[a]", "router: unknown section"),  # the unused router section is gone
    ("relay.audit_fraction=1.5", "relay.audit_fraction=1.5: must be in [0, 1]"),
    ("relay.last_try_factor=0.5", "relay.last_try_factor=0.5: must be >= 1"),
    ("relay.max_batch_delay_ms=-1", "relay.max_batch_delay_ms=-1.0: must be >= 0 or null"),
    ("relay.max_rank_batch=0", "relay.max_rank_batch=0: must be >= 1"),
    ("train.len_buckets=[48, 16, 128]", "train.len_buckets=[48, 16, 128]: must be strictly increasing"),
    ("train.len_buckets=[16, 48]", "train.len_buckets=[16, 48]: the last bucket must equal model.max_seq_len=128"),
])
def test_bad_values_name_key_and_value(override, message):
    with pytest.raises(ConfigError, match=message.replace("[", r"\[").replace("]", r"\]")):
        load_config(CONFIGS / "tiny.yaml", [override])


def test_numbers_in_exponent_form_are_numbers(tmp_path):
    """YAML 1.1 reads 1e6 (no dot) as a string: `-o cache.pool_bytes=1e6` was refused, 1.0e+6 accepted."""
    cfg = load_config(CONFIGS / "tiny.yaml", ["cache.pool_bytes=1e6", "expander.dram_bytes=2E9",
                                              "trigger.max_prefill_tokens_per_s=+2.5e5", "cache.num_slots=1e1"])
    assert (cfg.cache.pool_bytes, cfg.expander.dram_bytes) == (1e6, 2e9)
    assert cfg.trigger.max_prefill_tokens_per_s == 2.5e5
    assert cfg.cache.num_slots == 10 and isinstance(cfg.cache.num_slots, int)  # an integral float fits an int
    with pytest.raises(ConfigError, match="cache.num_slots=1.5: must be an integer"):
        load_config(CONFIGS / "tiny.yaml", ["cache.num_slots=1.5e0"])
    path = tmp_path / "c.yaml"
    path.write_text("cache:\n  num_slots: null\n  pool_bytes: 5e8\n")
    assert load_config(path).cache.pool_bytes == 5e8
    assert load_config(None, ["model.version=v1e6"]).model.version == "v1e6"  # not a number: a string


def test_missing_and_malformed_files(tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        load_config(tmp_path / "none.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("model: [1, 2\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_config(bad)


def test_save_and_reload_round_trip(tmp_path):
    cfg = load_config(CONFIGS / "tiny.yaml", ["cache.num_slots=2"])
    save_config(cfg, tmp_path / "resolved.yaml")
    assert load_config(tmp_path / "resolved.yaml") == cfg
    assert "None" not in (tmp_path / "resolved.yaml").read_text()


def test_shipped_configs_by_name_from_anywhere(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # not the checkout: configs/tiny.yaml is no relative path here
    for name in ("tiny", "tiny.yaml", "configs/tiny.yaml"):
        assert load_config(name) == load_config(CONFIGS / "tiny.yaml")
    (tmp_path / "tiny").write_text("cache:\n  num_slots: 3\n")  # a file of that name wins
    assert load_config("tiny").cache.num_slots == 3
    with pytest.raises(ConfigError, match=r"'tiniest' does not exist, nor is it a shipped config \(bench_long, "):
        load_config("tiniest")


def test_null_sizes_come_from_the_data_and_a_model_needs_them(capsys):
    from serving.cli import main

    cfg = load_config("ml1m")
    assert (cfg.model.num_items, cfg.model.num_actions, cfg.model.user_feature_sizes) == (None, None, None)
    with pytest.raises(ConfigError, match=r"model.num_items=None: is null \(from the data\)"):
        cfg.model.require_sizes()
    assert main(["serve", "--config", "ml1m"]) == 2  # refused before gunicorn starts
    assert "relaygr: error: model.num_items=None: is null" in capsys.readouterr().err
