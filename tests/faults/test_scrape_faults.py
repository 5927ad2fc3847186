"""An engine whose /metrics page is huge but under the cap (issue 29, defect 9: a 13.6 MB page
every 5 s kept the proxy at 94 % CPU). A real `specproxy serve` scrapes it every 0.2 s: the
parsing CPU of a round stretches the wait before the next one so that parsing takes at most
5 % of a core (`scrape.loop.next_wait`), and says so in its log; a page above the cap is refused
without being parsed. The assertions are on the scraper's own figures (the CPU it logs, the gaps
between the GETs the engine sees), never on how fast this machine parses."""

from __future__ import annotations

import asyncio
import itertools
import re
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from aiohttp import web

from specproxy.scrape.loop import CPU_SHARE, MAX_BODY_BYTES
from tests.conftest import fixture_path
from tests.faults.conftest import RUN, fault_row
from tests.faults.serve_proc import Serve
from tests.faults.upstream import padded_metrics_page

pytestmark = pytest.mark.timeout(300)

INTERVAL_S = 0.2
STRETCH = re.compile(r"took ([0-9.]+) s of CPU: scraping every ([0-9.]+) s")


class _Engine:
    """An aiohttp stand-in answering /health, /v1/models and /metrics (the page given), which
    notes when each /metrics GET arrived."""

    def __init__(self, page: bytes) -> None:
        self.page = page
        self.hits: list[float] = []
        self.hit = asyncio.Event()  # set on each /metrics GET
        self.url = ""
        self._runner: web.AppRunner | None = None

    async def _metrics(self, request: web.Request) -> web.Response:
        self.hits.append(time.monotonic())
        self.hit.set()
        return web.Response(body=self.page, content_type="text/plain")

    async def _health(self, request: web.Request) -> web.Response:
        return web.Response(text="ok")

    async def _models(self, request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": "m", "object": "model"}]})

    async def start(self) -> None:
        app = web.Application()
        app.router.add_get("/metrics", self._metrics)
        app.router.add_get("/health", self._health)
        app.router.add_get("/v1/models", self._models)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        port = self._runner.addresses[0][1]
        self.url = f"http://127.0.0.1:{port}"

    async def close(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()


@pytest.fixture
async def engines() -> AsyncIterator[tuple[_Engine, _Engine]]:
    small = fixture_path("metrics_baseline.prom").read_bytes()
    pair = (_Engine(small), _Engine(padded_metrics_page(2 * 1024 * 1024)))
    for engine in pair:
        await engine.start()
    yield pair
    for engine in pair:
        await engine.close()


def _toml(baseline: str, speculative: str) -> str:
    return f"""
baseline_url = "{baseline}"
speculative_url = "{speculative}"
run_id = "{RUN}"
[store]
url = "memory://"
[scrape]
interval_s = {INTERVAL_S}
"""


async def test_a_huge_metrics_page_stretches_the_scrape_interval(
    engines: tuple[_Engine, _Engine], tmp_path: Path
) -> None:
    base, spec = engines
    serve = Serve(tmp_path, _toml(base.url, spec.url))
    try:
        await serve.ready()
        rss_before = serve.rss_bytes()
        log = ""
        for _ in range(600):  # the first round's parse, however long this machine takes
            log = serve.log.read_text()
            if STRETCH.search(log):
                break
            await asyncio.sleep(0.1)
        match = STRETCH.search(log)
        assert match is not None, log
        cpu_s, wait_s = float(match.group(1)), float(match.group(2))
        assert wait_s == pytest.approx(
            max(INTERVAL_S, cpu_s / CPU_SHARE), abs=0.2
        )  # as logged: %.2f, %.1f
        assert wait_s > INTERVAL_S
        # the round that logged it ends; the next starts no sooner than wait_s after it began
        first = len(spec.hits)
        spec.hit.clear()
        await asyncio.wait_for(spec.hit.wait(), 120)
        rss_after = serve.rss_bytes()
        starts = spec.hits
        gaps = [b - a for a, b in itertools.pairwise(starts)]
        # the round after the stretch starts wait_s after the one that set it (give or take the
        # event loop's timer jitter on a loaded machine; unstretched it would be 0.2 s)
        assert gaps[first - 1] >= wait_s / 2, (gaps, wait_s)
        # the small page's engine is scraped in the same rounds, not on its own 0.2 s clock
        assert len(base.hits) <= len(spec.hits) + 1
        assert serve.proc.poll() is None
    finally:
        serve.proc.terminate()
        await serve.wait()
    fault_row(
        "2 MiB /metrics every 0.2 s",
        f"parse {cpu_s:.2f} s CPU -> every {wait_s:.1f} s (<= {CPU_SHARE:.0%} of a core)",
        "engine samples",
        0,
        rss_before,
        rss_after,
    )


async def test_a_page_over_the_cap_is_refused_unparsed(
    engines: tuple[_Engine, _Engine], tmp_path: Path
) -> None:
    base, spec = engines
    spec.page = padded_metrics_page(MAX_BODY_BYTES + 1024)
    serve = Serve(tmp_path, _toml(base.url, spec.url))
    try:
        await serve.ready()
        for _ in range(600):
            if "exceeds" in serve.log.read_text():
                break
            await asyncio.sleep(0.1)
        assert f"exceeds {MAX_BODY_BYTES} bytes" in serve.log.read_text()
        up = await serve.metric('specproxy_engine_up{arm="speculative"')
        assert up == 0.0  # refused: the arm's engine reads as down, never half-parsed
        assert not STRETCH.search(serve.log.read_text())  # nothing was parsed to cost CPU
    finally:
        serve.proc.terminate()
        await serve.wait()
