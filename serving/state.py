"""Per-app state shared by the blueprint's views (stored in `app.extensions["relaygr"]`)."""

from __future__ import annotations

import threading
from dataclasses import dataclass

from mindspore_relaygr.config import RelayGRConfig, ServingConfig
from mindspore_relaygr.relay.admission import AdmissionControl
from mindspore_relaygr.relay.router import NginxConsistentHash
from serving.engine_holder import EngineHolder
from serving.metrics import ServingMetrics
from serving.schemas import Limits


@dataclass(frozen=True)
class AppState:
    config: RelayGRConfig
    settings: ServingConfig
    limits: Limits
    holder: EngineHolder
    metrics: ServingMetrics
    instance_id: str
    admission: AdmissionControl | None  # None: relay.admission_fraction is null (admit every rank)
    upstream: NginxConsistentHash | None  # nginx's try order over serving.upstream_servers (None: not set)
    parsing: threading.Semaphore  # serving.parse_slots: requests whose body is being parsed and validated
