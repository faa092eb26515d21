"""Admission control: what is admitted, what the per-rank cost is learned from (plain Python, fake clock)."""

from __future__ import annotations

import threading

import pytest

from mindspore_relaygr.relay import admission
from mindspore_relaygr.relay.admission import AdmissionControl


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    def advance_ms(self, ms: float) -> None:
        self.now += ms / 1e3


def test_admits_while_the_queue_drains_within_the_budget_and_refuses_beyond():
    ctl = AdmissionControl(budget_ms=50.0, initial_cost_ms=10.0, clock=FakeClock())
    assert [ctl.try_admit() for _ in range(7)] == [True] * 5 + [False] * 2  # (4 + 1) x 10 <= 50 < (5 + 1) x 10
    view = ctl.snapshot()
    assert (view.in_flight, view.admitted, view.rejected, view.work_ahead_ms) == (5, 5, 2, 50.0)
    ctl.finish()
    assert ctl.try_admit()  # a departure makes room for exactly one more


def test_cost_is_learned_from_the_spacing_of_departures_while_busy():
    clock = FakeClock()
    ctl = AdmissionControl(budget_ms=100.0, initial_cost_ms=10.0, smoothing=1.0, clock=clock)
    for _ in range(3):
        assert ctl.try_admit()
    clock.advance_ms(4.0)
    ctl.finish()  # first departure of the busy period: 4 ms after it began
    assert ctl.snapshot().cost_ms == pytest.approx(4.0)
    clock.advance_ms(25.0)
    ctl.finish()  # 25 ms after the previous departure
    assert ctl.snapshot().cost_ms == pytest.approx(25.0)
    ctl.finish()
    clock.advance_ms(1000.0)  # idle time between busy periods is not service time
    assert ctl.try_admit()
    clock.advance_ms(6.0)
    ctl.finish()
    assert ctl.snapshot().cost_ms == pytest.approx(6.0)


def test_slow_departures_shrink_how_many_are_admitted():
    clock = FakeClock()
    ctl = AdmissionControl(budget_ms=60.0, initial_cost_ms=5.0, smoothing=0.5, clock=clock)
    for _ in range(40):  # the server turns out to need 20 ms per rank
        assert ctl.try_admit()
        clock.advance_ms(20.0)
        ctl.finish()
    assert ctl.snapshot().cost_ms == pytest.approx(20.0, rel=1e-6)
    assert [ctl.try_admit() for _ in range(4)] == [True, True, True, False]


def test_ranks_refused_before_the_model_do_not_teach_the_cost():
    clock = FakeClock()
    ctl = AdmissionControl(budget_ms=100.0, initial_cost_ms=10.0, smoothing=1.0, clock=clock)
    assert ctl.try_admit() and ctl.try_admit()
    clock.advance_ms(0.1)
    ctl.finish(served=False)  # a 400: left the queue at once
    assert ctl.snapshot().cost_ms == 10.0 and ctl.snapshot().in_flight == 1
    clock.advance_ms(30.0)
    ctl.finish()
    assert ctl.snapshot().cost_ms == pytest.approx(30.1)


def test_busy_time_sums_the_periods_with_a_rank_in_flight_and_served_counts_what_was_answered():
    clock = FakeClock()
    ctl = AdmissionControl(budget_ms=100.0, initial_cost_ms=10.0, clock=clock)
    assert ctl.snapshot().busy_s == 0.0
    assert ctl.try_admit() and ctl.try_admit()
    clock.advance_ms(30.0)
    ctl.finish()
    clock.advance_ms(20.0)
    ctl.finish()  # the busy period lasted 50 ms
    clock.advance_ms(500.0)  # idle: not busy time
    assert ctl.snapshot().busy_s == pytest.approx(0.050)
    assert ctl.try_admit()
    clock.advance_ms(7.0)
    assert ctl.snapshot().busy_s == pytest.approx(0.057)  # an open busy period counts up to now
    ctl.finish(served=False)  # a 400 leaves the queue: busy while it was in it, but not served
    view = ctl.snapshot()
    assert view.busy_s == pytest.approx(0.057) and (view.served, view.admitted) == (2, 3)
    assert view.to_dict()["busy_s"] == pytest.approx(0.057) and view.to_dict()["served"] == 2


