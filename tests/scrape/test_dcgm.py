"""dcgm-exporter pages -> GPU readings -> an arm's sample, on verbatim NVIDIA output (see
tests/fixtures/dcgm-exporter/README.md for every source) and pages derived from it."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from specproxy.errors import ScrapeError
from specproxy.records import THERMAL_CLOCK_REASONS
from specproxy.scrape.dcgm import (
    BLANK,
    CLOCK_REASON_BITS,
    CLOCK_REASONS,
    DRAM_ACTIVE,
    GPU_TEMP,
    GPU_UTIL,
    MEM_COPY_UTIL,
    SM_CLOCK,
    GpuReading,
    combine_readings,
    decode_clock_reasons,
    metrics_url,
    parse_dcgm,
)

DCGM = Path(__file__).resolve().parents[1] / "fixtures" / "dcgm-exporter"


def page(name: str) -> str:
    return (DCGM / name).read_text(encoding="utf-8")


def by_key(readings: tuple[GpuReading, ...]) -> dict[str, GpuReading]:
    return {r.key: r for r in readings}


def test_readme_quickstart_skips_elisions_and_reads_blanks_as_missing() -> None:
    # Verbatim README output: "..." lines, ", " between labels, a DCGM blank (MEMORY_TEMP is
    # not read, but the blank must not break the page) and SM clock 139 MHz.
    (gpu,) = parse_dcgm(page("readme_quickstart.txt"))
    assert gpu.key == "GPU-604ac76c-d9cf-fef3-62e9-d92044ab6e52"
    assert gpu.sm_clock_mhz == 139.0
    assert gpu.utilization is None and gpu.temperature_c is None
    assert gpu.clock_reasons is None  # the field is not exported: unknown, not "no reason"


def test_blank_sentinels_are_missing_values() -> None:
    text = page("readme_quickstart.txt").replace("DCGM_FI_DEV_MEMORY_TEMP", GPU_TEMP)
    (gpu,) = parse_dcgm(text)
    assert gpu.temperature_c is None  # 9223372036854775794 = DCGM_INT64_NOT_SUPPORTED
    assert BLANK <= 9223372036854775794 and BLANK == 2**47


def test_issue_scrapes_give_per_gpu_fields() -> None:
    v100 = by_key(parse_dcgm(page("issue189_v100.prom")))
    assert v100["GPU-45984919-9e67-f2ec-9b84-a96fefa525ff"].dram_active == 0.0
    gpu1 = v100["GPU-08abd178-8a91-05c5-6a52-1ab4a05bcdaf"]
    assert (gpu1.sm_clock_mhz, gpu1.temperature_c, gpu1.dram_active) == (1380.0, 56.0, None)
    util = by_key(parse_dcgm(page("issue250_v100.prom")))
    assert util["GPU-a6158b59-2c1e-1e63-0068-9178c4298abd"].utilization == 0.0
    # fields not read (power limit, PCIe replays) create no GPU of their own
    assert list(util) == ["GPU-a6158b59-2c1e-1e63-0068-9178c4298abd"]


def test_mig_instances_are_separate_readings() -> None:
    mig = parse_dcgm(page("issue317_a30_mig_dram.prom"))
    assert len(mig) == 6
    assert {r.key.split("/")[1] for r in mig} == {"3", "4", "5", "6"}
    throttle = parse_dcgm(page("issue317_a30_mig_throttle.prom"))  # "# HELP name" without text
    assert [r.clock_reasons for r in throttle] == [frozenset({"gpu_idle"})] * 2


def test_both_names_of_the_reasons_field_are_read() -> None:
    old = page("issue317_a30_mig_throttle.prom")
    new = old.replace("DCGM_FI_DEV_CLOCK_THROTTLE_REASONS", "DCGM_FI_DEV_CLOCKS_EVENT_REASONS")
    assert new != old and set(CLOCK_REASONS) == {
        "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS",
        "DCGM_FI_DEV_CLOCKS_EVENT_REASONS",
    }
    assert parse_dcgm(new) == parse_dcgm(old)


def test_exporter_clock_event_counts_are_reasons_seen() -> None:
    (gpu,) = parse_dcgm(page("pr261_clock_events_count.prom"))
    assert gpu.clock_reasons == frozenset({"gpu_idle", "sw_thermal", "hw_thermal"})
    older = page("pr261_clock_events_count.prom").replace(
        "DCGM_EXP_CLOCK_EVENTS_COUNT", "DCGM_FI_EXP_CLOCK_THROTTLE_REASONS_COUNT"
    )
    (gpu,) = parse_dcgm(older.replace("clock_event=", "throttle_reason="))
    assert gpu.clock_reasons == frozenset({"gpu_idle", "sw_thermal", "hw_thermal"})
    zero = page("pr261_clock_events_count.prom").replace("} 1\n", "} 0\n")
    (gpu,) = parse_dcgm(zero)
    assert gpu.clock_reasons == frozenset({"gpu_idle"})  # a count of 0 is no event


@pytest.mark.parametrize(
    ("mask", "names"),
    [
        (0, set()),
        (1, {"gpu_idle"}),
        (96, {"sw_thermal", "hw_thermal"}),  # dcgm-exporter PR #254's example
        (8, {"hw_slowdown"}),
        (0x1FF, set(CLOCK_REASON_BITS)),
        (0x200, set()),  # a bit DCGM does not define yet
    ],
)
def test_decode_clock_reasons(mask: int, names: set[str]) -> None:
    assert decode_clock_reasons(mask) == names


@given(st.sets(st.sampled_from(sorted(CLOCK_REASON_BITS))), st.integers(0, 2**37 - 1))
def test_decoding_a_mask_gives_back_the_reasons_it_was_built_from(
    names: set[str], undefined: int
) -> None:
    # + bits DCGM does not define, below the blank sentinels (>= 2^47: "not exported")
    mask = sum(CLOCK_REASON_BITS[n] for n in names) | (undefined << 9)
    assert decode_clock_reasons(mask) == names
    text = f'DCGM_FI_DEV_CLOCKS_EVENT_REASONS{{gpu="0",UUID="GPU-x"}} {mask}\n'
    (gpu,) = parse_dcgm(text)
    assert gpu.clock_reasons == frozenset(names)


def test_bits_are_the_dcgm_header_values() -> None:
    # dcgm_fields.h DCGM_CLOCKS_EVENT_REASON_*: nine distinct single bits 0x1..0x100
    assert sorted(CLOCK_REASON_BITS.values()) == [1 << i for i in range(9)]
    assert (CLOCK_REASON_BITS["sw_thermal"], CLOCK_REASON_BITS["hw_thermal"]) == (0x20, 0x40)
    assert CLOCK_REASON_BITS["hw_slowdown"] == 0x8
    assert set(THERMAL_CLOCK_REASONS) == {"sw_thermal", "hw_thermal", "hw_slowdown"}


def csv_fields(name: str) -> dict[str, str]:
    """Active (uncommented) rows of a dcgm-exporter counters CSV: field -> Prometheus type."""
    rows = csv.reader(
        line for line in page(name).splitlines() if line.strip() and not line.startswith("#")
    )
    return {row[0].strip(): row[1].strip() for row in rows}


def test_fields_read_are_gauges_of_the_shipped_counter_lists() -> None:
    default = csv_fields("default-counters.csv")
    for field in (GPU_UTIL, MEM_COPY_UTIL, SM_CLOCK, GPU_TEMP, DRAM_ACTIVE):
        assert default[field] == "gauge", field
    assert csv_fields("dcp-metrics-included.csv")[DRAM_ACTIVE] == "gauge"
    # The reasons field is not a default counter: the docs tell users to add it.
    assert not set(CLOCK_REASONS) & set(default)


def test_gpu_filter_keeps_index_or_uuid() -> None:
    text = page("derived_h200_hot_saturated.prom")
    assert [r.key for r in parse_dcgm(text, gpus=("1",))] == [
        "GPU-d1d1d1d1-0000-4000-8000-000000000001"
    ]
    uuid = "GPU-d0d0d0d0-0000-4000-8000-000000000000"
    assert [r.key for r in parse_dcgm(text, gpus=(uuid,))] == [uuid]
    assert parse_dcgm(text, gpus=("7",)) == ()


def test_pod_filter_keeps_the_gpus_of_the_arms_pods() -> None:
    text = page("derived_k8s_pods.prom")
    (spec,) = parse_dcgm(text, pods=("vllm-speculative-",))
    assert (spec.key, spec.dram_active, spec.clock_reasons) == (
        "GPU-e0e0e0e0-0000-4000-8000-000000000000",
        0.9512,
        frozenset({"sw_thermal"}),
    )
    (base,) = parse_dcgm(text, pods=("vllm-baseline-", "other-"))
    assert base.dram_active == 0.4021 and base.clock_reasons == frozenset()
    assert len(parse_dcgm(text)) == 3  # no filter: the pod-less GPU 2 counts too
    assert parse_dcgm(text, pods=("vllm-speculative-",), gpus=("1",)) == ()  # both filters


@pytest.mark.parametrize(
    "body", ["<html><body>502 Bad Gateway</body></html>", "", "vllm:num_requests_running 1\n"]
)
def test_a_page_that_is_not_an_exporter_is_an_error(body: str) -> None:
    with pytest.raises(ScrapeError, match="no DCGM fields"):
        parse_dcgm(body)


def test_malformed_lines_of_read_fields_are_an_error() -> None:
    with pytest.raises(ScrapeError, match="not Prometheus text"):
        parse_dcgm('DCGM_FI_DEV_GPU_UTIL{gpu="0" 12\n')


def test_combine_hot_saturated_page() -> None:
    readings = parse_dcgm(page("derived_h200_hot_saturated.prom"))
    sample = combine_readings(5.0, "speculative", readings)
    assert sample.up and sample.gpus == 2 and sample.error is None
    assert sample.utilization == pytest.approx(0.98)  # mean of 100 % and 96 %
    assert sample.memory_bandwidth == pytest.approx(0.953112)  # the busiest GPU
    assert sample.bandwidth_source == "dram_active"
    assert sample.sm_clock_mhz == pytest.approx(1695.0)
    assert sample.temperature_c == 91.0  # the hottest GPU
    assert sample.clock_reasons == ("hw_thermal", "power_cap", "sw_thermal")
    assert sample.thermal_throttled is True


def test_combine_cool_page_and_fallback_page() -> None:
    cool = combine_readings(1.0, "baseline", parse_dcgm(page("derived_h200_cool.prom")))
    assert cool.memory_bandwidth == pytest.approx(0.41)
    assert cool.thermal_throttled is False and cool.clock_reasons == ("gpu_idle",)
    old = parse_dcgm(page("derived_v100_mem_copy_fallback.prom"))
    fallback = combine_readings(1.0, "baseline", old)
    assert (fallback.memory_bandwidth, fallback.bandwidth_source) == (0.95, "mem_copy_util")
    assert fallback.clock_reasons == ("hw_slowdown",) and fallback.thermal_throttled is True


def test_combine_without_reasons_or_readings_says_unknown() -> None:
    sample = combine_readings(1.0, "baseline", parse_dcgm(page("issue189_v100.prom")))
    assert sample.thermal_throttled is None and sample.clock_reasons is None
    assert (sample.gpus, sample.memory_bandwidth, sample.bandwidth_source) == (
        2,
        0.0,
        "dram_active",
    )
    empty = combine_readings(1.0, "baseline", ())
    assert empty.up and empty.gpus == 0 and empty.memory_bandwidth is None
    down = combine_readings(1.0, "baseline", (), error="timed out")
    assert not down.up and down.error == "timed out"


@pytest.mark.parametrize(
    ("base", "url"),
    [
        ("http://n:9400", "http://n:9400/metrics"),
        ("http://n:9400/", "http://n:9400/metrics"),
        ("http://n:9400/metrics", "http://n:9400/metrics"),
    ],
)
def test_metrics_url(base: str, url: str) -> None:
    assert metrics_url(base) == url


# nvidia-smi's names of the reasons (`nvidia-smi -q -d PERFORMANCE`) -> dcgm-exporter's
NVIDIA_SMI_NAMES = {
    "Idle": "gpu_idle",
    "Applications Clocks Setting": "clocks_setting",
    "SW Power Cap": "power_cap",
    "HW Slowdown": "hw_slowdown",
    "HW Thermal Slowdown": "hw_thermal",
    "HW Power Brake Slowdown": "hw_power_brake",
    "Sync Boost": "sync_boost",
    "SW Thermal Slowdown": "sw_thermal",
    "Display Clock Setting": "display_clocks",
}


def test_bit_table_agrees_with_a_real_driver() -> None:
    # Captured on an idle H200 (see the README): the mask nvidia-smi reports decodes to exactly
    # the reasons it lists as Active, and its list names every reason of the table.
    text = page("nvidia-smi_h200_idle.txt")
    mask = int(text.splitlines()[1].split(", ")[2], 16)
    section = text.split("Clocks Event Reasons\n", 1)[1].split("Clocks Event Reasons Counters")[0]
    states = {
        NVIDIA_SMI_NAMES[name.strip()]: state.strip()
        for name, state in (line.split(":") for line in section.splitlines() if ":" in line)
    }
    assert set(states) == set(CLOCK_REASON_BITS)
    assert decode_clock_reasons(mask) == {n for n, s in states.items() if s == "Active"}
    assert decode_clock_reasons(mask) == {"gpu_idle"}
