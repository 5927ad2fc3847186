"""The dashboard and the alert rules against a real Prometheus scraping the real proxy.

Set-up, all on loopback: two emulated vLLM servers (speculative and baseline), the proxy in
front of them with its store, scraper and stats job, and Debian's `prometheus` binary scraping
the proxy every second with the shipped rules. The rules are the production file with only
`for:` shortened (tests/deploy/rulefiles.py); the scrape config is the shipped prometheus.yml
with its intervals and target replaced.

Then: (1) every panel query of the generated dashboard, with its template variables substituted
as Grafana would, must succeed and return at least one series; (2) after the speculative arm is
made 10x slower through the emulator's admin API, the P99-slowdown alert must fire in that
Prometheus (ALERTS) within a bounded time.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import socket
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import yaml
from aiohttp import web

from specproxy import metrics as m
from specproxy.app import create_app
from specproxy.config import (
    ArmConfig,
    Config,
    RoutingConfig,
    ScrapeConfig,
    StatsConfig,
    StoreConfig,
    WarmupConfig,
)
from specproxy.emulator.config import EmulatorConfig
from specproxy.emulator.server import run_emulator
from specproxy.grafana.dashboard import build_dashboard, panel_queries
from specproxy.stats.anytime.sequential import count_boundaries
from specproxy.stats.job.tick import window_label
from tests.conftest import require_binary
from tests.deploy.rulefiles import PROMETHEUS_DIR, fast_variant, load_rules
from tests.scrape.fakes import FakeMetricsServer

pytestmark = pytest.mark.slow

MODEL = "tiny-llama"
DCGM_FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "dcgm-exporter"
P99_ALERT = "SpecProxySpeculativeP99Slowdown"
SCRAPE_INTERVAL = "1s"
RATE_INTERVAL = "15s"  # what Grafana's $__rate_interval gives for a 1 s scrape, rounded up
RATE_WINDOW_FILLED_S = 16.0
WINDOWS_S: tuple[float | None, ...] = (20.0, None)
STATS_DEADLINE_S = 60.0
SAMPLES_DEADLINE_S = 120.0
ALERT_DEADLINE_S = 60.0
SLOWDOWN = 10.0
CLIENTS = 16


# --- Prometheus -----------------------------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def _prometheus_config(target: str | list[str], rule_file: Path) -> dict[str, Any]:
    """The shipped prometheus.yml, scraping `target`(s) every second with the fast rules."""
    config: dict[str, Any] = yaml.safe_load((PROMETHEUS_DIR / "prometheus.yml").read_text())
    config["global"] = {
        "scrape_interval": SCRAPE_INTERVAL,
        "scrape_timeout": SCRAPE_INTERVAL,
        "evaluation_interval": SCRAPE_INTERVAL,
    }
    config["rule_files"] = [str(rule_file)]
    [job] = config["scrape_configs"]
    job["static_configs"] = [{"targets": [target] if isinstance(target, str) else target}]
    return config


@dataclass
class Prometheus:
    url: str
    session: aiohttp.ClientSession

    async def _get(self, path: str, params: dict[str, str]) -> Any:
        async with self.session.get(self.url + path, params=params) as resp:
            body = await resp.json()
        assert body["status"] == "success", f"{path} {params}: {body}"
        return body["data"]

    async def query(self, expr: str) -> list[dict[str, Any]]:
        data = await self._get("/api/v1/query", {"query": expr})
        result: list[dict[str, Any]] = data["result"]
        return result

    async def query_range(self, expr: str, seconds: float = 30.0) -> list[dict[str, Any]]:
        end = time.time()
        params = {"query": expr, "start": str(end - seconds), "end": str(end), "step": "1"}
        data = await self._get("/api/v1/query_range", params)
        result: list[dict[str, Any]] = data["result"]
        return result

    async def label_values(self, label: str, match: str) -> list[str]:
        values: list[str] = await self._get(f"/api/v1/label/{label}/values", {"match[]": match})
        return values

    async def wait_for(self, expr: str, deadline_s: float) -> list[dict[str, Any]]:
        """Poll an instant query until it returns a series; [] when the deadline passes."""
        stop = time.monotonic() + deadline_s
        while True:
            result = await self.query(expr)
            if result or time.monotonic() > stop:
                return result
            await asyncio.sleep(1.0)


def _write_config(workdir: Path, target: str | list[str]) -> Path:
    rule_file = workdir / "specproxy.rules.yml"
    rule_file.write_text(yaml.safe_dump(fast_variant(load_rules())), encoding="utf-8")
    config_file = workdir / "prometheus.yml"
    config_file.write_text(yaml.safe_dump(_prometheus_config(target, rule_file)), encoding="utf-8")
    return config_file


@contextlib.asynccontextmanager
async def run_prometheus(
    binary: str, workdir: Path, target: str | list[str]
) -> AsyncIterator[Prometheus]:
    config_file = await asyncio.to_thread(_write_config, workdir, target)
    port = _free_port()
    log_file = workdir / "prometheus.log"
    with log_file.open("wb") as log:
        process = await asyncio.create_subprocess_exec(
            binary,
            f"--config.file={config_file}",
            f"--storage.tsdb.path={workdir / 'data'}",
            f"--web.listen-address=127.0.0.1:{port}",
            "--log.level=warn",
            stdout=log,
            stderr=asyncio.subprocess.STDOUT,
        )
    try:
        async with aiohttp.ClientSession() as session:
            prometheus = Prometheus(f"http://127.0.0.1:{port}", session)
            await _wait_ready(prometheus, process, log_file)
            yield prometheus
    finally:
        if process.returncode is None:
            process.terminate()
            try:
                await asyncio.wait_for(process.wait(), 10)
            except TimeoutError:
                process.kill()
                await process.wait()


async def _wait_ready(
    prometheus: Prometheus, process: asyncio.subprocess.Process, log: Path
) -> None:
    stop = time.monotonic() + 30.0
    while time.monotonic() < stop and process.returncode is None:
        with contextlib.suppress(aiohttp.ClientError):
            async with prometheus.session.get(prometheus.url + "/-/ready") as resp:
                if resp.status == 200:
                    return
        await asyncio.sleep(0.2)
    output = await asyncio.to_thread(log.read_text)
    pytest.fail(f"prometheus not ready (exit code {process.returncode}):\n{output}")


# --- the system under test ------------------------------------------------------------------


@dataclass
class System:
    proxy_url: str
    speculative_url: str
    baseline_url: str


def _emulator(*, speculative: bool) -> EmulatorConfig:
    # Real-time physics (10 ms target steps): engine time, not the shared CPU, then dominates
    # each request, so the slowdown shows in the tail as clearly as it would on real engines.
    return EmulatorConfig(speculative=speculative, warmup_requests=0, default_output_tokens=24)


@contextlib.asynccontextmanager
async def run_dcgm_exporter() -> AsyncIterator[str]:
    """A fake dcgm-exporter on port 0 serving a fixture page with every field the GPU panels use
    (tests/fixtures/dcgm-exporter/derived_h200_cool.prom; its README says how it was derived)."""
    exporter = FakeMetricsServer(body=(DCGM_FIXTURES / "derived_h200_cool.prom").read_text())
    runner = web.AppRunner(exporter.app(), access_log=None)
    await runner.setup()
    try:
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        yield f"http://127.0.0.1:{runner.addresses[0][1]}"
    finally:
        await runner.cleanup()


@contextlib.asynccontextmanager
async def run_system(tmp_path: Path) -> AsyncIterator[System]:
    async with (
        run_emulator(_emulator(speculative=True)) as speculative_url,
        run_emulator(_emulator(speculative=False)) as baseline_url,
        run_dcgm_exporter() as dcgm_url,
    ):
        # Each arm gets GPU telemetry, so the dashboard's GPU row is proven like every other row.
        cfg = Config(
            speculative=ArmConfig(urls=(speculative_url,), dcgm_urls=(dcgm_url,)),
            baseline=ArmConfig(urls=(baseline_url,), dcgm_urls=(dcgm_url,)),
            port=0,
            routing=RoutingConfig(seed=7),
            store=StoreConfig(url=f"sqlite:///{tmp_path / 'specproxy.db'}", flush_interval_s=0.2),
            scrape=ScrapeConfig(interval_s=1.0),
            stats=StatsConfig(interval_s=2.0, windows_s=WINDOWS_S, resamples=100),
            warmup=WarmupConfig(requests=0, restart_requests=0, restart_seconds=0.0),
        )
        runner = web.AppRunner(create_app(cfg), access_log=None, shutdown_timeout=1.0)
        await runner.setup()
        try:
            site = web.TCPSite(runner, "127.0.0.1", 0)
            await site.start()
            port = runner.addresses[0][1]
            yield System(f"http://127.0.0.1:{port}", speculative_url, baseline_url)
        finally:
            await runner.cleanup()


async def _client(session: aiohttp.ClientSession, url: str, stop: asyncio.Event) -> int:
    sent = 0
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": "Tell me about speculative decoding."}],
        "max_tokens": 24,
        "stream": True,
    }
    headers = {"x-specproxy-category": "chat"}  # so the category panels have a band
    while not stop.is_set():
        async with session.post(url + "/v1/chat/completions", json=body, headers=headers) as resp:
            await resp.read()
            assert resp.status == 200, await resp.text()
        sent += 1
    return sent


@contextlib.asynccontextmanager
async def traffic(proxy_url: str) -> AsyncIterator[None]:
    """Closed-loop streaming chat traffic for as long as the block runs."""
    stop = asyncio.Event()
    async with aiohttp.ClientSession() as session:
        # One request the upstream rejects (unknown model), so the errors panel has a series.
        async with session.post(
            proxy_url + "/v1/chat/completions",
            json={"model": "no-such-model", "messages": [{"role": "user", "content": "x"}]},
        ) as resp:
            assert resp.status == 404, await resp.text()
        tasks = [asyncio.create_task(_client(session, proxy_url, stop)) for _ in range(CLIENTS)]
        try:
            yield
        finally:
            stop.set()
            await asyncio.gather(*tasks)


def samples_for_a_p99_bound(alpha: float) -> int:
    """Samples before an arm's P99 has an upper confidence bound (each arm runs at alpha/2)."""
    t = 100
    while count_boundaries(t, 0.99, alpha / 2)[1] > t:
        t += 10
    return t


