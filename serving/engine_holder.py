"""One engine per worker process, built after fork in a background thread.

MindSpore state does not survive fork, so the gunicorn master never builds an engine: the worker
starts the build in its `post_fork` hook (or on the first request when no hook ran), keeps
answering /healthz meanwhile, and /readyz turns 200 once the engine is warmed up and calibrated.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable
from typing import Any, Protocol

from mindspore_relaygr.relay.stats import EngineStats
from mindspore_relaygr.relay.types import PreinferResult, RankResult
from serving.errors import NotReady

logger = logging.getLogger(__name__)


class Engine(Protocol):
    """What serving needs from `mindspore_relaygr.relay.engine.RelayEngine`."""

    instance_id: str

    @property
    def ready(self) -> bool: ...
    @property
    def model_version(self) -> str: ...
    def preinfer(self, user_id: str, history: dict, num_candidates: int | None = None) -> PreinferResult: ...
    def predicted_rank_ms(self, user_id: str, history: Any, candidate_ids: Any) -> float: ...
    def queue_share(self, queued: int) -> float: ...
    def rank(self, user_id: str, history: Any, candidate_ids: Any, top_k: int | None = None) -> RankResult: ...
    def stats(self) -> EngineStats: ...
    def flush(self) -> None: ...
    def close(self) -> None: ...


STARTING, READY, DRAINING, FAILED, CLOSED = "starting", "ready", "draining", "failed", "closed"


class EngineHolder:
    """Builds the engine once per process (lazily, off the request path) and hands it out when ready."""

    def __init__(self, factory: Callable[[], Engine] | None = None, engine: Engine | None = None) -> None:
        if (factory is None) == (engine is None):
            raise ValueError("give exactly one of factory or engine")
        self._factory = factory
        self._engine = engine
        self._error: str | None = None
        self._closed = False
        self._draining = False
        self._thread: threading.Thread | None = None
        self._pid = os.getpid() if engine is not None else None  # the process the engine belongs to
        self._lock = threading.Lock()

    def start(self) -> None:
        """Begin building in a daemon thread (idempotent; a no-op when an engine was given)."""
        with self._lock:
            if self._factory is not None and self._pid not in (None, os.getpid()):
                # Forked after a build began: that engine and its threads did not come along.
                self._engine, self._thread, self._error = None, None, None
            if self._engine is not None or self._thread is not None or self._closed:
                return
            self._pid = os.getpid()
            self._thread = threading.Thread(target=self._build, name="relaygr-engine-init", daemon=True)
            self._thread.start()

    def _build(self) -> None:
        t0 = time.perf_counter()
        logger.info("building the engine in pid %d", os.getpid())
        try:
            engine = self._factory()
        except BaseException as exc:  # noqa: BLE001 - reported by /healthz and /readyz
            logger.exception("engine start-up failed")
            with self._lock:
                self._error = f"{type(exc).__name__}: {exc}"
            return
        with self._lock:
            closed = self._closed
            if not closed:
                self._engine = engine
        if closed:
            engine.close()
            return
        logger.info("engine ready in %.1f s (model version %s)", time.perf_counter() - t0, engine.model_version)

    def drain(self) -> None:
        """The instance is shutting down: not ready from now on, though a ready engine still serves (get)."""
        self._draining = True

    @property
    def state(self) -> str:
        """starting | ready | draining | failed | closed."""
        if self._closed:
            return CLOSED
        if self._error is not None:
            return FAILED
        if self._draining:
            return DRAINING
        return READY if self.serving else STARTING

    @property
    def serving(self) -> bool:
        """Whether a built, warmed-up engine answers requests (also while draining)."""
        engine = self._engine
        return engine is not None and engine.ready and not self._closed

    @property
    def error(self) -> str | None:
        return self._error

    def peek(self) -> Engine | None:
        """The engine if it has been built (ready or not), without starting a build."""
        return self._engine

    def get(self) -> Engine:
        """The ready engine, else NotReady (starting the build if nothing started it yet)."""
        engine = self._engine
        if engine is not None and self._pid != os.getpid():
            raise NotReady(f"the engine was built in pid {self._pid}, not this process: build it after fork")
        if engine is not None and engine.ready and not self._closed:
            return engine
        self.start()
        state = self.state
        if state == FAILED:
            raise NotReady(f"engine failed to start: {self._error}")
        raise NotReady("instance is shutting down" if state == CLOSED else "engine is warming up")

    def wait(self, timeout: float) -> bool:
        """Block until ready or failed (tests and start-up scripts); True when ready."""
        self.start()
        deadline = time.monotonic() + timeout
        while self.state == STARTING and time.monotonic() < deadline:
            time.sleep(0.01)
        return self.state == READY

    def close(self) -> None:
        """Stop the engine's executor thread (worker exit)."""
        with self._lock:
            self._closed = True
            engine, self._engine = self._engine, None
        if engine is not None:
            engine.close()
