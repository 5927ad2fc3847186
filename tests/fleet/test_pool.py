from __future__ import annotations

from collections import Counter

import pytest

from specproxy.config import OutlierConfig
from specproxy.fleet.pool import Endpoint, EndpointPool


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


A, B, C = "http://a:8000", "http://b:8000", "http://c:8000"


def until(ep: Endpoint) -> float | None:
    """The end of the endpoint's ejection (a call, so that mypy does not narrow the field)."""
    return ep.ejected_until


def down(pool: EndpointPool) -> bool:
    """`pool.down` (a call, so that mypy does not narrow the property)."""
    return pool.down


def test_idle_pool_round_robins() -> None:
    pool = EndpointPool([A, B, C])
    seen = []
    for _ in range(6):
        ep = pool.acquire()
        seen.append(ep.url)
        pool.release(ep, ok=True)
    assert seen == [A, B, C, A, B, C]


def test_least_outstanding_wins_over_round_robin() -> None:
    pool = EndpointPool([A, B])
    held = [pool.acquire(), pool.acquire(), pool.acquire()]  # A, B, A
    assert [ep.url for ep in held] == [A, B, A]
    pool.release(held[1], ok=True)  # B now has 0 outstanding, A has 2
    assert pool.acquire().url == B
    assert pool.acquire().url == B  # A 2, B 1 -> B again
    counts = {ep.url: ep.outstanding for ep in pool.endpoints}
    assert counts == {A: 2, B: 2}


def test_balances_many_concurrent_requests_evenly() -> None:
    pool = EndpointPool([A, B, C])
    held = [pool.acquire() for _ in range(30)]
    assert Counter(ep.url for ep in held) == {A: 10, B: 10, C: 10}


def test_consecutive_failures_eject_and_traffic_moves() -> None:
    clock = Clock()
    pool = EndpointPool([A, B], OutlierConfig(eject_after_failures=3), clock=clock)
    for _ in range(3):
        a, b = pool.acquire(), pool.acquire()
        assert (a.url, b.url) == (A, B)
        pool.release(a, ok=False)
        pool.release(b, ok=True)
    assert a.ejected
    urls = {pool.acquire().url for _ in range(10)}
    assert urls == {B}


def test_a_success_resets_the_failure_streak() -> None:
    pool = EndpointPool([A], OutlierConfig(eject_after_failures=3))
    for ok in (False, False, True, False, False):
        pool.release(pool.acquire(), ok=ok)
    assert not pool.endpoints[0].ejected
    pool.release(pool.acquire(), ok=False)
    assert pool.endpoints[0].ejected


def test_ejected_endpoint_returns_only_after_a_successful_probe() -> None:
    clock = Clock()
    policy = OutlierConfig(eject_after_failures=1, base_ejection_s=30, max_ejection_s=70)
    pool = EndpointPool([A, B], policy, clock=clock)
    a = pool.acquire()
    assert a.url == A
    pool.release(a, ok=False)
    assert until(a) is not None and until(a) == 1030.0
    pool.probe(A, ok=True)  # too early: ignored
    assert until(a) is not None and pool.due_for_probe() == ()
    clock.now = 1031.0
    assert pool.due_for_probe() == (a,)
    assert until(a) is not None  # time alone does not readmit it
    pool.probe(A, ok=False)  # failed probe: ejected again, for longer (2 * 30)
    assert until(a) == 1091.0
    clock.now = 1091.0
    pool.probe(A, ok=True)
    assert not until(a) is not None
    # third ejection is capped at max_ejection_s
    pool.release(pool.acquire(), ok=True)
    a.outstanding += 1
    pool.release(a, ok=False)
    assert until(a) == 1091.0 + 70


def test_all_ejected_routes_to_all_panic_mode() -> None:
    pool = EndpointPool([A, B], OutlierConfig(eject_after_failures=1))
    for _ in range(2):
        pool.release(pool.acquire(), ok=False)
    assert all(ep.ejected for ep in pool.endpoints)
    urls = [pool.acquire().url for _ in range(4)]
    assert Counter(urls) == {A: 2, B: 2}


def test_ejection_disabled_with_zero() -> None:
    pool = EndpointPool([A], OutlierConfig(eject_after_failures=0))
    for _ in range(100):
        pool.release(pool.acquire(), ok=False)
    assert not pool.endpoints[0].ejected


def test_update_keeps_state_of_survivors_and_in_flight_release_works() -> None:
    pool = EndpointPool([A, B], OutlierConfig(eject_after_failures=1))
    a = pool.acquire()
    b = pool.acquire()
    pool.release(b, ok=False)
    pool.update([B, C])
    assert pool.urls == (B, C)
    assert pool.endpoints[0] is b and b.ejected
    pool.release(a, ok=True)  # A left the pool while in flight
    assert a.outstanding == 0
    assert {pool.acquire().url for _ in range(3)} == {C}


def test_empty_pool_is_refused() -> None:
    with pytest.raises(ValueError):
        EndpointPool([])
    pool = EndpointPool([A])
    with pytest.raises(ValueError):
        pool.update([])
    assert pool.urls == (A,)


def test_duplicates_collapse() -> None:
    assert EndpointPool([A, A, B]).urls == (A, B)


def test_no_verdict_leaves_the_streak_alone() -> None:
    pool = EndpointPool([A], OutlierConfig(eject_after_failures=2))
    pool.release(pool.acquire(), ok=False)
    pool.release(pool.acquire(), ok=None)  # a client that went away says nothing
    assert pool.endpoints[0].failures == 1 and pool.endpoints[0].outstanding == 0
    pool.release(pool.acquire(), ok=False)
    assert pool.endpoints[0].ejected


def test_a_pool_is_down_when_every_endpoint_is_ejected_and_up_again_after_a_probe() -> None:
    clock = Clock()
    pool = EndpointPool([A, B], OutlierConfig(eject_after_failures=1), clock=clock)
    assert not down(pool)
    pool.release(pool.acquire(), ok=False)  # A out, B still in rotation
    assert not down(pool)
    assert pool.acquire_other([B], panic=False) is None  # A is ejected: not without panic
    other = pool.acquire_other([B])  # panic mode (the default) still offers it
    assert other is not None and other.url == A
    pool.release(other, ok=None)
    pool.release(pool.acquire(), ok=False)  # B out too
    assert down(pool)
    pool.probe(A, ok=True)  # its ejection is not over yet: stays out
    assert down(pool)
    clock.now += 30.0
    pool.probe(A, ok=True)  # every endpoint ejected: the probe readmits it all the same
    assert not down(pool)
    assert [pool.acquire().url for _ in range(2)] == [A, A]  # B stays out until its own probe