def test_p99_bound_needs_about_a_thousand_samples() -> None:
    assert 500 < samples_for_a_p99_bound(0.05) <= 1500


# --- template variables ---------------------------------------------------------------------


def substitute(expr: str, variables: dict[str, str]) -> str:
    """Grafana's `$name` / `${name}` / `${name:format}` interpolation; a format's value is
    looked up as "name:format"."""

    def replace(match: re.Match[str]) -> str:
        name = match.group(1) or match.group(2)
        assert name in variables, f"no value for ${name} in {expr!r}"
        return variables[name]

    return re.sub(r"\$\{(\w+(?::\w+)?)\}|\$(\w+)", replace, expr)


def test_substitute_handles_every_form() -> None:
    out = substitute(
        'x{a="$model",b="${model:text}"}[${__rate_interval}]',
        {"model": "m", "model:text": "M", "__rate_interval": "9s"},
    )
    assert out == 'x{a="m",b="M"}[9s]'


# --- the test -------------------------------------------------------------------------------

# Panels whose series exist only under a condition this traffic does not meet (their queries
# still run: a query Prometheus rejects fails the test), and why.
CONDITIONAL_PANELS = {
    "Crossover load": "a series only where the speedup crosses 1 inside the observed load; "
    "the emulated treatment helps at every load this closed loop reaches",
}


