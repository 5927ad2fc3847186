"""`specproxy bench` (`bench.cli`): flag checks, and the command end to end with --json."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from specproxy.bench import cli
from specproxy.errors import ConfigError
from tests.fake_openai import FakeOpenAI


def _args(**kw: object) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    cli.configure(parser)
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
        cli.run(_args(**kw))


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
        code = cli.run(
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
