"""Serving settings of one instance: config `serving` section (`config.ServingConfig`, the one schema)
< environment < command line.

`relaygr serve` hands its config path, overrides and flags to gunicorn through `RELAYGR_*`
environment variables; `gunicorn.conf.py` (in the master) and `serving.wsgi` (in the worker) read
them back with `load_from_env`, so both see one resolved configuration.
"""

from __future__ import annotations

import dataclasses
import ipaddress
import json
import os
from collections.abc import Mapping
from typing import Any

from mindspore_relaygr.config import RelayGRConfig, ServingConfig, load_config
from mindspore_relaygr.errors import ConfigError

ENV_CONFIG = "RELAYGR_CONFIG"  # YAML config path (unset: the built-in defaults)
ENV_BUNDLE = "RELAYGR_BUNDLE"  # serving bundle directory (`relaygr export`); its config.yaml replaces ENV_CONFIG
ENV_OVERRIDES = "RELAYGR_OVERRIDES"  # JSON list of "section.key=value" overrides
ENV_ENGINE_FACTORY = "RELAYGR_ENGINE_FACTORY"  # "module:callable" (config, instance_id=...) -> engine
ENV_ADMIN_TOKEN = "RELAYGR_ADMIN_TOKEN"  # bearer token of /v1/admin/* (wins over serving.admin_token)
ENV_PREFIX = "RELAYGR_SERVING_"  # RELAYGR_SERVING_PORT=8081 sets `port`, and so on for every field


def resolve_settings(config: RelayGRConfig, **overrides: Any) -> ServingConfig:
    """`config.serving` with the non-None `overrides` applied (validated like the config file)."""
    known = {f.name for f in dataclasses.fields(ServingConfig)}
    unknown = set(overrides) - known
    if unknown:
        raise ConfigError(f"unknown serving settings {sorted(unknown)}; known: {sorted(known)}")
    return dataclasses.replace(config.serving, **{k: v for k, v in overrides.items() if v is not None})


def is_loopback(host: str) -> bool:
    """Whether a bind address accepts connections from this machine only (127.0.0.0/8, ::1, localhost)."""
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:  # a host name: it may resolve to any address
        return False


def require_admin_token(settings: ServingConfig) -> None:
    """Refuse to serve /v1/admin/* without a token on an address other machines reach (ConfigError)."""
    if settings.admin_token is not None or is_loopback(settings.host):
        return
    raise ConfigError(
        f"serving.host={settings.host} is not a loopback address and no admin token is set: anyone who reaches "
        f"the instance could drop its cached prefixes (POST /v1/admin/flush). Set a token of 8 or more characters, "
        f"e.g. `export {ENV_ADMIN_TOKEN}=$(openssl rand -hex 16)` or `-o serving.admin_token=...`, or bind to "
        f"127.0.0.1")


def resolve_cli_settings(config: RelayGRConfig, environ: Mapping[str, str], **flags: Any) -> ServingConfig:
    """The settings of `relaygr serve` / `relaygr cluster`: the config's, then RELAYGR_SERVING_* and
    RELAYGR_ADMIN_TOKEN from `environ`, then the non-None command-line `flags`."""
    return resolve_settings(config, **{**settings_env_overrides(environ),
                                       **{k: v for k, v in flags.items() if v is not None}})


def _parse(name: str, text: str, tp: Any) -> Any:
    try:
        if tp in (bool, "bool"):
            if text.lower() not in ("1", "0", "true", "false", "yes", "no"):
                raise ValueError(text)
            return text.lower() in ("1", "true", "yes")
        if tp in (int, "int"):
            number = float(text)  # "4e6" as the config file reads it; "1.5" is refused below
            if not number.is_integer():
                raise ValueError(text)
            return int(text) if text.strip().lstrip("+-").isdigit() else int(number)
        if tp in (float, "float"):
            return float(text)
        if str(tp).startswith("list"):
            value = json.loads(text)
            if not isinstance(value, list):
                raise ValueError(text)
            return value
    except ValueError as exc:
        raise ConfigError(f"{name}={text!r}: not a valid {tp}") from exc
    return text


def settings_env_overrides(environ: Mapping[str, str]) -> dict[str, Any]:
    """`RELAYGR_SERVING_<FIELD>` variables -> typed setting values."""
    out: dict[str, Any] = {}
    for f in dataclasses.fields(ServingConfig):
        name = ENV_PREFIX + f.name.upper()
        if name in environ:
            tp = f.type if not isinstance(f.type, str) else f.type.split(" | ")[0]
            out[f.name] = _parse(name, environ[name], tp)
    if environ.get(ENV_ADMIN_TOKEN):
        out["admin_token"] = environ[ENV_ADMIN_TOKEN]
    return out


def load_from_env(environ: Mapping[str, str] | None = None) -> tuple[RelayGRConfig, ServingConfig]:
    """The config and settings that `relaygr serve` put into the environment."""
    environ = os.environ if environ is None else environ
    try:
        overrides = json.loads(environ.get(ENV_OVERRIDES) or "[]")
    except json.JSONDecodeError as exc:
        raise ConfigError(f"{ENV_OVERRIDES}: not a JSON list: {exc}") from exc
    if not isinstance(overrides, list) or not all(isinstance(o, str) for o in overrides):
        raise ConfigError(f"{ENV_OVERRIDES}={overrides!r}: must be a JSON list of strings")
    if environ.get(ENV_BUNDLE):
        from mindspore_relaygr.export import load_bundle_config  # verifies the manifest's sha256 sums

        config = load_bundle_config(environ[ENV_BUNDLE], overrides)
    else:
        config = load_config(environ.get(ENV_CONFIG) or None, overrides)
    return config, resolve_settings(config, **settings_env_overrides(environ))


def to_env(config_path: str | None, overrides: list[str], settings: Mapping[str, Any],
           engine_factory: str | None = None, bundle: str | None = None) -> dict[str, str]:
    """Environment variables that make `load_from_env` return this config and these settings."""
    env = {ENV_OVERRIDES: json.dumps(list(overrides))}
    if bundle:
        env[ENV_BUNDLE] = os.path.abspath(bundle)
    elif config_path:
        env[ENV_CONFIG] = os.path.abspath(config_path)
    if engine_factory:
        env[ENV_ENGINE_FACTORY] = engine_factory
    for key, value in settings.items():
        if value is None:
            continue
        if key == "admin_token":
            env[ENV_ADMIN_TOKEN] = str(value)
        elif isinstance(value, list):
            env[ENV_PREFIX + key.upper()] = json.dumps(value)
        else:
            env[ENV_PREFIX + key.upper()] = str(value).lower() if isinstance(value, bool) else str(value)
    return env
