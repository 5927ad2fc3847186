"""Arm choice: shares checked with exact binomial tests, stickiness (weighted rendezvous), forced
arms, mirroring, for the shorthand's two arms and for n named arms."""

from __future__ import annotations

import random
import uuid

import pytest
from multidict import CIMultiDict
from scipy.stats import binomtest

from specproxy.config import RoutingConfig
from specproxy.proxy.routing import (
    FORCED_ARM_HEADER,
    ForcedArmError,
    Router,
    rendezvous,
    sticky_point,
)
from specproxy.records import Arm

NO_HEADERS: CIMultiDict[str] = CIMultiDict()
# A true share is rejected by mistake with probability 1e-3 per test; a wrong router (e.g. a
# share off by 0.03 at n=20000) is rejected with near certainty.
ALPHA = 1e-3


@pytest.mark.parametrize("share", [0.0, 0.1, 0.5, 0.8, 1.0])
def test_weighted_share_matches_configuration(share: float) -> None:
    router = Router(RoutingConfig(speculative_share=share, seed=7))
    n = 20_000
    hits = sum(router.choose(NO_HEADERS) == "speculative" for _ in range(n))
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
    hits = sum(router.choose(CIMultiDict({"x-session-id": key})) == "speculative" for key in keys)
    assert binomtest(hits, n, share).pvalue > ALPHA


def test_sticky_header_always_gets_the_same_arm_even_across_routers() -> None:
    cfg = RoutingConfig(mode="sticky", sticky_header="X-Tenant", seed=None)
    first, second = Router(cfg), Router(cfg)
    for i in range(200):
        headers = CIMultiDict({"x-tenant": f"tenant-{i}"})
        arms = {first.choose(headers) for _ in range(5)} | {second.choose(headers)}
        assert len(arms) == 1
        expected = rendezvous(f"tenant-{i}", {"baseline": 0.5, "speculative": 0.5})
        assert arms == {expected}


def test_sticky_by_body_user() -> None:
    router = Router(RoutingConfig(mode="sticky", sticky_source="user", speculative_share=0.5))
    users = [f"user-{i}" for i in range(100)]
    first = [router.choose(NO_HEADERS, user) for user in users]
    assert first == [router.choose(NO_HEADERS, user) for user in users]
    assert set(first) == {"speculative", "baseline"}


def test_sticky_without_a_key_falls_back_to_the_weighted_draw() -> None:
    router = Router(RoutingConfig(mode="sticky", speculative_share=0.5, seed=1))
    arms = {router.choose(NO_HEADERS) for _ in range(100)}
    assert arms == {"speculative", "baseline"}


def test_sticky_point_is_stable_and_uniform_range() -> None:
    assert sticky_point("abc") == sticky_point("abc")
    assert 0.0 < sticky_point("abc") < 1.0
    assert sticky_point("abc") != sticky_point("abd")
    assert sticky_point("abc", "k2") != sticky_point("abc", "k4")  # one point per arm


def test_forced_arm_only_when_allowed() -> None:
    headers = CIMultiDict({FORCED_ARM_HEADER: "Baseline"})
    allowed = Router(RoutingConfig(speculative_share=1.0, allow_forced_arm=True))
    denied = Router(RoutingConfig(speculative_share=1.0, allow_forced_arm=False))
    assert allowed.choose(headers) == "baseline"
    assert denied.choose(headers) == "speculative"


def test_forced_arm_must_name_an_arm() -> None:
    router = Router(RoutingConfig(allow_forced_arm=True))
    with pytest.raises(ForcedArmError, match="baseline, speculative"):
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
    hits = sum(router.choose(NO_HEADERS) == "speculative" for _ in range(n))
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
    moved = [k for k in keys if before[k] != after[k]]
    assert moved  # some keys moved, all of them from the baseline to the speculative arm
    assert all(before[k] == "baseline" and after[k] == "speculative" for k in moved)
    hits = sum(a == "speculative" for a in after.values())
    assert binomtest(hits, len(keys), 0.6).pvalue > ALPHA
    router.apply(0.2)
    assert arms() == before  # lowering it again sends the same keys back


def test_a_treatment_turned_off_gets_nothing_forced_or_mirrored() -> None:
    cfg = RoutingConfig(speculative_share=1.0, allow_forced_arm=True, mirror_fraction=1.0)
    router = Router(cfg)
    router.apply(1.0, on=False)
    assert router.share == 0.0
    forced = CIMultiDict({FORCED_ARM_HEADER: "speculative"})
    assert router.choose(NO_HEADERS) == "baseline"
    assert router.choose(forced) == "baseline"
    assert not router.mirror()
    router.apply(1.0)
    assert router.choose(forced) == "speculative" and router.mirror()


