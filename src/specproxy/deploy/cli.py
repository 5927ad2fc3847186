"""`specproxy deploy generate [--check] [--grafana-url URL] [--runbook-base URL] [--rules-out F]`:
write (or check) the generated Kubernetes manifests, with the alerts' links pointed at your Grafana
and runbooks if asked (`manifests.AlertLinks`)."""

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
    parser.add_argument(
        "--grafana-url",
        default="",
        metavar="URL",
        help="Grafana's base URL (e.g. https://grafana.example.com): each alert's dashboard_url "
        "becomes absolute (default: the dashboard's path, /d/specproxy-ab)",
    )
    parser.add_argument(
        "--runbook-base",
        default=None,
        metavar="URL",
        help="the page serving docs/runbooks.md that each alert's runbook_url anchors into "
        "(default: the project's, specproxy.deploy.manifests.RUNBOOK_BASE)",
    )
    parser.add_argument(
        "--rules-out",
        type=Path,
        default=None,
        metavar="FILE",
        help="also write the Prometheus rule file with those links to FILE (for a Prometheus "
        "without the Operator)",
    )


def run(args: argparse.Namespace) -> int:
    try:
        from specproxy.deploy.manifests import RULES, RUNBOOK_BASE, AlertLinks, generate, rules_file
    except ImportError as exc:  # pragma: no cover - pyyaml is in the deploy and dev extras
        raise ConfigError(f"{exc}: install specproxy[deploy]") from exc
    root: Path = args.root
    moved = bool(args.grafana_url) or args.runbook_base is not None
    links = AlertLinks(args.grafana_url, args.runbook_base or RUNBOOK_BASE) if moved else None
    try:
        files = generate(root, links)
        rules_text = (root / RULES).read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"not a specproxy checkout ({root}): {exc}") from exc
    if args.rules_out is not None and not args.check:
        args.rules_out.write_text(rules_file(rules_text, links or AlertLinks()), encoding="utf-8")
        print(f"wrote {args.rules_out}")
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
