"""Metric series exist from start-up (issue #22 item 5): every counter is exported at 0 before its first
event, for each of its known label values, also while the engine warms up; and a 405 is counted
under the route it addressed."""

from __future__ import annotations

import threading

from serving.app import create_app
from serving.metrics import REJECTION_ENDPOINTS, REJECTION_REASONS, STATS_METRICS
from tests.serving.conftest import FakeEngine


def counter_lines() -> list[str]:
    """Every labelled series of the scrape-time counters (and the rejections), at 0."""
    lines = [f'relaygr_rejections_total{{endpoint="{e}",reason="{r}"}} 0.0'
             for e in REJECTION_ENDPOINTS for r in REJECTION_REASONS]
    for name, kind, _, sources in STATS_METRICS:
        if kind == "counter":
            for _, labels in sources:
                label_text = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
                lines.append(f"{name}_total{{{label_text}}} 0.0" if labels else f"{name}_total 0.0")
    return lines


def test_counters_exist_at_zero_while_the_engine_warms_up_and_once_it_is_ready(tiny_config):
    release = threading.Event()

    def factory(config, instance_id):
        release.wait(30)
        return FakeEngine(config, instance_id)

    app = create_app(tiny_config, engine_factory=factory)
    client = app.test_client()
    warming = client.get("/metrics").get_data(as_text=True)
    assert "relaygr_engine_ready 0.0" in warming
    for line in counter_lines():
        assert line in warming, line
    assert "relaygr_prefills_total 0.0" in warming and "relaygr_prefill_errors_total 0.0" in warming
    assert "relaygr_queue_depth" not in warming  # a gauge has no value before the engine reports one
    release.set()
    assert app.extensions["relaygr"].holder.wait(10)
    ready = client.get("/metrics").get_data(as_text=True)
    assert "relaygr_engine_ready 1.0" in ready and "relaygr_queue_depth 0.0" in ready
    for line in counter_lines():
        assert line in ready, line


def test_a_405_is_counted_under_its_route(client):
    client.put("/v1/rank")
    client.open("/v1/preinfer", method="FROB")
    client.get("/no/such/route")
    text = client.get("/metrics").get_data(as_text=True)
    assert 'relaygr_http_requests_total{endpoint="/v1/rank",method="PUT",status="405"} 1.0' in text
    assert 'relaygr_http_requests_total{endpoint="/v1/preinfer",method="other",status="405"} 1.0' in text
    assert 'relaygr_http_requests_total{endpoint="unmatched",method="GET",status="404"} 1.0' in text
    assert 'endpoint="unmatched",method="PUT"' not in text
