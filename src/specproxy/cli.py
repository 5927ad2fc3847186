"""The `specproxy` command line: a thin table of subcommands, each in its package's `cli` module.

Each command module exposes `configure(parser)` to add its arguments and `run(args) -> int`.
Modules are imported lazily, so `specproxy --help` stays fast and one broken optional dependency
(asyncpg, grafana-client) cannot take down unrelated commands.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import sys
from collections.abc import Sequence

from specproxy.errors import SpecProxyError

__all__ = ["COMMANDS", "main"]

# name -> (module, one-line help)
COMMANDS: dict[str, tuple[str, str]] = {
    "serve": ("specproxy.serve", "run the A/B proxy in front of two vLLM servers"),
    "emulate": ("specproxy.emulator.cli", "run an emulated vLLM server (timing physics model)"),
    "demo": ("specproxy.demo.cli", "emulated arms + proxy + load + live view + report"),
    "bench": (
        "specproxy.bench.cli",
        "offline harness: drive endpoints directly or through the proxy",
    ),
    "stats": ("specproxy.stats.cli", "compute the comparison once from a store"),
    "report": ("specproxy.report.cli", "write the HTML report with plots from a store"),
    "export": ("specproxy.store.cli", "export records as csv, parquet or jsonl"),
    "dashboards": ("specproxy.grafana.cli", "export or push the Grafana dashboards"),
    "deploy": (
        "specproxy.deploy.cli",
        "regenerate the Kubernetes manifests derived from other files",
    ),
    "vllm": ("specproxy.realvllm.cli", "build the tiny model and start real vLLM CPU servers"),
}


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The parser; only `command`'s module is imported and asked for its arguments."""
    parser = argparse.ArgumentParser(prog="specproxy", description=__doc__.splitlines()[0])
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name, (module_name, help_text) in COMMANDS.items():
        cmd = sub.add_parser(name, help=help_text, description=help_text)
        if name == command:
            module = importlib.import_module(module_name)
            module.configure(cmd)
            cmd.set_defaults(_run=module.run)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    command = next((a for a in argv if not a.startswith("-")), None)
    parser = build_parser(command if command in COMMANDS else None)
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    try:
        code: int = args._run(args)
    except SpecProxyError as exc:
        print(f"specproxy: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    return code
