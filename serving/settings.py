"""Serving settings of one instance: config `serving` section < environment < command line.

`relaygr serve` hands its config path, overrides and flags to gunicorn through `RELAYGR_*`
environment variables; `gunicorn.conf.py` (in the master) and `serving.wsgi` (in the worker) read
them back with `load_from_env`, so both see one resolved configuration.
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from mindspore_relaygr.config import RelayGRConfig, load_config
from mindspore_relaygr.errors import ConfigError

ENV_CONFIG = "RELAYGR_CONFIG"  # YAML config path (unset: the built-in defaults)
ENV_BUNDLE = "RELAYGR_BUNDLE"  # serving bundle directory (`relaygr export`); its config.yaml replaces ENV_CONFIG
ENV_OVERRIDES = "RELAYGR_OVERRIDES"  # JSON list of "section.key=value" overrides
ENV_ENGINE_FACTORY = "RELAYGR_ENGINE_FACTORY"  # "module:callable" (config, instance_id=...) -> engine
ENV_ADMIN_TOKEN = "RELAYGR_ADMIN_TOKEN"  # bearer token of /v1/admin/* (wins over serving.admin_token)
ENV_PREFIX = "RELAYGR_SERVING_"  # RELAYGR_SERVING_PORT=8081 sets `port`, and so on for every field


@dataclass(frozen=True)
class ServingSettings:
    """What one serving instance needs beyond the model/relay config (a `serving` config section)."""

    host: str = "127.0.0.1"  # bind address; loopback unless asked otherwise
    port: int = 8080
    instance_id: str = "i0"  # X-RelayGR-Instance, metrics label, engine thread name
    threads: int = 8  # gthread threads of the single worker process
    timeout_s: float = 120.0  # gunicorn worker heartbeat timeout
    graceful_timeout_s: float = 15.0  # finish in-flight requests on SIGTERM for this long
    keepalive_s: float = 75.0  # idle keep-alive; longer than nginx's upstream keepalive_timeout (60 s)
    max_content_length: int = 4 * 1024 * 1024  # request body cap in bytes (413 above it)
    admin_token: str | None = None  # null: /v1/admin/* needs no token (bind to loopback then)
    retry_after_s: int = 1  # Retry-After of 503 answers (overloaded, warming up)
    access_log: bool = False  # gunicorn access log to stderr
    log_level: str = "info"

    def __post_init__(self) -> None:
        checks = [
            (bool(self.host), "host", "must not be empty"),
            (0 < self.port < 65536, "port", "must be in 1..65535"),
            (bool(self.instance_id) and self.instance_id.isprintable() and " " not in self.instance_id,
             "instance_id", "must be a non-empty printable token without spaces"),
            (self.threads >= 1, "threads", "must be >= 1"),
            (self.timeout_s > 0, "timeout_s", "must be > 0"),
            (self.graceful_timeout_s > 0, "graceful_timeout_s", "must be > 0"),
            (self.keepalive_s >= 0, "keepalive_s", "must be >= 0"),
            (self.max_content_length >= 1024, "max_content_length", "must be >= 1024 bytes"),
            (self.admin_token is None or len(self.admin_token) >= 8, "admin_token", "must have >= 8 characters"),
            (self.retry_after_s >= 0, "retry_after_s", "must be >= 0"),
            (self.log_level in ("debug", "info", "warning", "error"), "log_level",
             "must be debug, info, warning or error"),
        ]
        for ok, key, why in checks:
            if not ok:
                shown = "<hidden>" if key == "admin_token" else repr(getattr(self, key))
                raise ConfigError(f"serving.{key}={shown}: {why}")

    @classmethod
    def from_config(cls, config: RelayGRConfig, **overrides: Any) -> ServingSettings:
        """Defaults < `config.serving` (when the config has that section) < non-None `overrides`."""
        values: dict[str, Any] = {}
        section = getattr(config, "serving", None)
        for f in dataclasses.fields(cls):
            if section is not None and hasattr(section, f.name):
                values[f.name] = getattr(section, f.name)
        unknown = set(overrides) - {f.name for f in dataclasses.fields(cls)}
        if unknown:
            raise ConfigError(f"unknown serving settings {sorted(unknown)}")
        values.update({k: v for k, v in overrides.items() if v is not None})
        return cls(**values)


def _parse(name: str, text: str, tp: Any) -> Any:
    try:
        if tp in (bool, "bool"):
            if text.lower() not in ("1", "0", "true", "false", "yes", "no"):
                raise ValueError(text)
            return text.lower() in ("1", "true", "yes")
        if tp in (int, "int"):
            return int(text)
        if tp in (float, "float"):
            return float(text)
    except ValueError as exc:
        raise ConfigError(f"{name}={text!r}: not a valid {tp}") from exc
    return text


def settings_env_overrides(environ: Mapping[str, str]) -> dict[str, Any]:
    """`RELAYGR_SERVING_<FIELD>` variables -> typed setting values."""
    out: dict[str, Any] = {}
    for f in dataclasses.fields(ServingSettings):
        name = ENV_PREFIX + f.name.upper()
        if name in environ:
            tp = f.type if not isinstance(f.type, str) else f.type.split(" | ")[0]
            out[f.name] = _parse(name, environ[name], tp)
    if environ.get(ENV_ADMIN_TOKEN):
        out["admin_token"] = environ[ENV_ADMIN_TOKEN]
    return out


def load_from_env(environ: Mapping[str, str] | None = None) -> tuple[RelayGRConfig, ServingSettings]:
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
    return config, ServingSettings.from_config(config, **settings_env_overrides(environ))


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
        else:
            env[ENV_PREFIX + key.upper()] = str(value).lower() if isinstance(value, bool) else str(value)
    return env
