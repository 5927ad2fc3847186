"""`specproxy vllm`: build the tiny model, start both real vLLM CPU servers, wait for Ctrl-C."""

from __future__ import annotations

import argparse
import signal
import sys
import time
from pathlib import Path

from specproxy.realvllm.launcher import DEFAULT_STARTUP_TIMEOUT_S, VllmPair, resolve_vllm_python
from specproxy.realvllm.model_dir import SERVED_MODEL_NAME

__all__ = ["configure", "run"]


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--vllm-python",
        help="the vLLM venv's python (default: $SPECPROXY_VLLM_PYTHON, else .venv-vllm/bin/python)",
    )
    parser.add_argument("--host", default="127.0.0.1", help="address both servers listen on")
    parser.add_argument("--speculative-port", type=int, default=0, help="0 picks a free port")
    parser.add_argument("--baseline-port", type=int, default=0, help="0 picks a free port")
    parser.add_argument("--log-dir", default="vllm-logs", help="where the servers' logs go")
    parser.add_argument("--cache-dir", help="model cache (default: ~/.cache/specproxy)")
    parser.add_argument(
        "--startup-timeout", type=float, default=DEFAULT_STARTUP_TIMEOUT_S, help="seconds"
    )


def run(args: argparse.Namespace) -> int:
    pair = VllmPair(
        resolve_vllm_python(args.vllm_python),
        log_dir=Path(args.log_dir),
        cache_dir=Path(args.cache_dir) if args.cache_dir else None,
        host=args.host,
        speculative_port=args.speculative_port,
        baseline_port=args.baseline_port,
        startup_timeout_s=args.startup_timeout,
    )
    previous = signal.signal(signal.SIGTERM, _raise_keyboard_interrupt)  # stop servers on TERM
    try:
        return _serve_until_interrupted(pair, args.log_dir)
    finally:
        signal.signal(signal.SIGTERM, previous)


def _serve_until_interrupted(pair: VllmPair, log_dir: str) -> int:
    print(f"starting vLLM servers (logs in {log_dir}/); this takes 1-3 minutes on 2 cores")
    sys.stdout.flush()
    with pair:
        print(f"speculative: {pair.speculative_url}  (model {SERVED_MODEL_NAME})")
        print(f"baseline:    {pair.baseline_url}")
        print(f"ready after {pair.startup_s:.0f} s; proxy them with:")
        print(
            f"  specproxy serve --speculative {pair.speculative_url} --baseline {pair.baseline_url}"
        )
        print("Ctrl-C stops both servers.")
        sys.stdout.flush()
        try:
            while all(s.running for s in pair.servers.values()):
                time.sleep(1.0)
        except KeyboardInterrupt:
            print("stopping vLLM servers")
            return 0
        dead = [str(s.arm) for s in pair.servers.values() if not s.running]
        print(f"vLLM server(s) exited unexpectedly: {', '.join(dead)}", file=sys.stderr)
        return 1


def _raise_keyboard_interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt
