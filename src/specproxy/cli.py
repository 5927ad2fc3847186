"""The `specproxy` command line: a thin table of subcommands, each in its package's `cli` module.

Every command takes `--log-level` and `--log-format`, and every flag's help shows its default
(`DefaultsFormatter`).

Each command module exposes `configure(parser)` to add its arguments and `run(args) -> int`.
Modules are imported lazily, so `specproxy --help` stays fast and one broken optional dependency
(asyncpg, grafana-client) cannot take down unrelated commands.
"""

from __future__ import annotations

import argparse
import faulthandler
import importlib
import sys
from collections.abc import Sequence

from specproxy import __version__
from specproxy.errors import SpecProxyError
from specproxy.logs import FORMATS, LEVELS, setup_logging

__all__ = ["COMMANDS", "DefaultsFormatter", "main"]

DESCRIPTION = """\
Is speculative decoding making your vLLM server faster? specproxy sits in front of two vLLM
servers, one with speculative decoding and one without, splits (or mirrors) live traffic between
them, records every request, and tells you the speedup with a confidence interval.

first steps:
  specproxy demo                       try it: emulated servers, load, live view, a report
  specproxy serve --baseline URL --speculative URL
                                       put it in front of your two servers
  specproxy stats                      the comparison so far, from the store
  specproxy report --out out/report    the HTML report with plots
  specproxy arms stop                  the kill switch: every request to the baseline
"""

EPILOG = "Run `specproxy COMMAND --help` for a command's options."

# name -> (module, one-line help)
COMMANDS: dict[str, tuple[str, str]] = {
    "serve": ("specproxy.serve", "run the A/B proxy in front of two vLLM servers"),
    "emulate": ("specproxy.emulator.cli", "run an emulated vLLM server (timing physics model)"),
    "demo": ("specproxy.demo.cli", "emulated arms + proxy + load + live view + report"),
    "bench": (
        "specproxy.bench.cli",
        "offline harness: drive endpoints directly or through the proxy",
    ),
    "ingest": (
        "specproxy.bench.ingest_cli",
        "store a `vllm bench serve --save-detailed` result as one arm of a run",
    ),
    "calibrate": (
        "specproxy.bench.calibrate_cli",
        "best (k, temperature) by E2E speedup over several bench --json files",
    ),
    "stats": ("specproxy.stats.cli", "compute the comparison once from a store"),
    "report": ("specproxy.report.cli", "write the HTML report with plots from a store"),
    "export": ("specproxy.store.cli", "export records as csv, parquet or jsonl"),
    "arms": (
        "specproxy.control.cli",
        "see or change a running proxy's split: weights, pause, the kill switch",
    ),
    "dashboards": ("specproxy.grafana.cli", "export or push the Grafana dashboards"),
    "deploy": (
        "specproxy.deploy.cli",
        "regenerate the Kubernetes manifests derived from other files",
    ),
    "vllm": ("specproxy.realvllm.cli", "build the tiny model and start real vLLM CPU servers"),
}


class DefaultsFormatter(argparse.RawDescriptionHelpFormatter):
    """Appends "(default: X)" to every option whose help does not state its default yet.

    On/off switches show nothing (off unless given); an option without a default says so only
    if its help does.
    """

    def _get_help_string(self, action: argparse.Action) -> str | None:
        text = action.help or ""
        if (
            not action.option_strings
            or "default" in text
            or action.default in (None, argparse.SUPPRESS)
            or isinstance(action, argparse._StoreConstAction | argparse._StoreTrueAction)
            or action.nargs == 0
        ):
            return action.help
        return f"{text} (default: %(default)s)".strip()


def _common_options() -> argparse.ArgumentParser:
    """Options every command takes (added to each subcommand)."""
    common = argparse.ArgumentParser(add_help=False)
    group = common.add_argument_group("logging")
    group.add_argument("--log-level", choices=LEVELS, default="info", help="log threshold")
    group.add_argument(
        "--log-format", choices=FORMATS, default="text", help="json: one JSON object per line"
    )
    return common


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The parser; only `command`'s module is imported and asked for its arguments."""
    parser = argparse.ArgumentParser(
        prog="specproxy",
        description=DESCRIPTION,
        epilog=EPILOG,
        formatter_class=DefaultsFormatter,
    )
    parser.add_argument("--version", action="version", version=f"specproxy {__version__}")
    parser.add_argument("-v", "--verbose", action="store_true", help="same as --log-level debug")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True, title="commands")
    common = _common_options()
    for name, (module_name, help_text) in COMMANDS.items():
        cmd = sub.add_parser(
            name,
            help=help_text,
            description=help_text,
            parents=[common],
            formatter_class=DefaultsFormatter,
        )
        if name == command:
            module = importlib.import_module(module_name)
            module.configure(cmd)
            cmd.set_defaults(_run=module.run)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    program = argv is None  # a program's run (not a test calling main)
    argv = list(sys.argv[1:] if argv is None else argv)
    command = next((a for a in argv if not a.startswith("-")), None)
    parser = build_parser(command if command in COMMANDS else None)
    args = parser.parse_args(argv)
    setup_logging("debug" if args.verbose else args.log_level, args.log_format)
    if program and not faulthandler.is_enabled():
        # a process killed by a signal (SIGBUS from a mapped file, SIGSEGV) leaves a traceback
        # on stderr instead of nothing (a program's run only: tests keep pytest's own)
        faulthandler.enable()
    try:
        code: int = args._run(args)
    except SpecProxyError as exc:
        print(f"specproxy: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    return code
