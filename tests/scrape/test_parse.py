"""Parsing real V1 (vLLM 0.32.0) and hand-written V0 /metrics pages into snapshots."""

from __future__ import annotations

from pathlib import Path

import pytest

from specproxy.errors import ScrapeError
from specproxy.scrape.parse import SpecFormat, parse_metrics
from tests.conftest import fixture_path
from tests.scrape.fakes import EngineCounts, v1_text

V0_FIXTURES = Path(__file__).parent.parent / "fixtures" / "vllm-v0"


def test_real_v1_spec_fixture() -> None:
    snap = parse_metrics(fixture_path("metrics_spec.prom").read_text(), t=5.0)
    assert snap.t == 5.0
    assert snap.spec_format is SpecFormat.V1
    assert snap.engines == 1
    assert snap.process_start_time == pytest.approx(1795940000.07)
    assert snap.num_drafts == 36.0
    assert snap.num_draft_tokens == 124.0
    assert snap.num_accepted_tokens == 124.0
    assert snap.accepted_per_position == (36.0, 36.0, 26.0, 26.0)
    assert sum(snap.accepted_per_position) == snap.num_accepted_tokens
    assert snap.generation_tokens == 232.0
    assert (snap.requests_running, snap.requests_waiting, snap.kv_cache_usage) == (0.0, 0.0, 0.0)
    assert snap.num_emitted_tokens is None
    assert snap.v0_acceptance_rate is None


def test_real_v1_baseline_fixture_has_no_spec_metrics() -> None:
    snap = parse_metrics(fixture_path("metrics_baseline.prom").read_text(), t=0.0)
    assert snap.spec_format is None
    assert snap.num_drafts is None
    assert snap.num_draft_tokens is None
    assert snap.num_accepted_tokens is None
    assert snap.accepted_per_position is None
    assert snap.generation_tokens == 120.0
    assert snap.kv_cache_usage == 0.0
    assert snap.process_start_time == pytest.approx(1795940000.07)


def test_v0_spec_fixture_reads_gauges_and_old_cache_name() -> None:
    snap = parse_metrics((V0_FIXTURES / "metrics_spec.prom").read_text(), t=0.0)
    assert snap.spec_format is SpecFormat.V0
    assert snap.engines == 1
    assert snap.v0_acceptance_rate == 0.62
    assert snap.v0_efficiency == 0.56
    assert snap.num_draft_tokens == 1800.0
    assert snap.num_accepted_tokens == 1116.0
    assert snap.num_emitted_tokens == 1260.0
    assert snap.num_drafts is None
    assert snap.accepted_per_position is None
    assert snap.kv_cache_usage == 0.125  # from vllm:gpu_cache_usage_perc
    assert (snap.requests_running, snap.requests_waiting) == (2.0, 1.0)
    assert snap.generation_tokens == 850.0
    assert snap.process_start_time == 1.72012342e9


def test_v0_baseline_fixture() -> None:
    snap = parse_metrics((V0_FIXTURES / "metrics_baseline.prom").read_text(), t=0.0)
    assert snap.spec_format is None
    assert snap.v0_acceptance_rate is None
    assert snap.num_draft_tokens is None
    assert snap.generation_tokens == 640.0
    assert snap.kv_cache_usage == 0.0625


def test_data_parallel_engines_are_summed() -> None:
    engines = [
        EngineCounts(10, 40, 30, (10, 9, 7, 4), 100, running=3, waiting=1, kv_cache=0.2),
        EngineCounts(20, 80, 50, (18, 15, 10, 7), 300, running=5, waiting=0, kv_cache=0.4),
    ]
    snap = parse_metrics(v1_text(engines), t=0.0)
    assert snap.engines == 2
    assert snap.num_drafts == 30.0
    assert snap.num_draft_tokens == 120.0
    assert snap.num_accepted_tokens == 80.0
    assert snap.accepted_per_position == (28.0, 24.0, 17.0, 11.0)
    assert snap.generation_tokens == 400.0
    assert (snap.requests_running, snap.requests_waiting) == (8.0, 1.0)
    assert snap.kv_cache_usage == pytest.approx(0.3)  # a fraction: mean, not sum


def test_counters_without_type_lines_are_still_read() -> None:
    text = (
        'vllm:spec_decode_num_drafts_total{engine="0"} 4\n'
        'vllm:spec_decode_num_draft_tokens_total{engine="0"} 16\n'
        'vllm:spec_decode_num_accepted_tokens_total{engine="0"} 9\n'
    )
    snap = parse_metrics(text, t=0.0)
    assert (snap.num_drafts, snap.num_draft_tokens, snap.num_accepted_tokens) == (4, 16, 9)


def test_missing_position_counts_as_zero() -> None:
    text = (
        'vllm:spec_decode_num_accepted_tokens_per_pos_total{position="0"} 5\n'
        'vllm:spec_decode_num_accepted_tokens_per_pos_total{position="2"} 1\n'
    )
    assert parse_metrics(text, t=0.0).accepted_per_position == (5.0, 0.0, 1.0)


def test_unread_series_do_not_matter() -> None:
    # A malformed line in a series the scraper does not read cannot fail the scrape.
    text = "vllm:some_future_histogram{le=oops} x\nvllm:num_requests_running 3\n"
    assert parse_metrics(text, t=0.0).requests_running == 3.0


def test_nan_values_are_ignored() -> None:
    text = "vllm:kv_cache_usage_perc NaN\nvllm:num_requests_running 2\n"
    snap = parse_metrics(text, t=0.0)
    assert snap.kv_cache_usage is None
    assert snap.requests_running == 2.0


@pytest.mark.parametrize(
    "body",
    [
        "<html><body>502 Bad Gateway</body></html>",
        '{"object": "error"}',
        "hello",
        "",
        "process_start_time_seconds 1.7e9\n",  # valid text, but not a vLLM engine
        'vllm:spec_decode_num_accepted_tokens_per_pos_total{position="x"} 1\n',
        "vllm:num_requests_running abc\n",
        'vllm:generation_tokens_total{engine="0",model_name="m"',  # truncated mid-line
    ],
)
def test_garbage_raises_scrape_error(body: str) -> None:
    with pytest.raises(ScrapeError):
        parse_metrics(body, t=0.0)
