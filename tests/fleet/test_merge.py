from __future__ import annotations

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from specproxy import metrics as m
from specproxy.fleet.merge import merge_pages
from specproxy.metrics import ProxyMetrics


def page(requests: int, inflight: float, acceptance: float, leader: float, start: float) -> str:
    registry = CollectorRegistry()
    metrics = ProxyMetrics(registry)
    for _ in range(requests):
        metrics.requests.labels("speculative", "200", "m").inc()
        metrics.request_duration.labels("speculative", "chat.completions", "true", "m").observe(0.5)
    metrics.inflight.labels("speculative").set(inflight)
    text = generate_latest(registry).decode()
    text += (
        f"# HELP {m.ENGINE_ACCEPTANCE_RATIO} x\n# TYPE {m.ENGINE_ACCEPTANCE_RATIO} gauge\n"
        f'{m.ENGINE_ACCEPTANCE_RATIO}{{arm="speculative"}} {acceptance}\n'
        f"# HELP {m.STATS_LEADER} x\n# TYPE {m.STATS_LEADER} gauge\n{m.STATS_LEADER} {leader}\n"
        f"# HELP process_start_time_seconds x\n# TYPE process_start_time_seconds gauge\n"
        f"process_start_time_seconds {start}\n"
    )
    return text


def values(text: bytes) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text.decode())
        for s in family.samples
    }


def test_counters_and_histograms_add_up_gauges_by_their_meaning() -> None:
    merged = values(merge_pages([page(3, 2, 0.6, 0, 100.0), page(4, 5, 0.62, 1, 90.0)]))
    req = ("specproxy_requests_total", (("arm", "speculative"), ("model", "m"), ("status", "200")))
    assert merged[req] == 7
    count = (
        "specproxy_request_duration_seconds_count",
        (
            ("arm", "speculative"),
            ("endpoint", "chat.completions"),
            ("model", "m"),
            ("stream", "true"),
        ),
    )
    assert merged[count] == 7
    assert merged[(m.INFLIGHT, (("arm", "speculative"),))] == 7  # summed
    assert merged[(m.ENGINE_ACCEPTANCE_RATIO, (("arm", "speculative"),))] == 0.62  # largest
    assert merged[(m.STATS_LEADER, ())] == 1  # one worker leads
    assert merged[("process_start_time_seconds", ())] == 90.0  # earliest
    build = [k for k in merged if k[0] == "specproxy_build_info"]
    assert len(build) == 1 and merged[build[0]] == 1.0


def test_one_page_round_trips() -> None:
    one = page(2, 1, 0.5, 1, 5.0)
    assert values(merge_pages([one])) == values(one.encode())
