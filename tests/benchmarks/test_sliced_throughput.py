"""The sliced throughput client (`benchmarks/sliced_throughput.py`): its schedule, its paired
per-cycle statistics and its accounting of answers. No rate is asserted, only structure."""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable

from aiohttp import web
from aiohttp.test_utils import TestServer

from benchmarks import sliced_throughput as st


def test_every_cycle_gives_every_target_one_slice() -> None:
    order = st.schedule(3, 50)
    assert len(order) == 150
    cycles = [sorted(order[i : i + 3]) for i in range(0, 150, 3)]
    assert all(c == [0, 1, 2] for c in cycles)
    assert len({tuple(order[i : i + 3]) for i in range(0, 150, 3)}) > 1  # the order changes


def test_summarize_pairs_rates_and_cpu_within_each_cycle() -> None:
    names = ["bare", "ours"]
    order = [0, 1, 1, 0, 0, 1]  # three cycles
    counts = [100, 120, 60, 50, 100, 120]  # the second cycle ran at half speed: same ratio
    totals = [110, 130, 55, 65, 110, 130]  # per cycle, per target (bare, ours)
    cpu = [[0.0, 0.0], [0.1, 0.1], [0.2, 0.2], [0.3, 0.3]]  # 0.1 CPU-s each per cycle
    pairs = [("ours", "bare")]
    out = st.summarize(names, order, counts, totals, cpu, 0.5, 0, pairs)
    assert out["cycles"] == 3
    assert out["pairs"]["ours/bare"]["rps"][0] == 1.2
    assert out["bare"]["rps"] == 200.0
    assert out["ours"]["per_cpu_s"] == 1300.0
    assert round(out["pairs"]["ours/bare"]["per_cpu_s"][0], 6) == round(130 / 110, 6)
    assert st.summarize(names, order, counts, totals, cpu, 0.5, 2, pairs)["cycles"] == 1


def test_pairs_compare_with_bare_and_across_concurrency() -> None:
    assert st.pairs_of(["bare", "after"], [32, 128]) == [
        ("after@c32", "bare@c32"),
        ("after@c128", "bare@c128"),
        ("bare@c128", "bare@c32"),
        ("after@c128", "after@c32"),
    ]
    assert st.pairs_of(["bare", "after"], [32]) == [("after@c32", "bare@c32")]


async def test_answers_are_counted_in_their_targets_slices_only() -> None:
    served = {"a": 0, "b": 0}

    def handler(name: str) -> Callable[[web.Request], Awaitable[web.Response]]:
        async def answer(request: web.Request) -> web.Response:
            await request.read()
            served[name] += 1
            return web.json_response({"ok": True})

        return answer

    app = web.Application()
    app.router.add_post("/a", handler("a"))
    app.router.add_post("/b", handler("b"))
    async with TestServer(app, host="127.0.0.1", port=0) as server:
        assert server.port is not None
        targets = [(server.port, "/a", 2), (server.port, "/b", 2)]
        order = st.schedule(2, 3)
        start = time.time() + 0.2
        got = await st.drive(targets, False, order, start, slice_s=0.05, settle_s=0.01)
    counts, totals = got[: len(order)], got[len(order) :]
    assert len(totals) == len(order)
    for k, target in enumerate(order):  # a slice's window counts only its target's answers
        cycle = k - k % 2
        assert counts[k] <= totals[cycle + target]
    assert sum(totals) <= served["a"] + served["b"]
    assert sum(totals[t] for t in range(0, len(order), 2)) <= served["a"]
