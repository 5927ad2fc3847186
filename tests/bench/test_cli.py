"""`specproxy bench` (`bench.cli`): flag checks, and the command end to end with --json."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

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
        ({"url": "http://a", "rate_sweep": "1,x"}, "--rate-sweep"),
        ({"url": "http://a", "concurrency_sweep": "0"}, "> 0"),
        ({"url": "http://a", "concurrency_sweep": "1.5"}, "whole numbers"),
        ({"url": "http://a", "max_seconds": 0.0}, "--max-seconds"),
        ({"url": "http://a", "k": 0}, "--k"),
        ({"arm": ["a=http://a"]}, "two or more arms"),
        ({"arm": ["a=http://a", "b=http://b"]}, "name the control arm"),
        ({"arm": ["a=http://a", "b=http://b"], "control": "c"}, "names no --arm"),
        ({"arm": ["a=http://a", "a=http://b"], "control": "a"}, "given twice"),
        ({"arm": ["a b=http://a", "c=http://b"], "control": "c"}, "NAME=URL"),
        ({"arm": ["a=http://a"], "speculative": "http://b"}, "exactly one of"),
        ({"arm": ["lonely"]}, "exactly one of"),
        ({"url": "http://a", "arm": ["a", "b"]}, "one label"),
        ({"url": "http://a", "burstiness": 0.0}, "--burstiness"),
        ({"url": "http://a", "goodput": ["ttft=5"]}, "KEY:MS"),
        ({"url": "http://a", "dataset": "/no/such.jsonl"}, "neither a dataset name"),
        # arm names are the store's (records.ARM_NAME_PATTERN): lower-case first
        ({"arm": ["Base=http://a", "b=http://b"], "control": "b"}, "lower-case letter"),
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
    data = json.loads(out.read_text())
    (block,) = data["blocks"]
    # one arm: nothing compared, so the advice says it has no data (and names no setting)
    (advice,) = data["calibration"]
    assert advice["decision"] == "no_data" and advice["best"] is None
    assert block["k"] is None  # the fake exports no per-position counters and no --k was given
    assert block["run_id"] == "cli" and block["arms"][0]["arm"] == "speculative"
    assert block["arms"][0]["n"] == 12
    assert block["overhead"]["parse_p50_s"] > 0
    arm = block["arms"][0]
    # throughput as vllm bench serve prints it: all arms over the block's wall time, each arm
    # over its own duration (first send to last byte), which lies within the block
    assert block["throughput"]["requests_per_s"] == pytest.approx(12 / block["wall_s"])
    assert 0 < arm["duration_s"] <= block["wall_s"]
    assert arm["throughput"]["output_tokens_per_s"] == pytest.approx(
        arm["output_tokens"] / arm["duration_s"]
    )
    assert arm["output_tokens"] > 0
    # the JSON's acceptance is the table's: a value always has its source
    assert (arm["acceptance_rate"] is None) == (arm["acceptance_source"] is None)
    assert block["speedups"] == {}  # one arm: nothing to compare


def test_tables_print_cis_and_no_p99_without_its_samples() -> None:
    from rich.console import Console

    from specproxy.bench.harness import BlockResult
    from specproxy.bench.summary import ArmSummary
    from specproxy.records import SHORTHAND_CONTROL, SHORTHAND_TREATMENT, Arm

    def arm(which: Arm, n: int, acceptance: float | None, duration: float) -> ArmSummary:
        return ArmSummary(
            which, n, 0, 0.1, 0.3, 0.01, 0.002, 2.5, acceptance, 3.0, 1000, 5000, duration
        )

    speedup: dict[str, dict[str, dict[str, Any]]] = {
        "e2e": {
            "median": {"status": "ok", "estimate": 2.16, "lower": 1.89, "upper": 2.42},
            "p99": {"status": "insufficient", "n_needed": {"speculative": 268, "baseline": 0}},
        }
    }
    block = BlockResult(
        run_id="r",
        temperature=0.0,
        arms=[arm(SHORTHAND_TREATMENT, 100, None, 5.0), arm(SHORTHAND_CONTROL, 400, None, 10.0)],
        overhead=None,
        engine_acceptance={"speculative": 0.61, "baseline": None},
        wall_s=10.0,
        speedups=speedup,
        control="baseline",
        comparisons={"speculative": speedup},
    )
    console = Console(record=True, width=160)
    console.print(cli._block_table(block))
    for line in (*cli._speedup_lines(block), *cli._throughput_lines(block)):
        console.print(line)
    text = console.export_text()
    assert "needs 268 more" in text and "300.0 ms" in text  # P99 only for the arm with 400
    assert "E2E speedup (baseline / speculative, 95% CI): median 2.16x [1.89, 2.42]" in text
    assert "p99: needs 268 more per arm" in text
    assert "61.0%" in text  # the engine's acceptance, as the JSON gives it
    assert "throughput all: 50.00 req/s, 1000.0 output tok/s, 1200.0 total tok/s" in text
    # each arm over its own duration: the speculative arm finished its 100 in 5 s
    assert "throughput speculative: 20.00 req/s, 1000.0 output tok/s" in text
    assert "throughput baseline: 40.00 req/s, 500.0 output tok/s" in text
    data = cli._jsonable(block)
    assert data["arms"][0]["acceptance_rate"] == 0.61
    assert data["arms"][0]["acceptance_source"] == "engine"


def test_named_arms_with_the_specbench_set_save_a_vllm_result(tmp_path: Path) -> None:
    """`--arm NAME=URL` x3 with `--control`, `--dataset specbench`, `--goodput` and
    `--save-result`: every arm gets its share, each prompt's category travels in its header,
    the summary counts requests per category, and the result file uses vLLM's names."""
    import asyncio
    import threading

    from aiohttp import web

    fakes = {name: FakeOpenAI() for name in ("base", "eagle", "ngram")}
    ready = threading.Event()
    holder: dict[str, object] = {}

    def serve() -> None:
        loop = asyncio.new_event_loop()
        runners = []
        for name, fake in fakes.items():
            runner = web.AppRunner(fake.app(), access_log=None)
            loop.run_until_complete(runner.setup())
            loop.run_until_complete(web.TCPSite(runner, "127.0.0.1", 0).start())
            holder[name] = runner.addresses[0][1]
            runners.append(runner)
        holder["loop"] = loop
        ready.set()
        loop.run_forever()
        for runner in runners:
            loop.run_until_complete(runner.cleanup())
        loop.close()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    assert ready.wait(10)
    out = tmp_path / "summary.json"
    try:
        code = cli.run(
            _args(
                arm=[f"{n}=http://127.0.0.1:{holder[n]}" for n in fakes],
                control="base",
                dataset="specbench",
                requests=48,
                concurrency=2,
                warmup="0",
                store="none",
                goodput=["e2el:60000"],
                save_result=True,
                result_dir=str(tmp_path / "results"),
                result_filename="run.json",
                json=str(out),
            )
        )
    finally:
        loop = holder["loop"]
        assert isinstance(loop, asyncio.AbstractEventLoop)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
    assert code == 0
    assert [len(f.bodies) for f in fakes.values()] == [16, 16, 16]
    for fake in fakes.values():
        categories = {h["x-specproxy-category"] for h in fake.headers}
        assert categories <= {
            "coding",
            "math",
            "writing",
            "qa",
            "summarization",
            "translation",
            "reasoning",
            "extraction",
        }
    (block,) = json.loads(out.read_text())["blocks"]
    assert [a["arm"] for a in block["arms"]] == ["base", "eagle", "ngram"]
    assert block["control"] == "base" and sorted(block["comparisons"]) == ["eagle", "ngram"]
    assert block["speedups"] == {}  # two treatments: see comparisons
    for arm, fake in zip(block["arms"], fakes.values(), strict=True):
        sent: dict[str, int] = {}
        for h in fake.headers:
            sent[h["x-specproxy-category"]] = sent.get(h["x-specproxy-category"], 0) + 1
        assert arm["categories"] == dict(sorted(sent.items()))
        assert arm["good"] == 16  # every request well within a minute
    saved = json.loads((tmp_path / "results" / "run.json").read_text())
    assert saved["model_id"] == "fake-model" and saved["request_rate"] == "inf"
    assert saved["max_concurrency"] == 2 and saved["burstiness"] == 1.0
    (saved_block,) = saved["blocks"]
    for name in fakes:
        result = saved_block["arms"][name]
        assert result["completed"] == 16 and result["failed"] == 0
        assert result["request_goodput"] == pytest.approx(result["request_throughput"])
        assert result["total_output_tokens"] == sum(b["max_tokens"] for b in fakes[name].bodies)