def test_finish_without_admission_is_an_error_and_bad_settings_are_refused():
    with pytest.raises(RuntimeError, match="without an admitted rank"):
        AdmissionControl(10.0, 1.0).finish()
    with pytest.raises(ValueError, match="budget_ms"):
        AdmissionControl(0.0, 1.0)
    with pytest.raises(ValueError, match="smoothing"):
        AdmissionControl(10.0, 1.0, smoothing=0.0)


def test_concurrent_admissions_never_exceed_the_bound():
    ctl = AdmissionControl(budget_ms=80.0, initial_cost_ms=10.0)
    admitted = []
    barrier = threading.Barrier(16)

    def worker():
        barrier.wait()
        admitted.append(ctl.try_admit())

    threads = [threading.Thread(target=worker) for _ in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sum(admitted) == 8 and ctl.snapshot().rejected == 8


def test_an_idle_instance_admits_even_a_rank_slower_than_the_budget():
    ctl = AdmissionControl(budget_ms=2.0, initial_cost_ms=5.0, clock=FakeClock())
    assert ctl.try_admit() and not ctl.try_admit()
    ctl.finish()
    assert ctl.try_admit()


def test_a_last_resort_rank_may_use_the_whole_slo_but_no_more():
    ctl = AdmissionControl(budget_ms=70.0, initial_cost_ms=30.0, clock=FakeClock(), last_resort_budget_ms=100.0)
    assert ctl.try_admit() and ctl.try_admit()  # 2 x 30 <= 70
    assert not ctl.try_admit()  # 3 x 30 > 70: a rank with another instance to try is refused
    assert ctl.try_admit(last_resort=True)  # 3 x 30 <= 100: the last instance takes it
    assert not ctl.try_admit(last_resort=True)  # 4 x 30 > 100: beyond the SLO even the last one refuses
    view = ctl.snapshot()
    assert (view.admitted, view.rejected, view.admitted_last_resort, view.in_flight) == (3, 2, 1, 3)
    assert view.to_dict()["last_resort_budget_ms"] == 100.0


def test_the_last_try_check_runs_only_when_the_budget_alone_would_refuse():
    ctl = AdmissionControl(budget_ms=70.0, initial_cost_ms=30.0, clock=FakeClock(), last_resort_budget_ms=100.0)
    asked = []

    def on_last_try() -> bool:
        asked.append(1)
        return True

    assert ctl.try_admit(last_resort=on_last_try) and ctl.try_admit(last_resort=on_last_try)  # within 70 ms
    assert asked == []
    assert ctl.try_admit(last_resort=on_last_try) and len(asked) == 1  # 90 > 70: asked once, admitted
    assert not ctl.try_admit(last_resort=lambda: False)  # not its last try: refused
    assert not ctl.try_admit(last_resort=on_last_try) and len(asked) == 2  # 120 > 100: refused, counted once
    view = ctl.snapshot()
    assert (view.admitted, view.rejected, view.admitted_last_resort) == (3, 2, 1)


def test_the_last_resort_budget_defaults_to_the_budget_and_cannot_be_smaller():
    ctl = AdmissionControl(budget_ms=20.0, initial_cost_ms=10.0, clock=FakeClock())
    assert ctl.try_admit() and ctl.try_admit() and not ctl.try_admit(last_resort=True)
    with pytest.raises(ValueError, match="last_resort_budget_ms"):
        AdmissionControl(budget_ms=20.0, initial_cost_ms=10.0, last_resort_budget_ms=10.0)


def test_work_is_counted_in_sizes_and_the_unit_cost_learned_per_size():
    clock = FakeClock()
    ctl = AdmissionControl(budget_ms=100.0, initial_cost_ms=10.0, smoothing=1.0, clock=clock)
    assert ctl.try_admit(size=4.0) and ctl.try_admit(size=5.0)  # (4 + 5) x 10 = 90 <= 100
    assert not ctl.try_admit(size=2.0)  # (9 + 2) x 10 > 100, though only two ranks are ahead
    assert ctl.snapshot().work == 9.0 and ctl.snapshot().work_ahead_ms == 90.0
    clock.now += 0.040  # the size-4 rank took 40 ms: 10 ms per unit
    ctl.finish(size=4.0)
    assert ctl.snapshot().cost_ms == pytest.approx(10.0) and ctl.snapshot().work == 5.0
    with pytest.raises(ValueError, match="size"):
        ctl.try_admit(size=0.0)


def test_the_work_already_served_since_the_last_departure_is_not_counted_again():
    clock = FakeClock()
    ctl = AdmissionControl(budget_ms=105.0, initial_cost_ms=1.0, clock=clock)
    assert ctl.try_admit(size=72.0)  # idle: admitted, its service starts now
    clock.advance_ms(10.0)
    assert not ctl.try_admit(size=72.0)  # 62 ms of it remain: 62 + 72 > 105
    assert ctl.snapshot().work_ahead_ms == pytest.approx(62.0)
    clock.advance_ms(30.0)
    assert ctl.try_admit(size=72.0)  # 32 remain: 32 + 72 <= 105, though 72 + 72 would not fit
    view = ctl.snapshot()
    assert (view.served_ms, view.work_ahead_ms) == (pytest.approx(40.0), pytest.approx(104.0))
    clock.advance_ms(32.0)
    ctl.finish(size=72.0)  # the first leaves: the second's service starts at this departure
    assert ctl.snapshot().served_ms == 0.0 and ctl.snapshot().work_ahead_ms == pytest.approx(72.0)


def test_the_credit_for_served_work_is_at_most_one_mean_rank_and_a_late_rank_loses_it():
    clock = FakeClock()
    ctl = AdmissionControl(budget_ms=105.0, initial_cost_ms=1.0, clock=clock)
    assert ctl.try_admit(size=72.0)
    clock.advance_ms(72.0)  # the rank in service reaches its prediction: all of it counts as done
    assert ctl.snapshot().served_ms == pytest.approx(72.0) and ctl.snapshot().work_ahead_ms == pytest.approx(0.0)
    clock.advance_ms(30.0)  # 30 ms late: taken to need 30 ms more
    assert (ctl.snapshot().served_ms, ctl.snapshot().work_ahead_ms) == (pytest.approx(42.0), pytest.approx(30.0))
    assert ctl.try_admit(size=72.0)  # 30 + 72 <= 105
    assert ctl.snapshot().served_ms == pytest.approx(72.0 - 30.0)  # a mean rank of the two is still 72 ms
    clock.advance_ms(200.0)  # stalled far past twice its prediction: no credit left, never a negative one
    assert ctl.snapshot().served_ms == 0.0 and ctl.snapshot().work_ahead_ms == pytest.approx(144.0)
    assert not ctl.try_admit(size=1.0)  # 144 + 1 > 105


def test_time_spent_elsewhere_is_taken_out_of_the_departure_spacing():
    clock = FakeClock()
    ctl = AdmissionControl(budget_ms=100.0, initial_cost_ms=10.0, smoothing=1.0, clock=clock)
    assert ctl.try_admit() and ctl.try_admit()
    clock.advance_ms(10.0)
    ctl.finish()
    assert ctl.snapshot().cost_ms == pytest.approx(10.0)
    for _ in range(20):  # refusals (and their CPU time) between two departures
        assert not ctl.try_admit(size=50.0)
        ctl.spent_elsewhere(0.5)
    clock.advance_ms(20.0)
    ctl.finish()  # 20 ms after the last departure, 10 of them spent on the refusals
    assert ctl.snapshot().cost_ms == pytest.approx(10.0)
    ctl.spent_elsewhere(5.0)  # idle: nothing to take it from, and it is not carried into the next busy period
    assert ctl.try_admit()
    clock.advance_ms(8.0)
    ctl.finish()
    assert ctl.snapshot().cost_ms == pytest.approx(8.0)


def test_refuse_early_needs_the_queue_alone_over_the_budget_or_a_key_whose_refused_size_still_does_not_fit():
    clock = FakeClock()
    ctl = AdmissionControl(budget_ms=50.0, initial_cost_ms=10.0, clock=clock)
    assert not ctl.refuse_early("u1")  # idle: everything is admitted
    assert ctl.try_admit(size=4.0)
    assert not ctl.try_admit(size=2.0, key="u1")  # 40 + 20 > 50: u1's size is remembered
    assert ctl.try_admit(size=1.0, key="u2")  # 40 + 10 <= 50
    assert ctl.snapshot().work_ahead_ms == pytest.approx(50.0)
    assert not ctl.refuse_early()  # an unknown rank might still be small enough: the queue alone is at the budget
    assert ctl.refuse_early("u1") == admission.RESENT  # 50 + 20 > 50 without reading it
    assert (ctl.snapshot().admitted, ctl.snapshot().rejected) == (2, 2)
    clock.advance_ms(30.0)  # 30 ms of the rank in service are done: 20 + 20 <= 50, u1 goes to try_admit
    assert not ctl.refuse_early("u1")
    assert ctl.try_admit(size=2.0, key="u1")  # admitted: its size is forgotten
    clock.advance_ms(200.0)  # the rank in service is late past twice its time: no credit, 70 ms ahead
    assert ctl.refuse_early() == ctl.refuse_early("u1") == ctl.refuse_early("never seen") == admission.QUEUE_FULL


def test_at_most_max_remembered_keys_are_kept(monkeypatch):
    monkeypatch.setattr("mindspore_relaygr.relay.admission.MAX_REMEMBERED", 2)
    ctl = AdmissionControl(budget_ms=10.0, initial_cost_ms=10.0, clock=FakeClock())
    assert ctl.try_admit()
    for key in ("a", "b", "c"):
        assert not ctl.try_admit(size=1.0, key=key)
    assert [ctl.refuse_early(k) for k in ("a", "b", "c")] == [None, admission.RESENT, admission.RESENT]  # "a" dropped


def test_batched_queues_admit_more_and_a_batch_departing_at_once_teaches_the_single_rank_cost():
    """queue_share(n): n queued ranks cost that share of their single calls (the device thread batches them)."""
    shares = {2: 0.8, 3: 0.7, 4: 0.5}

    def share(n: int) -> float:
        return shares.get(n, 0.5)

    ctl = AdmissionControl(budget_ms=50.0, initial_cost_ms=10.0, clock=FakeClock(), queue_share=share)
    # 5 ranks: 5 x 10 x 0.5 = 25 ms; unbatched 5 would fill the budget exactly
    assert [ctl.try_admit() for _ in range(11)] == [True] * 10 + [False]  # (9 + 1) x 10 x 0.5 <= 50 < 55
    view = ctl.snapshot()
    assert (view.queue_share, view.work_ahead_ms) == (0.5, 50.0)
    assert view.to_dict()["queue_share"] == 0.5

    clock = FakeClock()
    ctl = AdmissionControl(budget_ms=1000.0, initial_cost_ms=10.0, clock=clock, queue_share=share)
    for _ in range(300):  # batches of 4 ranks of 10 ms that take 20 ms together (share 0.5) and leave at once
        for _ in range(4):
            assert ctl.try_admit()
        clock.advance_ms(20.0)
        for _ in range(4):
            ctl.finish()
    # the departures' spacings (20, 0, 0, 0 ms), each over its queue's share (0.5 for the first, in a queue of
    # 4), average 10 ms per rank: the single rank's cost (the smoothed mean ends a cycle a little below it)
    assert 8.0 < ctl.snapshot().cost_ms < 12.0
    unbatched = AdmissionControl(budget_ms=1000.0, initial_cost_ms=10.0, clock=clock)
    for _ in range(300):
        for _ in range(4):
            assert unbatched.try_admit()
        clock.advance_ms(20.0)
        for _ in range(4):
            unbatched.finish()
    assert 3.0 < unbatched.snapshot().cost_ms < 6.0  # without the share: 5 ms per rank, half the single cost
