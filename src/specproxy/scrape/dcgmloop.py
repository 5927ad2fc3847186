"""The periodic scrape of each arm's NVIDIA dcgm-exporters, and the arm's recent GPU samples.

Only arms with `dcgm_urls` are scraped; without any the scraper starts no task at all. Every
`scrape.interval_s` all of an arm's exporters are read concurrently on the arm's own
`ClientSession`, each GET bounded by `scrape.timeout_s` and `loop.MAX_BODY_BYTES`, parsed in a
worker thread (`dcgm.parse_dcgm`) and combined into one `GpuSample` per arm
(`dcgm.combine_readings`). An exporter that fails is logged once when its state changes; the arm
is down only when none answered, and its sample then says why.

Each sample goes to the recorder (the store: table `gpu_samples`, through the same buffer, spill
file and raw-row retention as engine samples), stamped with the run's id; the scraper itself
keeps only each arm's latest sample, for its gauges (`scrape.dcgmcollector`). The stats job
reads the newest ones back from the store (`Store.read_gpu_samples`, `job.GPU_SAMPLES_READ` per
arm) and summarises them per window (`stats.diagnosis.summarise_gpu`), so `specproxy stats`, the
report and a new leader after a failover see the same GPU history, whichever replica scraped it.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import aiohttp

from specproxy.config import Config
from specproxy.records import Arm, GpuRecorder, GpuSample
from specproxy.scrape.dcgm import GpuReading, combine_readings, metrics_url, parse_dcgm
from specproxy.scrape.loop import describe_error, fetch_text
from specproxy.tasks import cancel_and_wait

__all__ = ["GpuArmState", "GpuScraper"]

logger = logging.getLogger("specproxy.scrape.dcgm")


@dataclass(slots=True)
class GpuArmState:
    """What the GPU scraper knows about one arm (read by the collector and the stats job)."""

    arm: Arm
    urls: tuple[str, ...]  # the exporters' base URLs, as configured
    gpus: tuple[str, ...] = ()  # `dcgm_gpus`: the arm's GPUs on those nodes; () = all
    pods: tuple[str, ...] = ()  # `dcgm_pods`: prefixes of the arm's pods' names; () = any
    up: dict[str, bool] = field(default_factory=dict)  # per exporter, once scraped
    errors: dict[str, str] = field(default_factory=dict)  # per exporter that failed last
    latest: GpuSample | None = None


class GpuScraper:
    """Scrapes the arms' dcgm-exporters periodically; `start()` / `close()` bracket the app."""

    def __init__(
        self,
        config: Config,
        sessions: Mapping[Arm, aiohttp.ClientSession],
        recorder: GpuRecorder | None = None,
        *,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._run_id = config.run_id
        self._recorder = recorder
        self._interval_s = config.scrape.interval_s
        self._timeout_s = config.scrape.timeout_s
        self._sessions = sessions
        self._clock = clock
        self._states: dict[Arm, GpuArmState] = {}
        for arm in config.arm_names:
            pool = config.arm_config(arm)
            if pool.dcgm_urls:
                self._states[arm] = GpuArmState(arm, pool.dcgm_urls, pool.dcgm_gpus, pool.dcgm_pods)
        self._task: asyncio.Task[None] | None = None

    @property
    def states(self) -> Mapping[Arm, GpuArmState]:
        """Only the arms that have exporters configured."""
        return self._states

    async def start(self) -> None:
        if self._task is None and self._states:
            self._task = asyncio.create_task(self._run(), name="specproxy-gpu-scraper")

    async def close(self) -> None:
        task, self._task = self._task, None
        await cancel_and_wait(task)

    async def scrape_once(self) -> dict[Arm, GpuSample]:
        """Scrape every configured arm once, concurrently; never raises (but on cancellation)."""
        samples = await asyncio.gather(*(self._scrape_arm(s) for s in self._states.values()))
        return dict(zip(self._states, samples, strict=True))

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        next_at = loop.time()
        while True:
            await self.scrape_once()
            next_at = max(next_at + self._interval_s, loop.time())  # fixed rate
            await asyncio.sleep(next_at - loop.time())

    async def _scrape_arm(self, state: GpuArmState) -> GpuSample:
        t = self._clock()
        results = await asyncio.gather(*(self._scrape_exporter(state, u) for u in state.urls))
        readings: list[GpuReading] = []
        errors: list[str] = []
        for url, result in zip(state.urls, results, strict=True):
            ok = not isinstance(result, str)
            if state.up.get(url) is not ok:
                if ok:
                    logger.info("GPU exporter %s of %s: up", url, state.arm)
                else:
                    logger.warning(
                        "GPU exporter %s of %s: scrape failed: %s", url, state.arm, result
                    )
            state.up[url] = ok
            if isinstance(result, str):
                state.errors[url] = result
                errors.append(result)
            else:
                state.errors.pop(url, None)
                readings.extend(result)
        error = "; ".join(sorted(set(errors))) if len(errors) == len(state.urls) else None
        sample = combine_readings(t, state.arm, readings, error=error, run_id=self._run_id)
        state.latest = sample
        self._record(sample)
        return sample

    def _record(self, sample: GpuSample) -> None:
        if self._recorder is None:
            return
        try:
            self._recorder.record_gpu(sample)
        except Exception:  # the contract says it never raises; the loop must not trust that
            logger.exception("GPU %s: recording the GPU sample failed", sample.arm)

    async def _scrape_exporter(self, state: GpuArmState, url: str) -> tuple[GpuReading, ...] | str:
        """The exporter's GPUs, or why they could not be read."""
        try:
            session = self._sessions[state.arm]
            text = await fetch_text(session, metrics_url(url), timeout_s=self._timeout_s)
            return await asyncio.to_thread(parse_dcgm, text, gpus=state.gpus, pods=state.pods)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # the loop must survive anything a remote server sends
            return describe_error(exc)
