"""Flask app factory: one app (and, after fork, one engine) per worker process."""

from __future__ import annotations

import importlib
import json
import logging
import os
import threading
from collections.abc import Callable
from typing import Any

from flask import Flask
from flask.json.provider import DefaultJSONProvider

from mindspore_relaygr.config import RelayGRConfig, ServingConfig, load_config
from mindspore_relaygr.errors import ConfigError
from mindspore_relaygr.relay.admission import AdmissionControl
from mindspore_relaygr.relay.router import NginxConsistentHash
from serving import api
from serving.catalogue import Catalogue
from serving.early_refusal import EarlyRefusal, refusal_pacer
from serving.engine_holder import Engine, EngineHolder
from serving.errors import register_error_handler
from serving.metrics import ServingMetrics
from serving.schemas import Limits
from serving.settings import (
    ENV_BUNDLE,
    ENV_ENGINE_FACTORY,
    ENV_OVERRIDES,
    load_from_env,
    require_admin_token,
    resolve_settings,
)
from serving.state import AppState

logger = logging.getLogger(__name__)

EngineFactory = Callable[..., Engine]  # (config, instance_id=...) -> engine, like RelayEngine.from_config


class _JSONProvider(DefaultJSONProvider):
    """Flask's JSON, plus numpy scalars and arrays (engine stats may carry them)."""

    @staticmethod
    def default(o: Any) -> Any:
        if hasattr(o, "tolist"):
            return o.tolist()
        return DefaultJSONProvider.default(o)


def relay_engine_factory(config: RelayGRConfig, instance_id: str) -> Engine:
    """The production engine; MindSpore is imported here, in the worker, never at import time."""
    from mindspore_relaygr.relay.engine import RelayEngine

    return RelayEngine.from_config(config, instance_id=instance_id)


def bundle_engine_factory(bundle_dir: str, overrides: list[str]) -> EngineFactory:
    """A factory that builds the RelayEngine on a serving bundle's weights (verified on load)."""

    def build(config: RelayGRConfig, instance_id: str) -> Engine:
        from mindspore_relaygr.relay.engine import RelayEngine

        return RelayEngine.from_bundle(bundle_dir, overrides, instance_id=instance_id)

    return build


def create_app(config: RelayGRConfig | None = None, engine: Engine | None = None,
               engine_factory: EngineFactory | None = None, settings: ServingConfig | None = None,
               catalogue: Catalogue | None = None) -> Flask:
    """Build the app. With neither `engine` nor `engine_factory`, the RelayEngine is built lazily. With a
    `catalogue` (a bundle's vocabularies), requests speak the catalogue's raw ids by default.

    The engine is never built here: `EngineHolder.start()` (gunicorn's post_fork hook, or the first
    request) builds it in a background thread of the process that serves.
    """
    if engine is not None and engine_factory is not None:
        raise ValueError("give engine or engine_factory, not both")
    config = config or load_config()
    settings = settings or resolve_settings(config)
    require_admin_token(settings)
    if engine is not None:
        holder = EngineHolder(engine=engine)
        instance_id = engine.instance_id
    else:
        factory = engine_factory or relay_engine_factory
        holder = EngineHolder(factory=lambda: factory(config, instance_id=settings.instance_id))
        instance_id = settings.instance_id
    app = Flask("relaygr")
    app.json = _JSONProvider(app)
    app.config["MAX_CONTENT_LENGTH"] = settings.max_content_length
    app.extensions["relaygr"] = state = AppState(config, settings, Limits.from_config(config, catalogue), holder,
                                         ServingMetrics(holder, instance_id), instance_id,
                                         admission_control(config, settings, holder), upstream_ring(settings),
                                         threading.BoundedSemaphore(settings.parse_slots))
    register_error_handler(app, settings.retry_after_s)
    app.url_map.merge_slashes = False  # "/v1//rank" is a JSON 404, not werkzeug's 308 redirect in HTML
    app.register_blueprint(api.bp)
    # a rank the queue alone refuses never reaches Flask
    app.wsgi_app = EarlyRefusal(app.wsgi_app, state, refusal_pacer(settings))
    return app


def admission_control(config: RelayGRConfig, settings: ServingConfig,
                      holder: EngineHolder | None = None) -> AdmissionControl | None:
    """The rank admission of this instance: a budget of relay.admission_fraction x trigger.slo_ms, and
    relay.last_try_factor x trigger.slo_ms for a rank on its last try behind nginx (serving.upstream_servers).

    Ranks are weighed by the engine's predicted device time; until ranks have been served, a predicted
    millisecond is taken to cost one measured millisecond. With relay.max_rank_batch > 1, the queue's cost
    follows the engine's batch factors (`Engine.queue_share`)."""
    fraction = config.relay.admission_fraction
    if fraction is None:
        return None
    budget_ms = fraction * config.trigger.slo_ms
    last_resort_ms = config.relay.last_try_factor * config.trigger.slo_ms if settings.upstream_servers else budget_ms
    share = None
    if config.relay.max_rank_batch > 1 and holder is not None:
        def share(queued: int) -> float:
            engine = holder.peek()
            return 1.0 if engine is None else engine.queue_share(queued)
    return AdmissionControl(budget_ms, initial_cost_ms=1.0, last_resort_budget_ms=last_resort_ms, queue_share=share)


def upstream_ring(settings: ServingConfig) -> NginxConsistentHash | None:
    """nginx's choice over serving.upstream_servers, which must name this instance (host:port)."""
    if not settings.upstream_servers:
        return None
    if settings.upstream_address not in settings.upstream_servers:
        raise ConfigError(f"serving.upstream_servers={settings.upstream_servers}: does not name this instance "
                          f"({settings.upstream_address}, from its host and port)")
    return NginxConsistentHash(settings.upstream_servers)


def import_factory(spec: str) -> EngineFactory:
    """"package.module:attr.attr" -> the callable it names."""
    module_name, _, attr_path = spec.partition(":")
    if not module_name or not attr_path:
        raise ConfigError(f"{ENV_ENGINE_FACTORY}={spec!r}: expected 'module:callable'")
    obj: Any = importlib.import_module(module_name)
    for attr in attr_path.split("."):
        obj = getattr(obj, attr)
    if not callable(obj):
        raise ConfigError(f"{ENV_ENGINE_FACTORY}={spec!r}: not callable")
    return obj


def create_app_from_env() -> Flask:
    """The app `relaygr serve` asked for (config, overrides and settings from RELAYGR_* variables)."""
    config, settings = load_from_env()
    spec = os.environ.get(ENV_ENGINE_FACTORY)
    if spec:
        factory = import_factory(spec)
    elif os.environ.get(ENV_BUNDLE):
        factory = bundle_engine_factory(os.environ[ENV_BUNDLE], json.loads(os.environ.get(ENV_OVERRIDES) or "[]"))
    else:
        factory = None
    catalogue = None
    if os.environ.get(ENV_BUNDLE):  # verified with its config by load_from_env
        from mindspore_relaygr.export import load_vocabulary

        catalogue = Catalogue.from_vocabulary(load_vocabulary(os.environ[ENV_BUNDLE]))
    return create_app(config, engine_factory=factory, settings=settings, catalogue=catalogue)