THREE = {"base": 0.5, "k2": 0.25, "k4": 0.25}


def test_n_arms_get_their_shares_weighted_and_sticky() -> None:
    n = 20_000
    weighted = Router(RoutingConfig(seed=2), THREE, control="base")
    sticky = Router(RoutingConfig(mode="sticky"), THREE, control="base")
    drawn = [weighted.choose(NO_HEADERS) for _ in range(n)]
    keyed = [sticky.choose(CIMultiDict({"x-session-id": f"s{i}"})) for i in range(n)]
    for arms in (drawn, keyed):
        for arm, share in THREE.items():
            assert binomtest(arms.count(arm), n, share).pvalue > ALPHA


def test_adding_an_arm_moves_only_the_keys_the_new_arm_takes() -> None:
    """Weighted rendezvous: a key leaves its arm only for the new one, and the share that moves
    is the new arm's (an exact binomial test at the new arm's share of the key space)."""
    keys = [f"user-{i}" for i in range(20_000)]
    old = Router(RoutingConfig(mode="sticky"), THREE, control="base")
    # The same weights as before, plus a fourth arm: weight 1/3 of the old total, share 0.25.
    new = Router(
        RoutingConfig(mode="sticky"),
        {"base": 0.375, "k2": 0.1875, "k4": 0.1875, "eagle": 0.25},
        control="base",
    )
    moved = 0
    for key in keys:
        headers = CIMultiDict({"x-session-id": key})
        before, after = old.choose(headers), new.choose(headers)
        if before != after:
            assert after == "eagle"  # never from one old arm to another
            moved += 1
    assert binomtest(moved, len(keys), 0.25).pvalue > ALPHA


def test_forced_arm_by_name_and_a_paused_treatment() -> None:
    router = Router(RoutingConfig(allow_forced_arm=True), THREE, control="base")
    assert router.choose(CIMultiDict({FORCED_ARM_HEADER: "K4"})) == "k4"
    router.apply({"k2": 0.25, "k4": 0.25}, paused=frozenset({"k4"}))
    assert router.choose(CIMultiDict({FORCED_ARM_HEADER: "k4"})) == "base"
    assert router.shares == {"base": 0.75, "k2": 0.25, "k4": 0.0}
    with pytest.raises(ForcedArmError, match="base, k2, k4"):
        router.choose(CIMultiDict({FORCED_ARM_HEADER: "k8"}))


def test_treatment_shares_over_one_are_scaled_down() -> None:
    router = Router(RoutingConfig(), THREE, control="base")
    router.apply({"k2": 0.9, "k4": 0.6})
    assert router.shares == pytest.approx({"base": 0.0, "k2": 0.6, "k4": 0.4})
    with pytest.raises(ValueError, match="not a treatment"):
        router.apply({"base": 0.5})


def test_shadows_go_to_the_control_and_the_controls_to_a_treatment() -> None:
    n = 10_000
    router = Router(RoutingConfig(seed=4), {"base": 0.4, "k2": 0.45, "k4": 0.15}, control="base")
    assert router.shadow_arm("k2") == "base" and router.shadow_arm("k4") == "base"
    drawn = [router.shadow_arm("base") for _ in range(n)]
    assert binomtest(drawn.count("k2"), n, 0.75).pvalue > ALPHA  # by the treatments' shares
    router.apply({"k2": 0.3, "k4": 0.3}, paused=frozenset({"k2", "k4"}))
    assert router.shadow_arm("base") is None  # every treatment off: no shadow


def test_the_weighted_draw_walks_the_current_shares_in_arm_order() -> None:
    """Each draw is one uniform point on the current shares laid end to end, the control's
    first: the same arms a seeded generator gives by hand, after every `apply` too."""
    router = Router(RoutingConfig(seed=5), THREE, control="base")
    rng = random.Random(5)

    def by_hand(shares: dict[str, float]) -> str:
        point = rng.random() * sum(shares.values())
        for arm, share in shares.items():
            point -= share
            if point < 0.0:
                return arm
        raise AssertionError("the point fell past every share")

    for treatments in [None, {"k2": 0.6, "k4": 0.1}, {"k2": 0.0, "k4": 0.05}]:
        if treatments is not None:
            router.apply(treatments)
        shares = router.shares
        assert [router.choose(NO_HEADERS) for _ in range(300)] == [
            by_hand(shares) for _ in range(300)
        ]
