"""/metrics of the emulator against the real vLLM 0.32 scrapes, and the V0 switch."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterator

import prometheus_client
import pytest
from prometheus_client.parser import text_string_to_metric_families

from specproxy.emulator.model import Engine, Physics, Sequence
from specproxy.emulator.vllm_metrics import EngineMetrics, token_buckets
from tests.conftest import fixture_path

Shape = dict[str, tuple[str, frozenset[frozenset[str]]]]


@pytest.fixture(autouse=True)
def created_series_on() -> Iterator[None]:
    """Real vLLM serves `_created` series, so the emulator does; but prometheus_client keeps one
    switch per process, which the proxy's metrics turn off (`specproxy.metrics`). Any test that
    built a proxy earlier in the session (tests/demo runs first) must not change what this sees.
    """
    was_on = prometheus_client.metrics._use_created
    prometheus_client.enable_created_metrics()  # type: ignore[no-untyped-call]
    yield
    if not was_on:
        prometheus_client.disable_created_metrics()  # type: ignore[no-untyped-call]


def shape(text: str, prefixes: tuple[str, ...] = ("vllm:", "process_start_time")) -> Shape:
    """family -> (type, label-name sets of its samples), for the families we promise."""
    out: Shape = {}
    for family in text_string_to_metric_families(text):
        if family.name.startswith(prefixes):
            labels: set[frozenset[str]] = {frozenset(s.labels) for s in family.samples}
            out[family.name] = (family.type, frozenset(labels))
    return out


def served(version: str, speculative: bool) -> str:
    """Metrics after a couple of real engine steps."""
    metrics = EngineMetrics(
        model="tiny-llama",
        speculative=speculative,
        k=4,
        version=version,  # type: ignore[arg-type]
        start_time=1.0e9,
        max_model_len=1024,
    )
    engine = Engine(Physics(speculative=speculative, acceptance=0.8))
    import random

    for i in range(2):
        rng = random.Random(i)
        engine.add(Sequence(str(i), 0, 10, 16, 0.0, rng, rng))
    metrics.observe_request(n=1, max_tokens=16)
    now = 0.0
    while (plan := engine.plan(now)) is not None:
        now += plan.duration_s
        result = engine.complete(plan, now)
        metrics.observe_step(result, running=len(engine.running), waiting=0, kv_usage=0.1)
        for seq in result.finished:
            metrics.observe_finished(seq)
    return metrics.render().decode()


@pytest.mark.parametrize(
    ("fixture", "speculative"), [("metrics_spec.prom", True), ("metrics_baseline.prom", False)]
)
def test_v1_names_types_and_labels_match_real_vllm(fixture: str, speculative: bool) -> None:
    theirs = shape(fixture_path(fixture).read_text())
    ours = shape(served("v1", speculative))
    assert sorted(ours) == sorted(theirs)
    for name, (kind, labels) in theirs.items():
        assert ours[name][0] == kind, name
        assert ours[name][1] == labels, name


def test_v1_spec_counters_add_up() -> None:
    values: dict[str, float] = defaultdict(float)
    for family in text_string_to_metric_families(served("v1", True)):
        for s in family.samples:
            values[s.name + s.labels.get("position", "")] += s.value
    per_pos = [values[f"vllm:spec_decode_num_accepted_tokens_per_pos_total{i}"] for i in range(4)]
    assert per_pos == sorted(per_pos, reverse=True) and per_pos[0] > 0
    assert sum(per_pos) == values["vllm:spec_decode_num_accepted_tokens_total"]
    assert values["vllm:generation_tokens_total"] == 32
    assert values["vllm:prompt_tokens_total"] == 20
    assert values["process_start_time_seconds"] == 1.0e9


def test_v0_switch_uses_v0_names_and_model_name_label_only() -> None:
    ours = shape(served("v0", True))
    for name, kind in [
        ("vllm:spec_decode_draft_acceptance_rate", "gauge"),
        ("vllm:spec_decode_efficiency", "gauge"),
        ("vllm:spec_decode_num_accepted_tokens", "counter"),
        ("vllm:spec_decode_num_draft_tokens", "counter"),
        ("vllm:spec_decode_num_emitted_tokens", "counter"),
        ("vllm:gpu_cache_usage_perc", "gauge"),
        ("vllm:num_requests_running", "gauge"),
        ("vllm:time_per_output_token_seconds", "histogram"),
    ]:
        assert ours[name][0] == kind, name
    assert "vllm:spec_decode_num_drafts" not in ours
    assert all("engine" not in labels for _, sets in ours.values() for labels in sets)
    values = {
        s.name: s.value
        for family in text_string_to_metric_families(served("v0", True))
        for s in family.samples
    }
    rate = values["vllm:spec_decode_draft_acceptance_rate"]
    accepted = values["vllm:spec_decode_num_accepted_tokens_total"]
    assert rate == pytest.approx(accepted / values["vllm:spec_decode_num_draft_tokens_total"])
    assert 0 < values["vllm:spec_decode_efficiency"] <= 1


def test_token_buckets_are_vllms_1_2_5_series() -> None:
    assert token_buckets(1024) == (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000)
    assert token_buckets(4) == (1, 2)
