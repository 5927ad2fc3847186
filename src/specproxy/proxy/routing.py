"""Which arm serves a request, and whether it is mirrored: pure decisions, no I/O.

Each arm has a share of the traffic (`Config.arm_shares`: the weights normalised). Weighted mode
draws an arm from a seeded RNG by share. Sticky mode uses weighted rendezvous (highest random
weight) hashing: for a key (a header or the body's `user`) every arm scores
`-share / ln(u)`, with `u` a BLAKE2b hash of (key, arm name) in (0, 1), and the highest score
wins. The same key always lands on the same arm, each arm gets its share of the key space, and
because an arm's score depends only on the key, its own name and its own share:

- adding an arm moves only the keys the new arm wins (its share of them), none between old arms;
- raising one arm's share moves keys only to it, lowering it only away from it.

A request without a sticky key falls back to the weighted draw.

The shares change at run time (`Router.apply`, called by `control.live` when an arm-control
event arrives): every treatment has its share, the control serves the rest. With the experiment
stopped every request goes to the control, a forced `x-specproxy-arm` included, and nothing is
mirrored; a paused treatment gets nothing (share 0), forced requests for it go to the control.

Mirroring: a treatment's request is shadowed to the control; a control request's shadow goes
to one treatment, drawn by the treatments' shares (none while every treatment is off).
"""

from __future__ import annotations

import hashlib
import math
import random
from collections.abc import Mapping, Sequence

from specproxy.config import Config, RoutingConfig
from specproxy.records import SHORTHAND_CONTROL, SHORTHAND_TREATMENT, Arm

__all__ = [
    "FORCED_ARM_HEADER",
    "ForcedArmError",
    "Router",
    "rendezvous",
    "router_of",
    "sticky_point",
]

FORCED_ARM_HEADER = "x-specproxy-arm"
_TWO_64 = float(2**64)


class ForcedArmError(ValueError):
    """The `x-specproxy-arm` header named no known arm."""


def sticky_point(key: str, arm: str = "") -> float:
    """A stable, uniform point in (0, 1) for a sticky key and an arm (identical across processes
    and runs)."""
    digest = hashlib.blake2b(f"{arm}\x00{key}".encode() if arm else key.encode(), digest_size=8)
    return (int.from_bytes(digest.digest(), "big") + 0.5) / _TWO_64


def rendezvous(key: str, shares: Mapping[str, float]) -> str | None:
    """The arm a sticky key belongs to by weighted rendezvous hashing (None: every share is 0).

    An arm's score is `-share / ln(u)` for its uniform point `u`: the winner is arm i with
    probability share_i / sum(shares), and no arm's score depends on another arm."""
    best: str | None = None
    best_score = 0.0
    for arm, share in shares.items():
        if share <= 0.0:
            continue
        score = -share / math.log(sticky_point(key, arm))
        if score > best_score:
            best, best_score = arm, score
    return best


