"""`specproxy deploy generate [--check]`: write (or check) the generated Kubernetes manifests."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from specproxy.errors import ConfigError

__all__ = ["configure", "run"]


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("action", choices=["generate"], help="generate the derived manifests")
    parser.add_argument(
        "--root", type=Path, default=Path("."), help="repository root (default: the current dir)"
    )
    parser.add_argument(
        "--check", action="store_true", help="write nothing; exit 1 if a file is out of date"
    )


def run(args: argparse.Namespace) -> int:
    try:
        from specproxy.deploy.manifests import generate
    except ImportError as exc:  # pragma: no cover - pyyaml is in the deploy and dev extras
        raise ConfigError(f"{exc}: install specproxy[deploy]") from exc
    root: Path = args.root
    try:
        files = generate(root)
    except OSError as exc:
        raise ConfigError(f"not a specproxy checkout ({root}): {exc}") from exc
    stale = [p for p, text in files.items() if _read(root / p) != text]
    for path in stale:
        if args.check:
            print(f"out of date: {path}", file=sys.stderr)
        else:
            (root / path).write_text(files[path], encoding="utf-8")
            print(f"wrote {path}")
    return 1 if args.check and stale else 0


def _read(path: Path) -> str | None:
    try:
        return path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return None
