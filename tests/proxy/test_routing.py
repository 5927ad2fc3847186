"""Arm choice: shares checked with exact binomial tests, stickiness, forced arms, mirroring."""

from __future__ import annotations

import uuid

import pytest
from multidict import CIMultiDict
from scipy.stats import binomtest

from specproxy.config import RoutingConfig
from specproxy.proxy.routing import FORCED_ARM_HEADER, ForcedArmError, Router, sticky_point
from specproxy.records import Arm

NO_HEADERS: CIMultiDict[str] = CIMultiDict()
# A true share is rejected by mistake with probability 1e-3 per test; a wrong router (e.g. a
# share off by 0.03 at n=20000) is rejected with near certainty.
ALPHA = 1e-3


@pytest.mark.parametrize("share", [0.0, 0.1, 0.5, 0.8, 1.0])
def test_weighted_share_matches_configuration(share: float) -> None:
    router = Router(RoutingConfig(speculative_share=share, seed=7))
    n = 20_000
    hits = sum(router.choose(NO_HEADERS) is Arm.SPECULATIVE for _ in range(n))
    if share in (0.0, 1.0):
        assert hits == n * share
    else:
        assert binomtest(hits, n, share).pvalue > ALPHA


def test_weighted_choice_is_reproducible_with_a_seed() -> None:
    first = Router(RoutingConfig(seed=3))
    second = Router(RoutingConfig(seed=3))
    assert [first.choose(NO_HEADERS) for _ in range(200)] == [
        second.choose(NO_HEADERS) for _ in range(200)
    ]


@pytest.mark.parametrize("share", [0.25, 0.5, 0.9])
def test_sticky_key_space_share_matches_configuration(share: float) -> None:
    router = Router(RoutingConfig(mode="sticky", speculative_share=share))
    n = 20_000
    keys = [uuid.UUID(int=i * 7919 + 13).hex for i in range(n)]
    hits = sum(router.choose(CIMultiDict({"x-session-id": key})) is Arm.SPECULATIVE for key in keys)
    assert binomtest(hits, n, share).pvalue > ALPHA


def test_sticky_header_always_gets_the_same_arm_even_across_routers() -> None:
    cfg = RoutingConfig(mode="sticky", sticky_header="X-Tenant", seed=None)
    first, second = Router(cfg), Router(cfg)
    for i in range(200):
        headers = CIMultiDict({"x-tenant": f"tenant-{i}"})
        arms = {first.choose(headers) for _ in range(5)} | {second.choose(headers)}
        assert len(arms) == 1
        expected = Arm.SPECULATIVE if sticky_point(f"tenant-{i}") < 0.5 else Arm.BASELINE
        assert arms == {expected}


def test_sticky_by_body_user() -> None:
    router = Router(RoutingConfig(mode="sticky", sticky_source="user", speculative_share=0.5))
    users = [f"user-{i}" for i in range(100)]
    first = [router.choose(NO_HEADERS, user) for user in users]
    assert first == [router.choose(NO_HEADERS, user) for user in users]
    assert set(first) == {Arm.SPECULATIVE, Arm.BASELINE}


def test_sticky_without_a_key_falls_back_to_the_weighted_draw() -> None:
    router = Router(RoutingConfig(mode="sticky", speculative_share=0.5, seed=1))
    arms = {router.choose(NO_HEADERS) for _ in range(100)}
    assert arms == {Arm.SPECULATIVE, Arm.BASELINE}


def test_sticky_point_is_stable_and_uniform_range() -> None:
    assert sticky_point("abc") == sticky_point("abc")
    assert 0.0 <= sticky_point("abc") < 1.0
    assert sticky_point("abc") != sticky_point("abd")


def test_forced_arm_only_when_allowed() -> None:
    headers = CIMultiDict({FORCED_ARM_HEADER: "Baseline"})
    allowed = Router(RoutingConfig(speculative_share=1.0, allow_forced_arm=True))
    denied = Router(RoutingConfig(speculative_share=1.0, allow_forced_arm=False))
    assert allowed.choose(headers) is Arm.BASELINE
    assert denied.choose(headers) is Arm.SPECULATIVE


def test_forced_arm_must_name_an_arm() -> None:
    router = Router(RoutingConfig(allow_forced_arm=True))
    with pytest.raises(ForcedArmError, match="speculative"):
        router.choose(CIMultiDict({FORCED_ARM_HEADER: "canary"}))


@pytest.mark.parametrize("fraction", [0.0, 0.2, 1.0])
def test_mirror_fraction(fraction: float) -> None:
    router = Router(RoutingConfig(mirror_fraction=fraction, seed=5))
    n = 10_000
    hits = sum(router.mirror() for _ in range(n))
    if fraction in (0.0, 1.0):
        assert hits == n * fraction
    else:
        assert binomtest(hits, n, fraction).pvalue > ALPHA


def test_a_runtime_share_changes_the_weighted_draw() -> None:
    router = Router(RoutingConfig(speculative_share=0.5, seed=11))
    router.apply(0.1)
    assert router.share == 0.1
    n = 20_000
    hits = sum(router.choose(NO_HEADERS) is Arm.SPECULATIVE for _ in range(n))
    assert binomtest(hits, n, 0.1).pvalue > ALPHA
    with pytest.raises(ValueError, match="share"):
        router.apply(1.5)


def test_raising_the_sticky_share_moves_only_baseline_keys() -> None:
    cfg = RoutingConfig(mode="sticky", sticky_source="header", speculative_share=0.2)
    router = Router(cfg)
    keys = [f"user-{i}" for i in range(2000)]

    def arms() -> dict[str, Arm]:
        return {k: router.choose(CIMultiDict({"x-session-id": k})) for k in keys}

    before = arms()
    router.apply(0.6)
    after = arms()
    moved = [k for k in keys if before[k] is not after[k]]
    assert moved  # some keys moved ...
    assert all(before[k] is Arm.BASELINE and after[k] is Arm.SPECULATIVE for k in moved)
    assert all(0.2 <= sticky_point(k) < 0.6 for k in moved)  # ... exactly those in between
    router.apply(0.2)
    assert arms() == before  # lowering it again sends the same keys back


def test_a_treatment_turned_off_gets_nothing_forced_or_mirrored() -> None:
    cfg = RoutingConfig(speculative_share=1.0, allow_forced_arm=True, mirror_fraction=1.0)
    router = Router(cfg)
    router.apply(1.0, on=False)
    assert router.share == 0.0
    forced = CIMultiDict({FORCED_ARM_HEADER: "speculative"})
    assert router.choose(NO_HEADERS) is Arm.BASELINE
    assert router.choose(forced) is Arm.BASELINE
    assert not router.mirror()
    router.apply(1.0)
    assert router.choose(forced) is Arm.SPECULATIVE and router.mirror()
