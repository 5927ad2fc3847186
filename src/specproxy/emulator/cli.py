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
    add("--host", default="127.0.0.1")
    add("--port", type=int, default=8001)
    add("--served-model-name", dest="model", default=d.model)
    add("--speculative", action="store_true", help="emulate the speculative arm")
    add("--speculative-config", default=None,
        help='vLLM-style JSON, e.g. {"num_speculative_tokens": 4}')  # fmt: skip
    add("--num-speculative-tokens", type=int, default=d.num_speculative_tokens, help="k")
    add("--acceptance", type=float, default=d.acceptance, help="mean draft acceptance alpha")
    add("--acceptance-spread", type=float, default=d.acceptance_spread)
    add("--draft-cost-ratio", type=float, default=d.draft_cost_ratio, help="c")
    add("--base-step-s", type=float, default=d.base_step_s)
    add("--free-batch-tokens", type=int, default=d.free_batch_tokens)
    add("--batch-slope", type=float, default=d.batch_slope)
    add("--prefill-per-token-s", type=float, default=d.prefill_per_token_s)
    add("--warmup-requests", type=int, default=d.warmup_requests)
    add("--warmup-factor", type=float, default=d.warmup_factor)
    add("--slowdown", type=float, default=d.slowdown)
    add("--time-scale", type=float, default=d.time_scale)
    add("--seed", type=int, default=d.seed)
    add("--enable-per-request-metrics", dest="per_request_metrics", action="store_true")
    add("--per-request-spec-decode-metrics", dest="per_request_spec_metrics",
        choices=("none", "summary"), default=d.per_request_spec_metrics)  # fmt: skip
    add("--metrics-version", choices=("v1", "v0"), default=d.metrics_version)
    add("--max-model-len", type=int, default=d.max_model_len)
    add("--max-num-seqs", type=int, default=d.max_num_seqs)
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
