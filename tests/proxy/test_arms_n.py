"""A/B/n end to end: a run with five named arms is configuration only. Requests reach every
arm by weight, shadows go to the control, every arm is exported with its role
(`specproxy_arm_info`, what the rules and panels select by), and the statistics compare each
of the four treatments with the control (at alpha / 4), one gauge series set per treatment.
The rest of "a fifth arm touches the config only": no rule (tests/deploy/test_rules.py) and no
dashboard query (tests/grafana/test_dashboard.py) names an arm."""

from __future__ import annotations

from typing import Any

from aiohttp import web
from aiohttp.test_utils import TestClient
from prometheus_client import CollectorRegistry
from pytest_aiohttp import AiohttpClient, AiohttpServer

from specproxy import metrics as names
from specproxy.app import create_app
from specproxy.config import Config, StatsConfig, StoreConfig, WarmupConfig
from specproxy.proxy.headers import ARM_HEADER
from specproxy.proxy.recorder import MemoryRecorder
from specproxy.stats.collector import register_stats_collector
from specproxy.stats.job.runner import StatsJob
from specproxy.stats.job.settings import StatsSettings, arm_roles
from specproxy.store.memory import MemoryStore
from tests.proxy.conftest import CHAT, chat
from tests.proxy.fake_upstream import FakeUpstream

FIVE = ("base", "ngram-k2", "ngram-k4", "eagle", "draft-1b")


async def test_five_arms_serve_and_compare_four_treatments(
    aiohttp_server: AiohttpServer, aiohttp_client: AiohttpClient
) -> None:
    fakes = {name: FakeUpstream(name) for name in FIVE}
    urls = {name: str((await aiohttp_server(f.app())).make_url("")) for name, f in fakes.items()}
    arms: dict[str, dict[str, Any]] = {name: {"urls": [url]} for name, url in urls.items()}
    arms["base"]["role"] = "control"
    arms["ngram-k4"]["labels"] = {"method": "ngram", "k": 4}
    cfg = Config.from_mapping(
        {"run_id": "five", "arms": arms, "routing": {"seed": 3, "mirror_fraction": 0.25}}
    )
    recorder = MemoryRecorder()
    app = create_app(
        cfg, registry=CollectorRegistry(), recorder=recorder, with_store=False, with_stats=False
    )
    client: TestClient[web.Request, None] = await aiohttp_client(await aiohttp_server(app))
    answered: set[str] = set()
    for _ in range(300):
        resp = await client.post(CHAT, json=chat())
        assert resp.status == 200
        answered.add(resp.headers[ARM_HEADER])
        await resp.read()
    exposition = await (await client.get("/metrics")).text()
    await client.close()  # shadows still running write their records
    # the rules and panels find every arm and its role without naming one (config only)
    for name in FIVE:
        role = "control" if name == "base" else "treatment"
        # `[arms.NAME] labels` as label_KEY (exposition sorts the label names)
        labels = 'label_k="4",label_method="ngram",' if name == "ngram-k4" else ""
        assert f'{names.ARM}_info{{arm="{name}",{labels}role="{role}"}} 1.0' in exposition
        assert f'{names.REQUESTS}_total{{arm="{name}",' in exposition
    assert answered == set(FIVE)
    assert all(fakes[name].seen for name in FIVE)  # each engine got requests
    records = list(recorder.records)
    primary = {r.request_id: r.arm for r in records if not r.shadow}
    for shadow in (r for r in records if r.shadow):
        assert shadow.pair_id is not None
        first = primary[shadow.pair_id]
        assert (shadow.arm == "base") != (first == "base")  # one of the pair is the control

    store_cfg = StoreConfig(url="memory://")
    store = MemoryStore(store_cfg, run_id="five")
    await store.start()
    for rec in records:
        store.record(rec)
    await store.flush()
    # the arms as the stats process takes them from the proxy's config (`arm_roles`)
    stats_cfg = StatsConfig(windows_s=(None,), resamples=200)
    settings = StatsSettings(
        store_cfg, stats_cfg, WarmupConfig(requests=0), cfg.scrape, "five", cfg
    )
    job = StatsJob(
        store, run_id="five", stats_cfg=stats_cfg, warmup=settings.warmup, **arm_roles(settings)
    )
    result = await job.run_once()
    await job.close()
    assert result.get("arm_labels") == {"ngram-k4": {"method": "ngram", "k": "4"}}
    window = result["results"]["all"]["all"]
    assert window["control"] == "base" and window["treatments"] == list(FIVE[1:])
    assert list(window["comparisons"]) == list(FIVE[1:])
    assert window["multiplicity"]["alpha_per_comparison"] == StatsConfig().alpha / 4
    for treatment, comparison in window["comparisons"].items():
        assert comparison["treatment"] == treatment
        assert set(comparison["samples"]) == {"base", treatment}
        assert min(comparison["samples"].values()) > 0
    assert window["samples"] == window["comparisons"]["ngram-k2"]["samples"]  # the first's
    assert set(window["best"]["speedups"]) == set(FIVE[1:])
    stats = CollectorRegistry()
    register_stats_collector(stats, lambda: result)
    gauges = {
        s.labels["arm"] for f in stats.collect() if f.name == names.SPEEDUP for s in f.samples
    }
    assert gauges == set(FIVE[1:])  # one series set per treatment, bounded by the config's arms
