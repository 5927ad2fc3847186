"""`specproxy emulate`: serve one emulated vLLM arm, or (`--predict`) print modelled speedups.

The flags mirror vLLM's where one exists (`--served-model-name`, `--speculative-config`,
`--enable-per-request-metrics`, ...), so a command line for the emulator reads like one for vLLM.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging

from aiohttp import web

from specproxy.emulator.config import EmulatorConfig
from specproxy.emulator.model import simulate
from specproxy.emulator.server import VLLM_VERSION, create_emulator_app
from specproxy.errors import ConfigError

__all__ = ["config_from_args", "configure", "run"]

log = logging.getLogger(__name__)


def configure(parser: argparse.ArgumentParser) -> None:
    d = EmulatorConfig()
    add = parser.add_argument
    add("--host", default="127.0.0.1", help="address to listen on")
    add("--port", type=int, default=8001, help="port to listen on (0: any free one)")
    add(
        "--served-model-name",
        dest="model",
        default=d.model,
        help="model id it serves (vLLM's flag)",
    )
    add("--speculative", action="store_true", help="emulate the speculative arm")
    add("--speculative-config", default=None,
        help='vLLM-style JSON, e.g. {"num_speculative_tokens": 4}')  # fmt: skip
    add("--num-speculative-tokens", type=int, default=d.num_speculative_tokens, help="k")
    add("--acceptance", type=float, default=d.acceptance, help="mean draft acceptance alpha")
    add("--acceptance-spread", type=float, default=d.acceptance_spread,
        help="std-dev of the per-request acceptance rate")  # fmt: skip
    add("--draft-cost-ratio", type=float, default=d.draft_cost_ratio, help="c")
    add("--base-step-s", type=float, default=d.base_step_s,
        help="seconds of one target forward pass with a memory-bound batch")  # fmt: skip
    add("--free-batch-tokens", type=int, default=d.free_batch_tokens,
        help="batched tokens a forward absorbs at no extra cost (the roofline knee)")  # fmt: skip
    add("--batch-slope", type=float, default=d.batch_slope,
        help="extra cost per token beyond the knee, as a share of a step")  # fmt: skip
    add("--prefill-per-token-s", type=float, default=d.prefill_per_token_s,
        help="prefill seconds per prompt token")  # fmt: skip
    add("--warmup-requests", type=int, default=d.warmup_requests,
        help="sequences after a (re)start that run slower")  # fmt: skip
    add("--warmup-factor", type=float, default=d.warmup_factor,
        help="slowdown of the very first step after a (re)start")  # fmt: skip
    add("--slowdown", type=float, default=d.slowdown, help="multiplies every step")
    add("--time-scale", type=float, default=d.time_scale,
        help="multiplies every duration (< 1 runs faster than real time)")  # fmt: skip
    add("--seed", type=int, default=d.seed, help="seed of acceptance and token draws")
    add("--enable-per-request-metrics", dest="per_request_metrics", action="store_true",
        help="vLLM's flag: a metrics block in each response")  # fmt: skip
    add("--per-request-spec-decode-metrics", dest="per_request_spec_metrics",
        choices=("none", "summary"), default=d.per_request_spec_metrics,
        help="vLLM's flag: per-request speculative-decoding counts")  # fmt: skip
    add("--metrics-version", choices=("v1", "v0"), default=d.metrics_version,
        help="which vLLM engine's /metrics names to export")  # fmt: skip
    add("--max-model-len", type=int, default=d.max_model_len,
        help="longest prompt + output, tokens (vLLM's flag)")  # fmt: skip
    add("--max-num-seqs", type=int, default=d.max_num_seqs,
        help="sequences batched at once; the rest wait (vLLM's flag)")  # fmt: skip
    add("--predict", action="store_true",
        help="print simulated speedups at several loads beside the formula; exit")  # fmt: skip


def config_from_args(args: argparse.Namespace) -> EmulatorConfig:
    fields = {f.name for f in dataclasses.fields(EmulatorConfig)}
    values = {k: v for k, v in vars(args).items() if k in fields}
    if args.speculative_config:
        try:
            spec = json.loads(args.speculative_config)
        except json.JSONDecodeError as exc:
            raise ConfigError(f"--speculative-config is not JSON: {exc}") from exc
        if not isinstance(spec, dict):
            raise ConfigError("--speculative-config must be a JSON object")
        values["speculative"] = True
        if "num_speculative_tokens" in spec:
            values["num_speculative_tokens"] = spec["num_speculative_tokens"]
    return EmulatorConfig(**values)


def _predict(cfg: EmulatorConfig) -> None:
    spec = dataclasses.replace(cfg.physics(), speculative=True, warmup_requests=0)
    base = dataclasses.replace(spec, speculative=False)
    knobs = f"alpha={spec.acceptance}, k={spec.num_speculative_tokens}, c={spec.draft_cost_ratio}"
    print(f"formula (Leviathan): {spec.expected_speedup():.3f}x  ({knobs})")
    print(f"{'concurrency':>11} {'TPOT speedup':>13} {'E2E speedup':>12}")
    for concurrency in (1, 4, 16, 32, 64, 128):
        requests = max(32, 2 * concurrency)
        s = simulate(spec, concurrency=concurrency, requests=requests, seed=cfg.seed)
        b = simulate(base, concurrency=concurrency, requests=requests, seed=cfg.seed)
        print(f"{concurrency:>11} {b.tpot_s / s.tpot_s:>12.3f}x {b.e2e_s / s.e2e_s:>11.3f}x")


def run(args: argparse.Namespace) -> int:
    cfg = config_from_args(args)
    if args.predict:
        _predict(cfg)
        return 0
    arm = "speculative" if cfg.speculative else "baseline"
    log.info("emulated vLLM %s (%s arm) on http://%s:%d", VLLM_VERSION, arm, args.host, args.port)
    web.run_app(
        create_emulator_app(cfg), host=args.host, port=args.port, print=None, access_log=None
    )
    return 0
