"""Every arm's endpoints as the proxy and the scraper see them, kept current by discovery.

`Fleet` holds one `EndpointPool` per arm (the configured URLs, or the addresses a DNS name
resolves to, re-resolved every `refresh_s`) and the bounded `model` labels fed by the scraper.
The request path balances over `pool(arm)`, the scraper scrapes every `metrics_targets(arm)`
(the endpoints themselves, reported as probes, unless the arm names the engines behind a gateway
by `metrics_urls` or `metrics_dns`), and metrics map client model strings through `labels`.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable, Mapping

from specproxy.config import Config
from specproxy.fleet.discovery import DnsDiscovery, Resolver, system_resolver
from specproxy.fleet.models import ModelLabels
from specproxy.fleet.pool import EndpointPool
from specproxy.records import Arm

__all__ = ["Fleet"]


class Fleet:
    """The endpoint pools of every configured arm, their DNS discovery, and the model labels."""

    def __init__(
        self,
        cfg: Config,
        *,
        resolver: Resolver = system_resolver,
        clock: Callable[[], float] = time.monotonic,
        on_endpoint_event: Callable[[str, str, str], None] | None = None,
    ) -> None:
        """`on_endpoint_event(arm, event, url)`: each pool's ejections and readmissions."""
        self.labels = ModelLabels(cfg.model_allow)
        self.arms: tuple[Arm, ...] = cfg.arm_names  # the control first
        self.control: Arm = cfg.control_arm
        self._pools: dict[Arm, EndpointPool] = {}
        self._metrics: dict[Arm, tuple[str, ...]] = {}  # arms scraped elsewhere than served
        self._discoveries: list[DnsDiscovery] = []
        for arm in self.arms:
            arm_cfg = cfg.arm_config(arm)
            urls = [u.rstrip("/") for u in arm_cfg.urls] or [arm_cfg.first_url]
            hook = None if on_endpoint_event is None else functools.partial(on_endpoint_event, arm)
            pool = EndpointPool(urls, cfg.outlier, clock=clock, name=arm, on_event=hook)
            self._pools[arm] = pool
            if arm_cfg.dns is not None:
                self._discoveries.append(
                    DnsDiscovery(
                        arm_cfg.dns,
                        arm_cfg.port,
                        interval_s=arm_cfg.refresh_s,
                        scheme=arm_cfg.scheme,
                        resolver=resolver,
                        on_change=pool.update,
                    )
                )
            if arm_cfg.metrics_urls:
                self._metrics[arm] = tuple(u.rstrip("/") for u in arm_cfg.metrics_urls)
            elif arm_cfg.metrics_dns is not None:
                self._metrics[arm] = ()  # until the name first resolves
                self._discoveries.append(
                    DnsDiscovery(
                        arm_cfg.metrics_dns,
                        arm_cfg.metrics_port,
                        interval_s=arm_cfg.refresh_s,
                        scheme=arm_cfg.scheme,
                        resolver=resolver,
                        on_change=functools.partial(self._set_metrics, arm),
                    )
                )

    @property
    def pools(self) -> Mapping[Arm, EndpointPool]:
        return self._pools

    def pool(self, arm: Arm) -> EndpointPool:
        return self._pools[arm]

    def endpoints(self, arm: Arm) -> tuple[str, ...]:
        """The arm's endpoint base URLs now (no trailing slash)."""
        return self._pools[arm].urls

    def metrics_targets(self, arm: Arm) -> tuple[str, ...]:
        """The base URLs whose /metrics describe the arm's engines now."""
        return self._metrics[arm] if arm in self._metrics else self._pools[arm].urls

    def scrapes_endpoints(self, arm: Arm) -> bool:
        """Whether the arm's engines are scraped at its endpoints (each scrape is a probe)."""
        return arm not in self._metrics

    def _set_metrics(self, arm: Arm, urls: tuple[str, ...]) -> None:
        self._metrics[arm] = urls

    async def start(self) -> None:
        """Resolve every DNS arm once (so the first requests have its pods), then keep at it."""
        for discovery in self._discoveries:
            await discovery.start()

    async def close(self) -> None:
        for discovery in self._discoveries:
            await discovery.close()
