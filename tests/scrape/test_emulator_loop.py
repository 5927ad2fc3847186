"""The scraper against the emulator pair: derived acceptance versus the configured alpha.

Why the tolerances hold. With `acceptance_spread=0` every speculative step of every sequence draws
its accepted-prefix length j independently: positions are accepted left to right with
probability alpha until the first rejection, capped at k, so P(j = i) = alpha^i (1 - alpha) for
i < k and P(j = k) = alpha^k. Over n drafts (steps) the scraper's figures are sample means:

- position-0 rate = (#drafts whose first token was accepted) / n ~ Binomial(n, alpha) / n,
  standard error sqrt(alpha (1 - alpha) / n);
- acceptance rate = sum(j) / (k n), standard error sd(j) / (k sqrt(n));
- mean acceptance length = 1 + sum(j) / n, standard error sd(j) / sqrt(n).

n is about 2,300 here, so by the CLT each figure lies within 4 standard errors (about +-0.04 for
the position-0 rate) with probability 1 - 6e-5; the emulator's RNG is seeded, so the run is
reproducible anyway. A wrong formula misses by far more: e.g. accepted / drafts instead of
accepted / draft tokens gives 1.77 instead of 0.44, and the untruncated E[j] = a/(1-a) gives 2.33
instead of 1.77.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import AsyncIterator
from dataclasses import dataclass

import aiohttp
import pytest
from pytest_aiohttp import AiohttpServer

from specproxy.config import Config, ScrapeConfig
from specproxy.emulator.config import EmulatorConfig, MetricsVersion
from specproxy.emulator.server import run_emulator
from specproxy.records import SHORTHAND_ARMS, SHORTHAND_CONTROL, SHORTHAND_TREATMENT, Arm
from specproxy.scrape.loop import EngineScraper
from specproxy.scrape.parse import SpecFormat
from tests.scrape.fakes import ListRecorder, RoundRobinBalancer

ALPHA = 0.7
K = 4
REQUESTS = 32
MAX_TOKENS = 200


def accepted_prefix_moments(alpha: float, k: int) -> tuple[float, float]:
    """Mean and standard deviation of j, the accepted prefix of one k-token draft."""
    probs = [alpha**i * (1 - alpha) for i in range(k)] + [alpha**k]
    mean = sum(i * p for i, p in enumerate(probs))
    var = sum((i - mean) ** 2 * p for i, p in enumerate(probs))
    return mean, math.sqrt(var)


@dataclass
class Pair:
    scraper: EngineScraper
    recorder: ListRecorder
    urls: dict[Arm, str]
    session: aiohttp.ClientSession


def two_arm_scraper(
    session: aiohttp.ClientSession, speculative: str, baseline: str, run_id: str
) -> tuple[EngineScraper, ListRecorder]:
    """A scraper of the two shorthand arms at these URLs, recording into a list."""
    config = Config(
        speculative_url=speculative,
        baseline_url=baseline,
        scrape=ScrapeConfig(timeout_s=5.0),
        run_id=run_id,
    )
    recorder = ListRecorder()
    return EngineScraper(config, {arm: session for arm in SHORTHAND_ARMS}, recorder), recorder


async def emulator_pair(version: MetricsVersion) -> AsyncIterator[Pair]:
    spec_cfg = EmulatorConfig(
        speculative=True,
        acceptance=ALPHA,
        num_speculative_tokens=K,
        time_scale=0.02,
        seed=7,
        metrics_version=version,
        acceptance_spread=0.0,
    )
    base_cfg = EmulatorConfig(time_scale=0.02, seed=7, metrics_version=version)
    async with (
        run_emulator(spec_cfg) as spec_url,
        run_emulator(base_cfg) as base_url,
        aiohttp.ClientSession() as session,
    ):
        scraper, recorder = two_arm_scraper(session, spec_url, base_url, "emu")
        yield Pair(scraper, recorder, {"speculative": spec_url, "baseline": base_url}, session)


# Both engine generations: the emulator serves V0 names with `--metrics-version v0`.
EMULATOR_METRICS_VERSIONS = ["v1", "v0"]


@pytest.fixture(params=EMULATOR_METRICS_VERSIONS)
async def pair(request: pytest.FixtureRequest) -> AsyncIterator[Pair]:
    async for p in emulator_pair(request.param):
        yield p


async def generate(pair: Pair, arm: Arm, requests: int) -> None:
    await complete(pair.session, pair.urls[arm], requests)


async def complete(session: aiohttp.ClientSession, url: str, requests: int) -> None:
    """`requests` concurrent completions of MAX_TOKENS tokens from the engine at `url`."""

    async def one(i: int) -> None:
        body = {
            "model": "tiny-llama",
            "prompt": f"request {i}: tell me a story about the number {i * 7919}",
            "max_tokens": MAX_TOKENS,
            "temperature": 1.0,
        }
        async with session.post(url + "/v1/completions", json=body) as resp:
            assert resp.status == 200, await resp.text()
            await resp.read()

    async with asyncio.timeout(60):  # a broken emulator must fail the test, not hang it
        await asyncio.gather(*(one(i) for i in range(requests)))


async def test_derived_acceptance_matches_configured_alpha(pair: Pair) -> None:
    scraper = pair.scraper
    await scraper.scrape_once()
    before = scraper.states["speculative"].snapshot
    assert before is not None
    await asyncio.gather(
        generate(pair, "speculative", REQUESTS), generate(pair, "baseline", REQUESTS // 4)
    )
    samples = await scraper.scrape_once()
    after = scraper.states["speculative"].snapshot
    assert after is not None
    sample = samples["speculative"]
    assert sample.up and not sample.restarted
    assert sample.acceptance_rate is not None and sample.mean_acceptance_length is not None

    mean_j, sd_j = accepted_prefix_moments(ALPHA, K)
    if after.spec_format is SpecFormat.V1:
        assert after.num_drafts is not None and before.num_drafts is not None
        n = after.num_drafts - before.num_drafts
        assert sample.position_acceptance is not None and len(sample.position_acceptance) == K
        se_p0 = math.sqrt(ALPHA * (1 - ALPHA) / n)
        assert abs(sample.position_acceptance[0] - ALPHA) <= 4 * se_p0
        # Later positions need every earlier one: rate_i ~ alpha^(i+1), each within 4 SE.
        for pos, rate in enumerate(sample.position_acceptance):
            p = ALPHA ** (pos + 1)
            assert abs(rate - p) <= 4 * math.sqrt(p * (1 - p) / n), pos
    else:  # V0: gauges are cumulative since start, which here is the same traffic
        assert after.num_draft_tokens is not None
        n = after.num_draft_tokens / K
        assert sample.position_acceptance is None
    assert n > 1500  # enough drafts for the CLT argument
    assert abs(sample.acceptance_rate - mean_j / K) <= 4 * sd_j / (K * math.sqrt(n))
    assert abs(sample.mean_acceptance_length - (1 + mean_j)) <= 4 * sd_j / math.sqrt(n)

    baseline = samples["baseline"]
    assert baseline.up
    assert baseline.acceptance_rate is None and baseline.position_acceptance is None
    assert baseline.generation_tokens_per_s is not None and baseline.generation_tokens_per_s > 0


async def test_emulator_restart_is_detected(pair: Pair) -> None:
    scraper = pair.scraper
    await generate(pair, "speculative", 4)
    first = await scraper.scrape_once()
    url = pair.urls["speculative"] + "/emulator/restart"
    async with pair.session.post(url) as resp:
        assert resp.status == 200
    second = await scraper.scrape_once()
    assert second["speculative"].restarted
    assert not second["baseline"].restarted
    (when,) = scraper.restart_times("speculative")
    assert first["speculative"].t <= when <= second["speculative"].t
    assert scraper.states["speculative"].restarts == 1
    assert any(s.restarted for s in pair.recorder.engine_samples)
    third = await scraper.scrape_once()  # the new life is steady again
    assert not third[SHORTHAND_TREATMENT].restarted


async def scraper_behind(
    aiohttp_server: AiohttpServer, balancer: RoundRobinBalancer, control: str
) -> tuple[str, EngineScraper, ListRecorder]:
    """The balancer served on its own URL, and a scraper whose treatment arm is that URL."""
    url = str((await aiohttp_server(balancer.app())).make_url("")).rstrip("/")
    scraper, recorder = two_arm_scraper(balancer.session, url, control, "lb")
    return url, scraper, recorder


def assert_a_balancer_never_a_restart(
    scraper: EngineScraper, recorder: ListRecorder, url: str, caplog: pytest.LogCaptureFixture
) -> None:
    """No restart anywhere, the URL known as load-balanced, and one warning naming it and the
    dns form."""
    assert scraper.restart_times(SHORTHAND_TREATMENT) == ()
    assert not any(s.restarted for s in recorder.engine_samples)
    assert scraper.states[SHORTHAND_TREATMENT].endpoints[url].balanced
    warnings = [r.getMessage() for r in caplog.records if "load-balanced" in r.getMessage()]
    assert len(warnings) == 1 and 'dns = "<headless Service>"' in warnings[0]
    assert url in warnings[0]


async def test_two_emulators_behind_one_round_robin_url_are_no_restart(
    aiohttp_server: AiohttpServer, caplog: pytest.LogCaptureFixture
) -> None:
    """A ClusterIP Service in front of two engines: each scrape of its URL reaches the next one.
    The first scrape reaches the newer process, so the second scrape shows an older one: another
    engine, never a restart; the warning names the dns form once; acceptance is still measured,
    each process against its own previous scrape."""
    cfg = EmulatorConfig(
        speculative=True,
        acceptance=ALPHA,
        num_speculative_tokens=K,
        time_scale=0.02,
        seed=7,
        acceptance_spread=0.0,
    )
    async with run_emulator(cfg) as older, aiohttp.ClientSession() as session:
        await asyncio.sleep(0.05)  # two distinct process start times
        async with run_emulator(cfg) as newer:
            balancer = RoundRobinBalancer([newer, older], session)
            url, scraper, recorder = await scraper_behind(aiohttp_server, balancer, older)
            pair = Pair(
                scraper, recorder, {SHORTHAND_TREATMENT: url, SHORTHAND_CONTROL: older}, session
            )
            samples = []
            for _ in range(4):
                samples.append((await scraper.scrape_once())[SHORTHAND_TREATMENT])
                await generate(pair, SHORTHAND_TREATMENT, 8)  # 4 to each engine
    assert_a_balancer_never_a_restart(scraper, recorder, url, caplog)
    # scrapes 3 and 4 each see the process of scrapes 1 and 2 again: deltas of 8 requests of
    # one engine, near E[j] / k (0.44; a sum over ~400 drafts, so within 0.1 by far)
    mean_j, _ = accepted_prefix_moments(ALPHA, K)
    for sample in samples[2:]:
        assert sample.acceptance_rate == pytest.approx(mean_j / K, abs=0.1)


async def test_two_engines_without_start_times_behind_one_url_are_no_restart(
    aiohttp_server: AiohttpServer, caplog: pytest.LogCaptureFixture
) -> None:
    """The same balancer in front of engines that export no process start time (vLLM with
    --api-server-count > 1): only their counters go back and forth, never a restart is
    recorded, and the warning names the dns form."""
    cfg = EmulatorConfig(speculative=True, time_scale=0.02, seed=7)
    async with (
        run_emulator(cfg) as busy,
        run_emulator(cfg) as idle,
        aiohttp.ClientSession() as session,
    ):
        # one engine has served more than the other has: its counters are higher
        await complete(session, busy, 8)
        balancer = RoundRobinBalancer([busy, idle], session, hide_start_time=True)
        url, scraper, recorder = await scraper_behind(aiohttp_server, balancer, idle)
        samples = [(await scraper.scrape_once())[SHORTHAND_TREATMENT] for _ in range(6)]
    assert all(s.up and s.process_start_time is None for s in samples)
    assert_a_balancer_never_a_restart(scraper, recorder, url, caplog)


async def test_a_gateway_arm_is_scraped_at_its_engines(aiohttp_server: AiohttpServer) -> None:
    """Traffic goes through a gateway (LiteLLM, a router: here one that balances over two
    engines and has a /metrics of its own); `metrics_urls` names the engines, so acceptance is
    read from them, each by itself, and the gateway's /metrics is never asked."""
    cfg = EmulatorConfig(
        speculative=True,
        acceptance=ALPHA,
        num_speculative_tokens=K,
        time_scale=0.02,
        seed=7,
        acceptance_spread=0.0,
    )
    litellm = "# TYPE litellm_requests_metric counter\nlitellm_requests_metric_total 3.0\n"
    async with (
        run_emulator(cfg) as one,
        run_emulator(cfg) as two,
        aiohttp.ClientSession() as session,
    ):
        gateway = RoundRobinBalancer([one, two], session, own_metrics=litellm)
        url = str((await aiohttp_server(gateway.app())).make_url("")).rstrip("/")
        config = Config.from_mapping(
            {
                "speculative": {"urls": [url], "metrics_urls": [one, two]},
                "baseline_url": one,
                "scrape": {"timeout_s": 5.0},
                "run_id": "gw",
            }
        )
        recorder = ListRecorder()
        scraper = EngineScraper(config, {arm: session for arm in SHORTHAND_ARMS}, recorder)
        pair = Pair(scraper, recorder, {SHORTHAND_TREATMENT: url, SHORTHAND_CONTROL: one}, session)
        await scraper.scrape_once()
        await generate(pair, SHORTHAND_TREATMENT, 16)  # 8 through the gateway to each engine
        sample = (await scraper.scrape_once())[SHORTHAND_TREATMENT]
    state = scraper.states[SHORTHAND_TREATMENT]
    assert set(state.endpoints) == {one, two}
    assert gateway.picks.get("/metrics", 0) == 0
    assert gateway.picks["/v1/completions"] == 16
    assert sample.up and state.snapshot is not None
    assert state.snapshot.spec_format is SpecFormat.V1
    mean_j, _ = accepted_prefix_moments(ALPHA, K)
    assert sample.acceptance_rate == pytest.approx(mean_j / K, abs=0.1)
    assert not any(ep.balanced for ep in state.endpoints.values())