class Router:
    """Arm choice and mirror decision for one routing configuration and its arms."""

    __slots__ = (
        "_arms",
        "_cfg",
        "_control",
        "_draw_weights",
        "_forced",
        "_on",
        "_paused",
        "_rng",
        "_shares",
        "_sticky_header",
        "_sticky_user",
        "_treatments",
    )

    def __init__(
        self,
        cfg: RoutingConfig,
        shares: Mapping[str, float] | None = None,
        *,
        control: str = SHORTHAND_CONTROL,
    ) -> None:
        """`shares`: every arm's share, the control's included (`Config.arm_shares`); None: the
        shorthand's two arms split by `cfg.speculative_share`."""
        if shares is None:
            share = cfg.speculative_share
            shares = {SHORTHAND_CONTROL: 1.0 - share, SHORTHAND_TREATMENT: share}
        if control not in shares:
            raise ValueError(f"the control {control!r} is not one of the arms {sorted(shares)}")
        self._cfg = cfg
        self._rng = random.Random(cfg.seed)
        self._control = control
        self._arms: tuple[str, ...] = (control, *(a for a in shares if a != control))
        self._treatments: tuple[str, ...] = self._arms[1:]
        self._shares: dict[str, float] = {}
        self._draw_weights: tuple[tuple[float, ...], float] = ((), 0.0)  # `apply` sets them
        self._paused: frozenset[str] = frozenset()
        self._on = True
        self._forced = cfg.allow_forced_arm
        sticky = cfg.mode == "sticky"
        self._sticky_header = (
            cfg.sticky_header if sticky and cfg.sticky_source == "header" else None
        )
        self._sticky_user = sticky and cfg.sticky_source == "user"
        self.apply({a: shares[a] for a in self._treatments})

    @property
    def arms(self) -> tuple[str, ...]:
        """Every arm, the control first."""
        return self._arms

    @property
    def control(self) -> str:
        return self._control

    @property
    def share(self) -> float:
        """The treatments' combined share now (0 while the experiment is off)."""
        return sum(self.shares[a] for a in self._treatments)

    @property
    def shares(self) -> dict[str, float]:
        """Each arm's share now, the control's the rest (all of it while stopped)."""
        if not self._on:
            return {a: 1.0 if a == self._control else 0.0 for a in self._arms}
        return dict(self._shares)

    def apply(
        self,
        treatments: Mapping[str, float] | float,
        *,
        on: bool = True,
        paused: frozenset[str] = frozenset(),
    ) -> None:
        """Route each treatment's share of the traffic (or key space) to it from now on, the
        control the rest; `on=False`: everything to the control, forced requests and shadows
        included (stopped); a `paused` treatment gets nothing, forced requests included. A
        float is the shorthand's one treatment's share.

        Shares summing to more than 1 are scaled down to sum 1 (the control then gets none)."""
        if not isinstance(treatments, Mapping):
            treatments = {self._treatments[0]: treatments} if self._treatments else {}
        for arm, share in treatments.items():
            if arm not in self._treatments:
                raise ValueError(f"{arm!r} is not a treatment arm ({', '.join(self._treatments)})")
            if not 0.0 <= share <= 1.0:
                raise ValueError(f"share must be in [0, 1], got {share}")
        given = {a: 0.0 if a in paused else float(treatments.get(a, 0.0)) for a in self._treatments}
        total = sum(given.values())
        if total > 1.0:
            given = {a: s / total for a, s in given.items()}
            total = 1.0
        self._shares = {self._control: max(0.0, 1.0 - total), **given}
        self._paused = frozenset(paused)
        self._on = on
        # Each arm's weight in `_arms`' order and their sum, as `_draw` computes them from
        # `shares`: computed here once, not per request.
        now = self.shares
        weights = tuple(now[a] for a in self._arms)
        self._draw_weights = (weights, sum(weights))

    def choose(self, headers: Mapping[str, str], user: object = None) -> Arm:
        """The arm for a request; `headers` must look keys up case-insensitively.

        Raises `ForcedArmError` when a forced arm is allowed but the header names no arm.
        """
        if self._forced:
            forced = headers.get(FORCED_ARM_HEADER)
            if forced is not None:
                arm = forced.strip().lower()
                if arm not in self._arms:
                    raise ForcedArmError(
                        f"{FORCED_ARM_HEADER} must name an arm ({', '.join(self._arms)}),"
                        f" got {forced[:64]!r}"
                    )
                served = self._on and arm not in self._paused
                return arm if served else self._control
        key: str | None = None
        if self._sticky_header is not None:
            key = headers.get(self._sticky_header)
        elif self._sticky_user and isinstance(user, str):
            key = user
        if key:
            return rendezvous(key, self.shares) or self._control
        weights, total = self._draw_weights
        return self._pick(self._arms, weights, total)

    def mirror(self) -> bool:
        """Whether this request is also sent to another arm as a shadow."""
        fraction = self._cfg.mirror_fraction
        return self._on and fraction > 0.0 and self._rng.random() < fraction

    def shadow_arm(self, primary: Arm) -> Arm | None:
        """Where the shadow of a request served by `primary` goes: a treatment's to the
        control, the control's to a treatment drawn by share (None: every treatment is off)."""
        if primary != self._control:
            return self._control
        live = [a for a in self._treatments if self._on and self._shares[a] > 0]
        if not live:
            return None
        return self._draw(self._shares, live)

    def _draw(self, shares: Mapping[str, float], arms: Sequence[str]) -> Arm:
        weights = [shares[a] for a in arms]
        return self._pick(arms, weights, sum(weights))

    def _pick(self, arms: Sequence[str], weights: Sequence[float], total: float) -> Arm:
        """One of `arms` drawn by `weights` (whose sum is `total`)."""
        if total <= 0.0:
            return self._control
        point = self._rng.random() * total
        for arm, weight in zip(arms, weights, strict=True):
            point -= weight
            if point < 0.0:
                return arm
        return next(a for a, w in zip(reversed(arms), reversed(weights), strict=True) if w > 0)


def router_of(cfg: Config) -> Router:
    """The router of a configuration: its arms' shares, its control."""
    return Router(cfg.routing, cfg.arm_shares(), control=cfg.control_arm)
