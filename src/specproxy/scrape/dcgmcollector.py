"""The GPU scraper's latest per-arm sample as Prometheus series on the proxy's /metrics.

Labels are bounded: `arm`, plus `endpoint` (a configured exporter URL) on the up series; the
per-GPU labels of the exporters (UUID, host, pod) are combined away (`scrape.dcgm`). Units are
base units: the SM clock in hertz (DCGM says MHz), percentages as 0..1 ratios. A series exists
only while its value is known: an arm without exporters has none, a down arm keeps only `up`,
and a field its exporters do not export (e.g. the throttle reasons, not in dcgm-exporter's
default counters) has no series rather than a false 0.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from prometheus_client import CollectorRegistry
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from specproxy import metrics
from specproxy.records import Arm
from specproxy.scrape.dcgmloop import GpuArmState

__all__ = ["GpuCollector", "register_gpu_collector"]


class GpuCollector(Collector):
    """Exports every configured arm's GPU telemetry, labelled by `arm`."""

    def __init__(self, states: Mapping[Arm, GpuArmState]) -> None:
        self._states = states

    def describe(self) -> Iterable[Metric]:
        return _families()

    def collect(self) -> Iterable[Metric]:
        up, util, bandwidth, clock, temperature, thermal = families = _families()
        for arm, state in self._states.items():
            for url, ok in state.up.items():
                up.add_metric([arm, url], 1.0 if ok else 0.0)
            sample = state.latest
            if sample is None or not sample.up:
                continue
            sm_hz = sample.sm_clock_mhz * 1e6 if sample.sm_clock_mhz is not None else None
            throttled = sample.thermal_throttled
            for family, value in (
                (util, sample.utilization),
                (bandwidth, sample.memory_bandwidth),
                (clock, sm_hz),
                (temperature, sample.temperature_c),
                (thermal, None if throttled is None else float(throttled)),
            ):
                if value is not None:
                    family.add_metric([arm], value)
        return families


def _families() -> list[GaugeMetricFamily]:
    """Fresh, empty families, in the order `collect` unpacks them."""

    def gauge(name: str, doc: str, *extra: str) -> GaugeMetricFamily:
        return GaugeMetricFamily(name, doc, labels=["arm", *extra])

    return [
        gauge(
            metrics.GPU_EXPORTER_UP,
            "1 if the dcgm-exporter's last /metrics scrape succeeded, else 0.",
            "endpoint",
        ),
        gauge(metrics.GPU_UTILIZATION_RATIO, "GPU utilization, 0..1, mean over the arm's GPUs."),
        gauge(
            metrics.GPU_MEMORY_BANDWIDTH_RATIO,
            "Memory-interface activity of the arm's busiest GPU, 0..1 (DCGM_FI_PROF_DRAM_ACTIVE,"
            " else DCGM_FI_DEV_MEM_COPY_UTIL / 100).",
        ),
        gauge(metrics.GPU_SM_CLOCK, "SM clock, hertz, mean over the arm's GPUs."),
        gauge(metrics.GPU_TEMPERATURE, "Temperature of the arm's hottest GPU, degrees Celsius."),
        gauge(
            metrics.GPU_THERMAL_THROTTLED,
            "1 if any GPU of the arm has its clocks cut for a thermal reason (SW/HW thermal"
            " slowdown, HW slowdown), else 0; absent without the clock-event reasons field.",
        ),
    ]


def register_gpu_collector(
    registry: CollectorRegistry, states: Mapping[Arm, GpuArmState]
) -> GpuCollector:
    """Create the collector for `states` (a `GpuScraper.states`) on `registry`."""
    collector = GpuCollector(states)
    registry.register(collector)
    return collector
