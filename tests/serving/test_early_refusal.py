"""The refusal pacer of serving.early_refusal: refusals of resent ranks are spaced to
serving.resent_refusals_per_s (fake clocks, a recorded sleep: no timing)."""

from __future__ import annotations

import pytest

from serving.early_refusal import RefusalPacer
from tests.relay.test_admission import FakeClock
from tests.serving.conftest import rank_body
from tests.serving.test_admission_http import clock, fill_the_budget, make_app, post_rank  # noqa: F401 - clock: the fake admission clock


def test_the_pacer_spaces_refusals_and_never_holds_one_past_its_bound():
    now = FakeClock()
    pacer = RefusalPacer(rate_per_s=100.0, max_delay_s=0.025, clock=now)
    assert [pacer.delay_s() for _ in range(3)] == pytest.approx([0.0, 0.01, 0.02])
    assert pacer.delay_s() == 0.025  # its slot would be 30 ms away: the bound, and no slot reserved
    now.advance_ms(30.0)
    assert pacer.delay_s() == pytest.approx(0.0)  # the reserved slots have passed


def test_only_resent_ranks_wait_for_the_pacer():
    app, engine = make_app(fraction=0.5)
    client = app.test_client()
    slept: list[float] = []
    app.wsgi_app.pacer = RefusalPacer(rate_per_s=200.0, max_delay_s=1.0, clock=FakeClock())
    app.wsgi_app.sleep = slept.append
    threads = fill_the_budget(client, engine)  # 40 ms ahead: the budget, not over it
    hdrs = {"X-RelayGR-Affinity": "again"}
    assert client.post("/v1/rank", json=rank_body("again"), headers=hdrs).status_code == 503  # first refusal
    assert slept == []
    for _ in range(3):
        assert client.post("/v1/rank", json=rank_body("again"), headers=hdrs).status_code == 503
    assert slept == pytest.approx([0.0, 0.005, 0.01])  # resent at once: one every 5 ms
    assert post_rank(client, rank_body("new"))[0] == 503 and len(slept) == 3  # refused after parsing: no wait
    engine.release.set()
    for t in threads:
        t.join(30)
