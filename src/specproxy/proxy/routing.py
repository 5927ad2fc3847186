"""Which arm serves a request, and whether it is mirrored: pure decisions, no I/O.

Weighted mode draws from a seeded RNG. Sticky mode hashes a key (a header or the body's `user`)
with BLAKE2b into [0, 1): the same key always lands on the same arm, and because the hash is
uniform the share of the key space sent to the speculative arm equals `speculative_share`.
A request without a sticky key falls back to the weighted draw.

The share can change at run time (`Router.apply`, called by `control.live` when an arm-control
event arrives): weighted mode draws against the new probability from the next request on; sticky
mode sends the keys whose point is below the share to the speculative arm, so raising the share
moves only keys from the baseline to the speculative arm (those between the old and the new
share) and lowering it moves only keys back. With the treatment off (paused, or the experiment
stopped) every request goes to the baseline, a forced `x-specproxy-arm: speculative` included,
and nothing is mirrored.
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Mapping

from specproxy.config import RoutingConfig
from specproxy.records import Arm

__all__ = ["FORCED_ARM_HEADER", "ForcedArmError", "Router", "sticky_point"]

FORCED_ARM_HEADER = "x-specproxy-arm"
_TWO_64 = float(2**64)


class ForcedArmError(ValueError):
    """The `x-specproxy-arm` header named no known arm."""


def sticky_point(key: str) -> float:
    """A stable, uniform point in [0, 1) for a sticky key (identical across processes and runs)."""
    digest = hashlib.blake2b(key.encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") / _TWO_64


class Router:
    """Arm choice and mirror decision for one routing configuration."""

    __slots__ = ("_cfg", "_forced", "_on", "_rng", "_share", "_sticky_header", "_sticky_user")

    def __init__(self, cfg: RoutingConfig) -> None:
        self._cfg = cfg
        self._rng = random.Random(cfg.seed)
        self._share = cfg.speculative_share
        self._on = True
        self._forced = cfg.allow_forced_arm
        sticky = cfg.mode == "sticky"
        self._sticky_header = (
            cfg.sticky_header if sticky and cfg.sticky_source == "header" else None
        )
        self._sticky_user = sticky and cfg.sticky_source == "user"

    @property
    def share(self) -> float:
        """The speculative arm's share now (0 while the treatment is off)."""
        return self._share if self._on else 0.0

    def apply(self, share: float, *, on: bool = True) -> None:
        """Route `share` of the traffic (or key space) to the speculative arm from now on;
        `on=False`: none, forced requests and shadows included (paused or stopped)."""
        if not 0.0 <= share <= 1.0:
            raise ValueError(f"share must be in [0, 1], got {share}")
        self._share = share
        self._on = on

    def choose(self, headers: Mapping[str, str], user: object = None) -> Arm:
        """The arm for a request; `headers` must look keys up case-insensitively.

        Raises `ForcedArmError` when a forced arm is allowed but the header names no arm.
        """
        if self._forced:
            forced = headers.get(FORCED_ARM_HEADER)
            if forced is not None:
                try:
                    arm = Arm(forced.strip().lower())
                except ValueError:
                    raise ForcedArmError(
                        f"{FORCED_ARM_HEADER} must be 'speculative' or 'baseline', got {forced!r}"
                    ) from None
                return arm if self._on else Arm.BASELINE
        key: str | None = None
        if self._sticky_header is not None:
            key = headers.get(self._sticky_header)
        elif self._sticky_user and isinstance(user, str):
            key = user
        point = sticky_point(key) if key else self._rng.random()
        return Arm.SPECULATIVE if self._on and point < self._share else Arm.BASELINE

    def mirror(self) -> bool:
        """Whether this request is also sent to the other arm as a shadow."""
        fraction = self._cfg.mirror_fraction
        return self._on and fraction > 0.0 and self._rng.random() < fraction
