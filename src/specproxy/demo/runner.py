"""The demo run (`specproxy demo`, what `make demo` runs): the whole system on one machine.

It starts two emulated vLLM servers (speculative and baseline; no GPU, no vLLM needed), or uses
real ones (`--vllm URL,URL`, or `--vllm-python` to start them with the realvllm launcher), puts
the proxy in front with the SQLite store, the scraper and its stats process (as `specproxy serve`
runs them), and sends Poisson traffic with prompts of varied lengths from the packaged prompt
set. While it runs it shows a live terminal view and serves /ui, /metrics and /api/stats; after
`--duration` (or Ctrl-C) it stops the load, waits for a result over everything recorded
(`_final_stats`), and writes the report (`specproxy[report]`: matplotlib) from the
proxy's store while it is still open (so `--store memory://` works too). Without a terminal (CI)
the live view becomes a periodic plain-text line.

The emulated arms' default load stays below what they serve (`demo.capacity`: each arm at most
half of its saturation by the emulator's timing model, and few enough streamed events for the
one event loop the demo runs in); the start-up lines say where the load stands. `--overload`
slows both emulated arms' steps alike until the slower one gets 1.5 times what it serves, so
the run shows what the diagnosis says of a comparison that measures queueing.

`--arms 3` (`demo_arms`) runs three emulated arms, named `[arms.NAME]` style: the baseline
(control) and two n-gram treatments whose true speedups differ, k=2 at acceptance 0.7 (TPOT
speedup 1.83x by the emulator's model) and k=4 at 0.5 (1.38x), each a third of the load. The
view then shows each treatment's comparison with the control and which one is `best`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import aiohttp
from aiohttp import web
from prometheus_client import CollectorRegistry
from rich.console import Console
from rich.live import Live

from specproxy.app import create_app
from specproxy.appkeys import STATS, STATS_JOB, STORE
from specproxy.config import (
    ArmConfig,
    ArmRole,
    Config,
    RoutingConfig,
    ScrapeConfig,
    StatsConfig,
    StoreConfig,
)
from specproxy.demo.capacity import (
    ArmLoad,
    arm_load,
    mean_lengths,
    overload_slowdown,
    split_rate,
)
from specproxy.demo.view import ClientTally, plain_line, render
from specproxy.errors import ConfigError
from specproxy.extras import require
from specproxy.loadgen import ClientResult, LoadGenerator, RequestOptions, Target
from specproxy.prompts import Prompt, load_prompts
from specproxy.records import SHORTHAND_ARMS, SHORTHAND_CONTROL, SHORTHAND_TREATMENT
from specproxy.stats.result import StatsResult

if TYPE_CHECKING:
    from specproxy.emulator.config import EmulatorConfig

__all__ = [
    "DEFAULT_STORE",
    "DEMO_ARM_COUNTS",
    "DemoArm",
    "DemoOptions",
    "DemoOutcome",
    "demo_arms",
    "emulated_loads",
    "emulator_configs",
    "run_demo",
]

DEFAULT_STORE = "sqlite:///specproxy-demo.db"
_FINAL_SLACK_S = 60.0  # beyond 4 stats intervals: the stats process's start-up, a slow machine

log = logging.getLogger(__name__)

DEMO_ARM_COUNTS: tuple[int, ...] = (2, 3)  # `--arms`
# The three-arm demo's treatments: (name, k, acceptance). k=2 at 0.7 expects 2.19 tokens a
# step, k=4 at 0.5 1.94 at a dearer step (k drafts): TPOT speedups 1.83x and 1.38x by the
# emulator's model (`Physics.expected_speedup`, draft cost 0.1), clearly apart.
_NGRAM_ARMS: tuple[tuple[str, int, float], ...] = (("ngram-k2", 2, 0.7), ("ngram-k4", 4, 0.5))


@dataclass(frozen=True, slots=True)
class DemoArm:
    """One arm of the demo: its name, role, traffic weight, labels, and emulated speculation
    (k = 0: none, the baseline)."""

    name: str
    role: ArmRole
    k: int = 0
    acceptance: float = 0.0
    weight: float = 1.0
    labels: dict[str, str] = field(default_factory=dict)

    @property
    def speculative(self) -> bool:
        return self.k > 0


def demo_arms(n: int, *, acceptance: float = 0.8, speculative_tokens: int = 4) -> list[DemoArm]:
    """The demo's arms, the control first (pure).

    n = 2: the two-arm shorthand as `make demo` always ran it, baseline and speculative (k =
    `speculative_tokens` at `acceptance`), split by `routing.speculative_share`. n = 3: the
    baseline and the n-gram treatments of `_NGRAM_ARMS`, equal weights.
    """
    if n not in DEMO_ARM_COUNTS:
        raise ConfigError(f"the demo runs {' or '.join(map(str, DEMO_ARM_COUNTS))} arms, not {n}")
    if n == 2:
        share = RoutingConfig().speculative_share
        return [
            DemoArm(SHORTHAND_CONTROL, "control", weight=1.0 - share),
            DemoArm(SHORTHAND_TREATMENT, "treatment", speculative_tokens, acceptance, weight=share),
        ]
    return [
        DemoArm(SHORTHAND_CONTROL, "control", labels={"method": "none"}),
        *(
            DemoArm(name, "treatment", k, alpha, labels={"method": "ngram", "k": str(k)})
            for name, k, alpha in _NGRAM_ARMS
        ),
    ]


@dataclass(frozen=True, slots=True)
class DemoOptions:
    """Everything the demo can be told; the CLI flags (`demo.cli`) map onto these one to one."""

    rate: float = 16.0  # enough in the default minute for a distribution-free P99 CI per arm
    duration_s: float = 60.0
    acceptance: float = 0.8  # per-position draft acceptance alpha: k=4 gives a ~59 % rate
    speculative_tokens: int = 4
    store: str = DEFAULT_STORE
    vllm_urls: tuple[str, str] | None = None  # (speculative, baseline)
    vllm_python: str | None = None
    host: str = "127.0.0.1"
    port: int = 8000
    out: str = "out/demo-report"
    run_id: str | None = None
    prompts: str | None = None
    # cap on each prompt's output budget: 64 keeps the emulated default load's streamed events
    # within the demo's event loop (`demo.capacity`); None: the prompts' own budgets
    max_tokens: int | None = 64
    stats_interval_s: float = 5.0
    scrape_interval_s: float = 2.0
    resamples: int = 2000
    seed: int = 0
    time_scale: float = 1.0  # emulators only: < 1 runs the physics faster (tests)
    refresh_s: float = 1.0  # live view refresh
    plain_every_s: float = 10.0  # without a terminal: one status line this often
    overload: bool = False  # emulators only: slow both arms until the slower one is overloaded
    arms: int = 2  # emulators only: 2 (baseline, speculative) or 3 (`demo_arms`)


@dataclass(slots=True)
class DemoOutcome:
    """What a demo run left behind."""

    run_id: str
    store: str
    proxy_url: str
    report_dir: Path | None
    final_stats: StatsResult | None
    results: list[ClientResult] = field(default_factory=list)
    interrupted: bool = False


async def run_demo(
    opts: DemoOptions, *, console: Console, started: asyncio.Future[str] | None = None
) -> DemoOutcome:
    """Run the demo to the end (duration or SIGINT) and write the report.

    `started`, when given, receives the proxy's URL as soon as it listens (tests, embedding).
    """
    require("matplotlib", "the demo's report")  # not after a minute of load
    prompts = load_prompts(opts.prompts)
    run_id = opts.run_id or f"demo-{int(time.time())}"
    stop = asyncio.Event()
    emulated = opts.vllm_urls is None and opts.vllm_python is None
    loads = emulated_loads(opts, prompts)
    slowdown = overload_slowdown(list(loads.values())) if opts.overload else 1.0
    async with contextlib.AsyncExitStack() as stack:
        urls = await stack.enter_async_context(_arms(opts, console, slowdown))
        cfg = _config(opts, run_id, urls)
        app = create_app(cfg, registry=CollectorRegistry())  # opens the store, scraper, stats
        runner = web.AppRunner(app, access_log=None, shutdown_timeout=5.0)
        await runner.setup()
        proxy_url = await _listen(runner, opts.host, opts.port)
        stack.push_async_callback(runner.cleanup)
        _print_urls(console, proxy_url, urls, opts)
        if emulated:
            _print_load(console, emulated_loads(opts, prompts, slowdown), slowdown)
        if started is not None and not started.done():
            started.set_result(proxy_url)
        with _sigint_sets(stop):
            session = await stack.enter_async_context(
                aiohttp.ClientSession(
                    connector=aiohttp.TCPConnector(limit=0),
                    cookie_jar=aiohttp.DummyCookieJar(),
                    timeout=aiohttp.ClientTimeout(total=None, sock_connect=10, sock_read=600),
                )
            )
            model = await _model(session, proxy_url)
            options = RequestOptions(model=model, max_tokens_cap=opts.max_tokens)
            gen = LoadGenerator(session, [Target(proxy_url)], prompts, options, seed=opts.seed)
            tally = ClientTally()
            load = asyncio.create_task(
                gen.run_open_loop(
                    opts.rate, duration_s=opts.duration_s, stop=stop, on_result=tally.add
                )
            )
            await _show(console, app, tally, load, opts)
            results = await load
        interrupted = stop.is_set()
        final = await _final_stats(app, opts.stats_interval_s)
        if final is not None:  # exactly what a client of GET /api/stats sees at the end
            async with session.get(proxy_url + "/api/stats") as resp:
                final = await resp.json()
        stats_at = float(final["computed_at"]) if final is not None else None
        # From the proxy's own store, still open: a memory:// store dies with the proxy.
        report_dir = await _write_report(app, opts, run_id, console, stats_at)
        # Leaving the stack stops the proxy (the store closes) and the arms.
    if final is not None:
        console.print(render(final, tally, title="final"))
    return DemoOutcome(
        run_id=run_id,
        store=opts.store,
        proxy_url=proxy_url,
        report_dir=report_dir,
        final_stats=final,
        results=results,
        interrupted=interrupted,
    )


def emulator_configs(opts: DemoOptions, slowdown: float = 1.0) -> dict[str, EmulatorConfig]:
    """{arm: emulator settings} of the demo's arms (`demo_arms(opts.arms)`), the control first;
    slowed down (`--overload`), without the warm-up's extra slowdown, whose first steps would
    otherwise finish nothing."""
    from specproxy.emulator.config import EmulatorConfig

    common: dict[str, Any] = {
        "per_request_metrics": True,
        "time_scale": opts.time_scale,
        "slowdown": slowdown,
    }
    if slowdown > 1.0:
        common["warmup_factor"] = 1.0
    configs: dict[str, EmulatorConfig] = {}
    arms = _demo_arms(opts)
    # the two-arm demo's seeds as they always were (speculative + 1, baseline + 2)
    seeds = [2, 1] if opts.arms == 2 else list(range(1, len(arms) + 1))
    for arm, seed in zip(arms, seeds, strict=True):
        if arm.speculative:
            configs[arm.name] = EmulatorConfig(
                speculative=True,
                num_speculative_tokens=arm.k,
                acceptance=arm.acceptance,
                per_request_spec_metrics="summary",
                seed=opts.seed + seed,
                **common,
            )
        else:  # the two-arm demo's baseline always had the speculative arm's k and acceptance
            configs[arm.name] = EmulatorConfig(
                speculative=False,
                num_speculative_tokens=opts.speculative_tokens,
                acceptance=opts.acceptance,
                seed=opts.seed + seed,
                **common,
            )
    return configs


def emulated_loads(
    opts: DemoOptions, prompts: list[Prompt], slowdown: float = 1.0
) -> dict[str, ArmLoad]:
    """{arm: the model's view of its load} on emulated arms: the rate split by the arms'
    weights (as the proxy routes), the prompts' mean lengths under `max_tokens`."""
    from specproxy.emulator.vocab import chat_prompt_ids

    prompt_tokens, output_tokens = mean_lengths(
        [len(chat_prompt_ids(p.messages)) for p in prompts],
        [p.max_tokens for p in prompts],
        opts.max_tokens,
    )
    rates = split_rate(opts.rate, {arm.name: arm.weight for arm in _demo_arms(opts)})
    return {
        name: arm_load(
            cfg.physics(),
            rates[name],
            prompt_tokens=prompt_tokens,
            output_tokens=output_tokens,
            max_num_seqs=cfg.max_num_seqs,
        )
        for name, cfg in emulator_configs(opts, slowdown).items()
    }


def _demo_arms(opts: DemoOptions) -> list[DemoArm]:
    return demo_arms(
        opts.arms, acceptance=opts.acceptance, speculative_tokens=opts.speculative_tokens
    )


@contextlib.asynccontextmanager
async def _arms(
    opts: DemoOptions, console: Console, slowdown: float = 1.0
) -> AsyncIterator[dict[str, str]]:
    """{arm: base URL}: given, launched real vLLM (two arms), or in-process emulators."""
    if opts.vllm_urls is not None:
        spec, base = opts.vllm_urls
        yield {SHORTHAND_TREATMENT: spec, SHORTHAND_CONTROL: base}
        return
    if opts.vllm_python is not None:
        from specproxy.realvllm.launcher import VllmPair, resolve_vllm_python

        pair = VllmPair(resolve_vllm_python(opts.vllm_python), log_dir=Path(opts.out) / "vllm-logs")
        console.print("starting real vLLM CPU servers (1-3 minutes on 2 cores)...")
        async with pair:
            yield {SHORTHAND_TREATMENT: pair.speculative_url, SHORTHAND_CONTROL: pair.baseline_url}
        return
    from specproxy.emulator.server import run_emulator

    async with contextlib.AsyncExitStack() as stack:
        urls = {
            name: await stack.enter_async_context(run_emulator(cfg))
            for name, cfg in emulator_configs(opts, slowdown).items()
        }
        yield urls


def _config(opts: DemoOptions, run_id: str, urls: dict[str, str]) -> Config:
    common: dict[str, Any] = {
        "host": opts.host,
        "port": opts.port,
        "run_id": run_id,
        "store": StoreConfig(url=opts.store, flush_interval_s=0.5),
        "scrape": ScrapeConfig(interval_s=opts.scrape_interval_s),
        "stats": StatsConfig(
            interval_s=opts.stats_interval_s, resamples=opts.resamples, seed=opts.seed
        ),
    }
    if opts.arms == 2:  # the two-arm shorthand, as the demo always configured it
        return Config(
            baseline_url=urls[SHORTHAND_CONTROL],
            speculative_url=urls[SHORTHAND_TREATMENT],
            **common,
        )
    arms = {
        arm.name: ArmConfig(
            urls=(urls[arm.name],),
            role=arm.role,
            weight=arm.weight,
            labels=arm.labels,
            name=arm.name,
        )
        for arm in _demo_arms(opts)
    }
    return Config(arms=arms, **common)


async def _listen(runner: web.AppRunner, host: str, port: int) -> str:
    """Listen on `port`, or on a free port when it is taken (a demo must not fail on that)."""
    try:
        site = web.TCPSite(runner, host, port)
        await site.start()
    except OSError:
        site = web.TCPSite(runner, host, 0)
        await site.start()
    bound = next(a[1] for a in runner.addresses if isinstance(a, tuple))
    return f"http://{host}:{bound}"


def _print_urls(console: Console, proxy: str, urls: dict[str, str], opts: DemoOptions) -> None:
    kind = "real vLLM" if opts.vllm_urls or opts.vllm_python else "emulated"
    if opts.arms == 2:
        console.print(f"speculative arm ({kind}): {urls[SHORTHAND_TREATMENT]}")
        console.print(f"baseline arm ({kind}):    {urls[SHORTHAND_CONTROL]}")
    else:
        width = max(map(len, urls))
        for arm in _demo_arms(opts):
            what = f"k={arm.k}, acceptance {arm.acceptance:g}" if arm.speculative else "control"
            console.print(f"{arm.name:<{width}} ({kind}, {what}): {urls[arm.name]}")
    console.print(f"proxy:  {proxy}/v1  (OpenAI-compatible)")
    console.print(f"live page:  {proxy}/ui")
    console.print(f"metrics:    {proxy}/metrics")
    console.print(f"stats JSON: {proxy}/api/stats")
    console.print(
        f"load: Poisson {opts.rate:g} req/s for {opts.duration_s:g} s; Ctrl-C stops early "
        "and still writes the report"
    )


def _print_load(console: Console, loads: dict[str, ArmLoad], slowdown: float) -> None:
    """Where the load stands against what the emulated arms serve, by their model."""
    events = sum(load.events_per_s for load in loads.values())
    most = max(load.utilisation for load in loads.values())
    if set(loads) == set(SHORTHAND_ARMS):
        spec, base = loads[SHORTHAND_TREATMENT], loads[SHORTHAND_CONTROL]
        if slowdown > 1.0:
            console.print(
                f"overload: both arms' steps {slowdown:.1f}x slower, so the speculative arm gets "
                f"{spec.utilisation:.0%} and the baseline {base.utilisation:.0%} of what it "
                "serves (emulator model): the queues grow, and the diagnosis should say so"
            )
            return
        console.print(
            f"model: {spec.rate:g} req/s per arm is {spec.utilisation:.0%} of what the "
            f"speculative arm serves, {base.utilisation:.0%} of the baseline's; "
            f"{events:.0f} streamed events/s"
        )
    else:
        shares = ", ".join(
            f"{name} {load.rate:.3g} req/s, {load.utilisation:.0%}" for name, load in loads.items()
        )
        if slowdown > 1.0:
            console.print(
                f"overload: every arm's steps {slowdown:.1f}x slower ({shares} of what it "
                "serves, emulator model): the queues grow, and the diagnosis should say so"
            )
            return
        console.print(
            f"model: {shares} of what it serves; {events:.0f} streamed events/s", soft_wrap=True
        )
    if most >= 1.0:
        console.print("note: above what an arm serves: expect queueing, not a speedup")


@contextlib.contextmanager
def _sigint_sets(stop: asyncio.Event) -> Any:
    """Ctrl-C (and SIGTERM) set `stop` instead of killing the run, so the report is written."""
    loop = asyncio.get_running_loop()
    installed: list[signal.Signals] = []
    for sig in (signal.SIGINT, signal.SIGTERM):
        try:
            loop.add_signal_handler(sig, stop.set)
            installed.append(sig)
        except (NotImplementedError, RuntimeError, ValueError):  # not the main thread
            pass
    try:
        yield
    finally:
        for sig in installed:
            loop.remove_signal_handler(sig)


async def _model(session: aiohttp.ClientSession, proxy_url: str) -> str:
    async with session.get(proxy_url + "/v1/models") as resp:
        body = await resp.json(content_type=None)
    try:
        return str(body["data"][0]["id"])
    except (KeyError, IndexError, TypeError) as exc:
        raise ConfigError(f"the arms list no model at {proxy_url}/v1/models") from exc


def _latest(app: web.Application) -> StatsResult | None:
    provider = app.get(STATS)
    return provider() if provider is not None else None


async def _show(
    console: Console,
    app: web.Application,
    tally: ClientTally,
    load: asyncio.Task[list[ClientResult]],
    opts: DemoOptions,
) -> None:
    """Refresh the live view until the load task ends."""
    if console.is_terminal:
        with Live(render(_latest(app), tally), console=console, auto_refresh=False) as live:
            while not load.done():
                await asyncio.wait({load}, timeout=opts.refresh_s)
                live.update(render(_latest(app), tally), refresh=True)
        return
    last = time.monotonic()
    while not load.done():
        await asyncio.wait({load}, timeout=opts.refresh_s)
        if time.monotonic() - last >= opts.plain_every_s:
            last = time.monotonic()
            console.print(plain_line(_latest(app), tally), soft_wrap=True)


async def _final_stats(app: web.Application, interval_s: float) -> StatsResult | None:
    """One last stats run over every record, so the report and /api/stats agree.

    The load has stopped and the store is flushed. On memory:// the job runs here: it is
    stopped (no later run can replace the result) and runs once more; it publishes the result
    at /api/stats and appends it to the store's history, where the report finds it. Otherwise
    the proxy's stats process computes: the second result it stores after the flush comes from
    a tick that began after it, so it saw every record.
    """
    await app[STORE].flush()
    job = app.get(STATS_JOB)
    if job is not None:
        await job.close()
        return await job.run_once()
    flushed = time.time()
    seen: set[float] = set()
    deadline = time.monotonic() + 4 * interval_s + _FINAL_SLACK_S
    while time.monotonic() < deadline:
        latest = _latest(app)
        if latest is not None and latest["computed_at"] > flushed:
            seen.add(latest["computed_at"])
            if len(seen) >= 2:
                return latest
        await asyncio.sleep(0.1)
    log.warning(
        "demo: no result of the whole run within %.0f s; reporting the latest", 4 * interval_s
    )
    return _latest(app)


async def _write_report(
    app: web.Application, opts: DemoOptions, run_id: str, console: Console, stats_at: float | None
) -> Path | None:
    from specproxy.report.build import report_from_store

    store = app[STORE]
    await store.flush()
    out = Path(opts.out)
    console.print(f"writing the report to {out}/ ...")
    return await report_from_store(store, run_id=run_id, out_dir=out, stats_at=stats_at)
