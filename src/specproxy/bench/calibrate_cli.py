"""`specproxy calibrate FILE..`: calibration advice over several `specproxy bench --json` files.

A k sweep is one bench run per speculative configuration (restart the speculative server with
another num_speculative_tokens, run `specproxy bench ... --json kN.json`, repeat); this command
pools their blocks and names the best (k, temperature) by E2E median speedup with its CI, per
load level (`bench.calibration`). Files from before the calibration field (a bare list of
blocks) are read too.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from specproxy.bench.calibration import advise_sweep
from specproxy.errors import ConfigError

__all__ = ["configure", "read_blocks", "run"]


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("files", nargs="+", help="JSON written by specproxy bench --json")
    parser.add_argument("--json", metavar="FILE", help="also write the advice as JSON")


def read_blocks(paths: Sequence[str]) -> list[dict[str, Any]]:
    """Every block of every file, in order."""
    blocks: list[dict[str, Any]] = []
    for path in paths:
        try:
            data = json.loads(Path(path).read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            raise ConfigError(f"cannot read {path}: {exc}") from exc
        found = data.get("blocks") if isinstance(data, dict) else data
        if not isinstance(found, list) or not all(
            isinstance(b, dict) and {"run_id", "temperature"} <= b.keys() for b in found
        ):
            raise ConfigError(f"{path} is not a specproxy bench --json file")
        blocks.extend(found)
    return blocks


def run(args: argparse.Namespace) -> int:
    from specproxy.bench.cli import advice_lines

    advice = advise_sweep(read_blocks(args.files))
    for line in advice_lines(advice):
        print(line)
    if args.json:
        with open(args.json, "w", encoding="utf-8") as fh:
            json.dump([a.to_dict() for a in advice], fh, indent=2)
    return 0
