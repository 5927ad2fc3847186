"""`stats.compare`: the headline follows verdicts that change after the window was diagnosed."""

from __future__ import annotations

import copy

from specproxy.config import ScrapeConfig, StatsConfig
from specproxy.stats.anytime.hysteresis import VerdictMemory
from specproxy.stats.compare import refresh_headline
from specproxy.stats.job.tick import compute_stats
from specproxy.store.memory import MemoryStore
from tests.stats.job.test_runner import RUN, store  # noqa: F401  (the filled store fixture)

CFG = StatsConfig(windows_s=(None,), resamples=200, warmup_requests=5)


async def test_a_sticky_slower_verdict_rewrites_the_headline_and_keeps_other_reasons(
    store: MemoryStore,  # noqa: F811
) -> None:
    scrape = ScrapeConfig(warmup_requests=20, warmup_seconds=0.0)
    now = await compute_stats(store, run_id=RUN, stats_cfg=CFG, scrape_cfg=scrape)
    window = now["results"]["all"]["all"]
    ttft = window["metrics"]["ttft"]["sequential"]
    assert ttft is not None and "p99" in ttft and ttft["p99"]["verdict"] == "inconclusive"
    before = window["diagnosis"]["summary"]
    assert "TTFT" not in before  # TTFT is the same on both arms in this run
    # an earlier tick of the same job saw the TTFT two-sample test cross ("slower")
    earlier = copy.deepcopy(now)
    seq = earlier["results"]["all"]["all"]["metrics"]["ttft"]["sequential"]
    assert seq is not None and "p99" in seq
    seq["p99"]["slower"]["rejected"] = True
    memory = VerdictMemory()
    memory.apply(earlier, tolerance=CFG.p99_tolerance)
    memory.apply(now, tolerance=CFG.p99_tolerance)
    assert window["metrics"]["ttft"]["verdict"] == "slower"
    assert ttft["p99"]["slower"]["sticky"] and ttft["decided_by"] == ["p99_two_sample"]
    others = [r for r in window["diagnosis"]["reasons"] if r["code"] != "working"]
    refresh_headline(window, tolerance=CFG.p99_tolerance)
    summary = window["diagnosis"]["summary"]
    assert "TTFT P99 slower" in summary and not summary.startswith("speculation helps")
    codes = [r["code"] for r in window["diagnosis"]["reasons"]]
    assert "slower_verdict" in codes and "working" not in codes
    assert [r for r in window["diagnosis"]["reasons"] if r["code"] != "slower_verdict"] == others
