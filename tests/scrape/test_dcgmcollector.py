"""The GPU collector: per-arm series in base units, present only while known."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, generate_latest

from specproxy import metrics
from specproxy.records import Arm, GpuSample
from specproxy.scrape.dcgmcollector import register_gpu_collector
from specproxy.scrape.dcgmloop import GpuArmState

URL = "http://gpu-node:9400"


def registry_for(states: dict[Arm, GpuArmState]) -> CollectorRegistry:
    registry = CollectorRegistry()
    register_gpu_collector(registry, states)
    return registry


def test_latest_sample_is_exported_in_base_units() -> None:
    sample = GpuSample(
        t=1.0,
        arm="speculative",
        up=True,
        gpus=2,
        utilization=0.98,
        memory_bandwidth=0.95,
        bandwidth_source="dram_active",
        sm_clock_mhz=1695.0,
        temperature_c=91.0,
        clock_reasons=("sw_thermal",),
        thermal_throttled=True,
    )
    state = GpuArmState("speculative", (URL,), up={URL: True}, latest=sample)
    registry = registry_for({"speculative": state})
    arm = {"arm": "speculative"}
    assert registry.get_sample_value(metrics.GPU_EXPORTER_UP, {**arm, "endpoint": URL}) == 1.0
    assert registry.get_sample_value(metrics.GPU_UTILIZATION_RATIO, arm) == 0.98
    assert registry.get_sample_value(metrics.GPU_MEMORY_BANDWIDTH_RATIO, arm) == 0.95
    assert registry.get_sample_value(metrics.GPU_SM_CLOCK, arm) == 1.695e9
    assert registry.get_sample_value(metrics.GPU_TEMPERATURE, arm) == 91.0
    assert registry.get_sample_value(metrics.GPU_THERMAL_THROTTLED, arm) == 1.0
    assert registry.get_sample_value(metrics.GPU_THERMAL_THROTTLED, {"arm": "baseline"}) is None


def test_unknown_values_and_down_arms_have_no_series() -> None:
    no_reasons = GpuSample(t=1.0, arm="baseline", up=True, gpus=1, memory_bandwidth=0.3)
    down = GpuSample(t=1.0, arm="speculative", up=False, error="timed out")
    registry = registry_for(
        {
            "baseline": GpuArmState("baseline", (URL,), up={URL: True}, latest=no_reasons),
            "speculative": GpuArmState("speculative", (URL,), up={URL: False}, latest=down),
        }
    )
    base, spec = {"arm": "baseline"}, {"arm": "speculative"}
    assert registry.get_sample_value(metrics.GPU_MEMORY_BANDWIDTH_RATIO, base) == 0.3
    assert registry.get_sample_value(metrics.GPU_THERMAL_THROTTLED, base) is None  # unknown
    assert registry.get_sample_value(metrics.GPU_UTILIZATION_RATIO, base) is None
    assert registry.get_sample_value(metrics.GPU_EXPORTER_UP, {**spec, "endpoint": URL}) == 0.0
    assert registry.get_sample_value(metrics.GPU_MEMORY_BANDWIDTH_RATIO, spec) is None


def test_names_follow_the_conventions_and_labels_stay_bounded() -> None:
    sample = GpuSample(t=1.0, arm="baseline", up=True, gpus=1, utilization=0.5)
    text = generate_latest(
        registry_for({"baseline": GpuArmState("baseline", (URL,), latest=sample)})
    ).decode()
    names = {
        metrics.GPU_UTILIZATION_RATIO: "_ratio",
        metrics.GPU_MEMORY_BANDWIDTH_RATIO: "_ratio",
        metrics.GPU_SM_CLOCK: "_hertz",
        metrics.GPU_TEMPERATURE: "_celsius",
    }
    for name, unit in names.items():
        assert name.startswith("specproxy_gpu_") and name.endswith(unit)
        assert f"# TYPE {name} gauge" in text
    series = [line for line in text.splitlines() if line.startswith("specproxy_gpu_")]
    assert series == ['specproxy_gpu_utilization_ratio{arm="baseline"} 0.5']
