"""Which arm serves a request, and whether it is mirrored: pure decisions, no I/O.

Weighted mode draws from a seeded RNG. Sticky mode hashes a key (a header or the body's `user`)
with BLAKE2b into [0, 1): the same key always lands on the same arm, and because the hash is
uniform the share of the key space sent to the speculative arm equals `speculative_share`.
A request without a sticky key falls back to the weighted draw.
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

    __slots__ = ("_cfg", "_forced", "_rng", "_share", "_sticky_header", "_sticky_user")

    def __init__(self, cfg: RoutingConfig) -> None:
        self._cfg = cfg
        self._rng = random.Random(cfg.seed)
        self._share = cfg.speculative_share
        self._forced = cfg.allow_forced_arm
        sticky = cfg.mode == "sticky"
        self._sticky_header = (
            cfg.sticky_header if sticky and cfg.sticky_source == "header" else None
        )
        self._sticky_user = sticky and cfg.sticky_source == "user"

    def choose(self, headers: Mapping[str, str], user: object = None) -> Arm:
        """The arm for a request; `headers` must look keys up case-insensitively.

        Raises `ForcedArmError` when a forced arm is allowed but the header names no arm.
        """
        if self._forced:
            forced = headers.get(FORCED_ARM_HEADER)
            if forced is not None:
                try:
                    return Arm(forced.strip().lower())
                except ValueError:
                    raise ForcedArmError(
                        f"{FORCED_ARM_HEADER} must be 'speculative' or 'baseline', got {forced!r}"
                    ) from None
        key: str | None = None
        if self._sticky_header is not None:
            key = headers.get(self._sticky_header)
        elif self._sticky_user and isinstance(user, str):
            key = user
        point = sticky_point(key) if key else self._rng.random()
        return Arm.SPECULATIVE if point < self._share else Arm.BASELINE

    def mirror(self) -> bool:
        """Whether this request is also sent to the other arm as a shadow."""
        fraction = self._cfg.mirror_fraction
        return fraction > 0.0 and self._rng.random() < fraction
