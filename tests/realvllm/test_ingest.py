"""`specproxy ingest` on results `vllm bench serve --save-result --save-detailed` wrote against
the real speculative and baseline vLLM servers (vllm.benchmarks.serve's add_cli_args/main, run
by the vLLM venv's Python): every request lands in the store and the stats job compares them."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from specproxy.bench.ingest import records_from_vllm_bench
from specproxy.realvllm.model_dir import SERVED_MODEL_NAME, build_model_dir
from tests.realvllm.conftest import Engines

pytestmark = [pytest.mark.vllm, pytest.mark.timeout(900)]

PROMPTS = 40
_BENCH = """
import sys
from vllm.benchmarks.serve import add_cli_args, main
from vllm.utils.argparse_utils import FlexibleArgumentParser
parser = FlexibleArgumentParser()
add_cli_args(parser)
main(parser.parse_args(sys.argv[1:]))
"""


def vllm_bench_serve(python: str, url: str, out: Path, tokenizer: Path) -> dict[str, object]:
    """Run vLLM's own benchmark against `url`; return the JSON it saved."""
    argv = [
        "--backend", "openai", "--base-url", url, "--endpoint", "/v1/completions",
        "--model", SERVED_MODEL_NAME, "--tokenizer", str(tokenizer),
        "--dataset-name", "random", "--random-input-len", "16", "--random-output-len", "24",
        "--num-prompts", str(PROMPTS), "--max-concurrency", "2", "--ignore-eos",
        "--save-result", "--save-detailed", "--result-dir", str(out.parent),
        "--result-filename", out.name, "--disable-tqdm",
    ]  # fmt: skip
    done = subprocess.run(
        [python, "-c", _BENCH, *argv], capture_output=True, text=True, timeout=600, check=False
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    result: dict[str, object] = json.loads(out.read_text())
    return result


def test_ingest_real_vllm_bench_results(engines: Engines, tmp_path: Path) -> None:
    python = os.environ["SPECPROXY_VLLM_PYTHON"]
    tokenizer = build_model_dir()
    store = f"sqlite:///{tmp_path / 'ingest.db'}"
    for arm in ("speculative", "baseline"):
        out = tmp_path / f"{arm}.json"
        result = vllm_bench_serve(python, engines.urls[arm], out, tokenizer)
        keep = os.environ.get("SPECPROXY_KEEP_BENCH_RESULT")
        if keep:  # how the committed fixture was produced
            Path(keep, f"vllm_bench_serve_{arm}.json").write_text(out.read_text())
        records = records_from_vllm_bench(result, arm=arm, run_id="r")
        assert len(records) == PROMPTS
        assert all(r.status == 200 and r.output_tokens == 24 for r in records)  # ignore_eos
        assert all(r.ttft_s is not None and 0 < r.ttft_s < r.e2e_s for r in records)
        done = subprocess.run(
            [sys.executable, "-m", "specproxy", "ingest", str(out), "--arm", arm,
             "--run-id", "r", "--store", store],
            capture_output=True, text=True, timeout=120, check=False,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
        assert f"ingested {PROMPTS} requests as {arm}" in done.stdout

    def stats(*flags: str) -> dict[str, Any]:
        done = subprocess.run(
            [sys.executable, "-m", "specproxy", "stats", "--store", store, "--run-id", "r",
             "--json", "--resamples", "200", *flags],
            capture_output=True, text=True, timeout=300, check=False,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
        window: dict[str, Any] = json.loads(done.stdout)["results"]["all"]["all"]
        return window

    # Warm-up leaves out whole time units (of a second or more), so how many requests beyond the
    # first 20 per arm it takes depends on how fast the engine answered: at least 20.
    window = stats()
    total = {a: window["samples"][a] + window["excluded_warmup"][a] for a in window["samples"]}
    assert total == {"speculative": PROMPTS, "baseline": PROMPTS}
    assert all(n >= 20 for n in window["excluded_warmup"].values())
    # Without warm-up every request is a sample, and the comparison is made.
    window = stats("--warmup-requests", "0")
    assert window["samples"] == {"speculative": PROMPTS, "baseline": PROMPTS}
    assert window["metrics"]["e2e"]["speedup"]["median"]["status"] == "ok"
