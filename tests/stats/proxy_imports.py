"""Run a proxy in this fresh process and report which of its modules imported numpy, scipy or
OpenTelemetry (traces are off).

Started by tests/stats/test_context.py as `python -m tests.stats.proxy_imports STORE_URL COMPUTE`
(a process of its own: the test process has numpy loaded already). Before anything of specproxy
is imported it wraps `__import__`, then builds `create_app(cfg)` with that store, serves it on
port 0 in front of an upstream in this same process (plain aiohttp, no numpy), sends plain and
streaming requests, reads /api/stats, /ui and /metrics, waits for the store to take the records
and prints one JSON object: every (importing module, imported module) of those, and
whether each is in `sys.modules` at the end.
"""

from __future__ import annotations

import builtins
import sys
from typing import Any

IMPORTS: list[tuple[str, str]] = []
_real_import = builtins.__import__
_HEAVY = ("numpy", "scipy", "opentelemetry")  # the last: traces are off here


def _watching_import(name: str, globals: Any = None, *args: Any, **kwargs: Any) -> Any:
    importer = (globals or {}).get("__name__", "?")
    top = name.split(".")[0]
    # (a `from numpy import x` also calls back in from importlib's own frames: not an importer)
    if top in _HEAVY and importer.split(".")[0] not in (*_HEAVY, "importlib"):
        IMPORTS.append((importer, name))
    return _real_import(name, globals, *args, **kwargs)


builtins.__import__ = _watching_import

import asyncio  # noqa: E402 - after the hook, on purpose
import json  # noqa: E402

from aiohttp import ClientSession, web  # noqa: E402

from specproxy.app import create_app  # noqa: E402
from specproxy.appkeys import STORE  # noqa: E402
from specproxy.config import Config, StatsConfig, StoreConfig  # noqa: E402
from tests.fake_openai import FakeOpenAI  # noqa: E402


async def main(store_url: str, compute: str, spill: str) -> dict[str, Any]:
    upstream = web.AppRunner(FakeOpenAI(model="m").app())
    await upstream.setup()
    site = web.TCPSite(upstream, "127.0.0.1", 0)
    await site.start()
    arm = f"http://127.0.0.1:{upstream.addresses[0][1]}"
    cfg = Config(
        baseline_url=arm,
        speculative_url=arm,
        store=StoreConfig(url=store_url, spill_path=spill, flush_interval_s=0.1),
        stats=StatsConfig(interval_s=0.2, compute=compute),  # type: ignore[arg-type]
    )
    app = create_app(cfg)
    proxy = web.AppRunner(app)
    await proxy.setup()
    proxy_site = web.TCPSite(proxy, "127.0.0.1", 0)
    await proxy_site.start()
    url = f"http://127.0.0.1:{proxy.addresses[0][1]}"
    statuses: dict[str, int] = {}
    try:
        async with ClientSession() as session:
            body = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
            for i in range(40):
                chat = {**body, "max_tokens": 8, "stream": i % 2 == 0}
                async with session.post(url + "/v1/chat/completions", json=chat) as resp:
                    await resp.read()
                    statuses[f"chat {resp.status}"] = statuses.get(f"chat {resp.status}", 0) + 1
            await app[STORE].flush()
            await asyncio.sleep(1.0)  # a few follower intervals
            for path in ("/api/stats", "/ui", "/api/stats/history", "/metrics"):
                async with session.get(url + path) as resp:
                    await resp.read()
                    statuses[path] = resp.status
    finally:
        await proxy.cleanup()
        await upstream.cleanup()
    return {
        "imports": sorted(set(IMPORTS)),
        "loaded": {name: name in sys.modules for name in _HEAVY},
        "statuses": statuses,
    }


if __name__ == "__main__":
    report = asyncio.run(main(sys.argv[1], sys.argv[2], sys.argv[3]))
    print(json.dumps(report))
