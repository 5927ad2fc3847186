"""The bench harness: warm-up rule, per-arm summary, a direct A/B sweep into a store, CLI errors."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import pytest
from pytest_aiohttp import AiohttpServer
from rich.console import Console

from specproxy import bench
from specproxy.bench.summary import harness_overhead, summarise
from specproxy.bench.warmup import is_stable, per_token_latency
from specproxy.config import StoreConfig
from specproxy.errors import ConfigError
from specproxy.loadgen import ClientResult, Target
from specproxy.records import Arm
from specproxy.store import open_store
from tests.fake_openai import FakeOpenAI


def test_warmup_rule() -> None:
    cold = [10.0] * 10 + [1.0] * 10
    assert not is_stable(cold, window=10)  # the first window was slow
    assert is_stable([*cold, *([1.02] * 10)], window=10)  # two warm windows agree
    assert not is_stable([1.0] * 19, window=10)  # not enough data yet
    assert per_token_latency(2.0, 100) == pytest.approx(0.02)
    assert per_token_latency(2.0, None) == 2.0
    with pytest.raises(ValueError, match="window"):
        is_stable([1.0], window=0)


def _result(arm: Arm, e2e_ms: float, *, ok: bool = True) -> ClientResult:
    return ClientResult(
        index=0,
        arm=arm,
        t_start=0.0,
        status=200 if ok else 500,
        e2e_ns=int(e2e_ms * 1e6),
        temperature=0.0,
        ttft_ns=int(e2e_ms * 1e5),
        n_events=4,
        output_tokens=9,
        parse_ns=10_000,
        error_kind=None if ok else "http_5xx",
    )


def test_summary_per_arm() -> None:
    results = [_result(Arm.BASELINE, ms) for ms in (100, 200, 300)]
    results += [_result(Arm.SPECULATIVE, ms) for ms in (50, 60)]
    results.append(_result(Arm.SPECULATIVE, 1, ok=False))
    spec, base = summarise(results)
    assert spec.arm is Arm.SPECULATIVE and spec.n == 2 and spec.errors == 1
    assert base.e2e_p50_s == pytest.approx(0.2)
    assert base.tpot_p50_s == pytest.approx(0.2 * 0.9 / 8)
    assert spec.tokens_per_event == pytest.approx(9 / 4)
    overhead = harness_overhead(results)
    assert overhead is not None
    assert overhead.parse_p50_s == pytest.approx(1e-5)
    assert overhead.parse_share == pytest.approx(1e-5 / 0.1)


async def test_direct_ab_sweep_writes_store(aiohttp_server: AiohttpServer, tmp_path: Path) -> None:
    spec, base = FakeOpenAI(acceptance=0.8), FakeOpenAI(acceptance=0.0)
    spec_url = str((await aiohttp_server(spec.app())).make_url("")).rstrip("/")
    base_url = str((await aiohttp_server(base.app())).make_url("")).rstrip("/")
    url = f"sqlite:///{tmp_path / 'bench.db'}"
    blocks = await bench.run_bench(
        [Target(spec_url, Arm.SPECULATIVE), Target(base_url, Arm.BASELINE)],
        prompts_path=None,
        model=None,  # discovered from GET /v1/models
        requests=40,
        concurrency=4,
        rate=None,
        warmup=6,
        temperatures=[0.0, 0.7],
        endpoint="chat.completions",
        stream=True,
        max_tokens=8,
        store_url=url,
        run_id="b",
        seed=1,
        console=Console(quiet=True),
    )
    assert [b.run_id for b in blocks] == ["b-t0", "b-t0.7"]
    assert len(spec.bodies) + len(base.bodies) == 6 + 2 * 40  # warm-up is sent, not recorded
    assert {b["temperature"] for b in spec.bodies[6:] + base.bodies[6:]} <= {0.0, 0.7}
    assert all(b["model"] == "fake-model" for b in spec.bodies)
    # Acceptance per temperature from the arm's /metrics counter deltas.
    assert blocks[1].engine_acceptance["speculative"] == pytest.approx(0.8, abs=0.01)

    store = open_store(StoreConfig(url=url))
    await store.start()
    try:
        for block in blocks:
            arrays = await store.read_arrays(run_id=block.run_id, columns=["e2e_s", "status"])
            counts = {arm: len(a["e2e_s"]) for arm, a in arrays.items()}
            assert sum(counts.values()) == 40
            by_arm = {s.arm: s for s in block.arms}
            for arm, a in arrays.items():
                assert by_arm[arm].n == counts[arm]
                assert by_arm[arm].e2e_p50_s == pytest.approx(float(np.median(a["e2e_s"])))
    finally:
        await store.close()


async def test_open_loop_through_a_proxy_records_nothing(aiohttp_server: AiohttpServer) -> None:
    fake = FakeOpenAI()
    url = str((await aiohttp_server(fake.app())).make_url("")).rstrip("/")
    blocks = await bench.run_bench(
        [Target(url, None)],
        prompts_path=None,
        model="m",
        requests=10,
        concurrency=1,
        rate=200.0,
        warmup=None,  # auto: windows of 10 until stable
        temperatures=[0.0],
        endpoint="completions",
        stream=False,
        max_tokens=4,
        store_url=None,
        run_id="p",
        seed=0,
        console=Console(quiet=True),
    )
    assert len(fake.bodies) >= 20 + 10  # at least two warm-up windows
    (summary,) = blocks[0].arms
    assert summary.arm is None and summary.n == 10


def _args(**kw: object) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    bench.configure(parser)
    args = parser.parse_args([])
    for key, value in kw.items():
        setattr(args, key, value)
    return args


@pytest.mark.parametrize(
    ("kw", "message"),
    [
        ({}, "exactly one of"),
        ({"url": "http://a", "proxy": "http://b"}, "exactly one of"),
        ({"speculative": "http://a"}, "go together"),
        ({"url": "http://a", "temperatures": "0,x"}, "--temperatures"),
        ({"url": "http://a", "temperatures": "3"}, r"\[0, 2\]"),
        ({"url": "http://a", "warmup": "some"}, "--warmup"),
        ({"url": "http://a", "requests": 0}, "--requests"),
        ({"url": "http://a", "rate": -1.0}, "--rate"),
    ],
)
def test_bad_arguments(kw: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        bench.run(_args(**kw))


def test_cli_json_summary(tmp_path: Path) -> None:
    """The CLI end to end against a fake in a thread, writing the JSON summary."""
    import asyncio
    import threading

    from aiohttp import web

    fake = FakeOpenAI()
    ready = threading.Event()
    holder: dict[str, object] = {}

    def serve() -> None:
        loop = asyncio.new_event_loop()
        runner = web.AppRunner(fake.app())
        loop.run_until_complete(runner.setup())
        site = web.TCPSite(runner, "127.0.0.1", 0)
        loop.run_until_complete(site.start())
        holder["port"] = runner.addresses[0][1]
        holder["loop"] = loop
        ready.set()
        loop.run_forever()
        loop.run_until_complete(runner.cleanup())
        loop.close()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    assert ready.wait(10)
    out = tmp_path / "summary.json"
    try:
        code = bench.run(
            _args(
                url=f"http://127.0.0.1:{holder['port']}",
                arm="speculative",
                requests=12,
                concurrency=2,
                warmup="2",
                store=f"sqlite:///{tmp_path / 'cli.db'}",
                run_id="cli",
                json=str(out),
            )
        )
    finally:
        loop = holder["loop"]
        assert isinstance(loop, asyncio.AbstractEventLoop)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
    assert code == 0
    (block,) = json.loads(out.read_text())
    assert block["run_id"] == "cli" and block["arms"][0]["arm"] == "speculative"
    assert block["arms"][0]["n"] == 12
    assert block["overhead"]["parse_p50_s"] > 0