async def test_dashboard_queries_and_p99_alert_in_real_prometheus(tmp_path: Path) -> None:
    binary = require_binary("prometheus")
    async with run_system(tmp_path) as system, traffic(system.proxy_url):
        target = system.proxy_url.removeprefix("http://")
        async with run_prometheus(binary, tmp_path, target) as prometheus:
            scraping_since = time.monotonic()
            # The stats job publishes once it has samples from both arms; its gauges then show
            # up on the next scrape.
            verdicts = await prometheus.wait_for(
                f'{m.SAMPLES}{{model="{MODEL}",arm="speculative"}} > 50', STATS_DEADLINE_S
            )
            assert verdicts, f"no {m.SAMPLES} for {MODEL} in Prometheus after {STATS_DEADLINE_S} s"
            up = await prometheus.query('up{job="specproxy"}')
            assert [s["value"][1] for s in up] == ["1"]

            # Template variables resolve the way Grafana's label_values() does.
            models = await prometheus.label_values("model", m.SPEEDUP)
            assert MODEL in models
            windows = await prometheus.label_values("window", f'{m.SPEEDUP}{{model="{MODEL}"}}')
            assert len(windows) == len(WINDOWS_S), windows
            # Let the first rate() window fill with scrapes, as it would be on a live dashboard.
            await asyncio.sleep(
                max(0.0, RATE_WINDOW_FILLED_S - (time.monotonic() - scraping_since))
            )

            failures = []
            for window in windows:
                # Grafana's "All" for $model and $instance: every model and proxy for the
                # proxy's series, the stats job's model="all" aggregate for its gauges.
                variables = {
                    "model": ".*",
                    "model:text": "All",
                    "instance": ".*",
                    "window": window,
                    "statistic": "median",
                    "arm": ".*",  # every treatment
                    "__rate_interval": RATE_INTERVAL,
                }
                for title, expr, instant in panel_queries(build_dashboard()):
                    query = substitute(expr, variables)
                    result = await (
                        prometheus.query(query) if instant else prometheus.query_range(query)
                    )
                    if not result and title not in CONDITIONAL_PANELS:
                        failures.append(f"{title} [{window}]: no series for {query}")
            assert not failures, "\n".join(failures)

            # The sequential test needs an upper bound on the baseline's P99 before it can call
            # the speculative P99 slower; that takes a known number of baseline samples.
            alpha = StatsConfig().alpha
            needed = samples_for_a_p99_bound(alpha)
            enough = await prometheus.wait_for(
                f'min({m.SAMPLES}{{model="{MODEL}",window="{window_label(None)}"}}) >= {needed}',
                SAMPLES_DEADLINE_S,
            )
            assert enough, f"fewer than {needed} samples per arm (alpha {alpha}) in time"
            # No P99 alarm while speculation is honestly faster on end-to-end latency...
            alert = (
                f'ALERTS{{alertname="{P99_ALERT}",alertstate="firing",'
                f'model="{MODEL}",metric="e2e"}}'
            )
            assert await prometheus.query(alert) == []
            # ...and one within a bounded time once the speculative arm is made slow.
            async with (
                aiohttp.ClientSession() as session,
                session.post(
                    system.speculative_url + "/emulator/config", json={"slowdown": SLOWDOWN}
                ) as resp,
            ):
                assert resp.status == 200, await resp.text()
            slowed_at = time.monotonic()
            firing = await prometheus.wait_for(alert, ALERT_DEADLINE_S)
            assert firing, f"{P99_ALERT} did not fire within {ALERT_DEADLINE_S} s of the slowdown"
            assert firing[0]["metric"]["severity"] == "critical"
            print(f"{P99_ALERT} firing {time.monotonic() - slowed_at:.1f} s after the slowdown")
