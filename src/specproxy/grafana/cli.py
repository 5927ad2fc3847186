"""`specproxy dashboards export|push`: write the generated dashboards to disk or into Grafana.

Both commands generate the dashboards from code at run time, so what is pushed is exactly what
`dashboards/` holds in the repository (a test keeps that file equal to the generator's output).
The Grafana token is read from the environment, never from the command line, where it would end
up in shell history and process listings.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from urllib.parse import urlsplit

from specproxy.errors import ConfigError
from specproxy.extras import require
from specproxy.grafana.dashboard import DASHBOARD_FILENAME, build_dashboard, dashboard_json

__all__ = ["configure", "run"]

DEFAULT_TOKEN_ENV = "GRAFANA_TOKEN"


def configure(parser: argparse.ArgumentParser) -> None:
    actions = parser.add_subparsers(dest="action", metavar="ACTION", required=True)
    export = actions.add_parser("export", help="write the dashboard JSON files into a folder")
    export.add_argument("--out", type=Path, required=True, help="folder to write into")
    push = actions.add_parser("push", help="save the dashboards into a Grafana folder")
    push.add_argument("--grafana-url", required=True, help="e.g. http://localhost:3000")
    push.add_argument(
        "--token-env",
        default=DEFAULT_TOKEN_ENV,
        help=f"environment variable holding a service-account token (default {DEFAULT_TOKEN_ENV})",
    )
    push.add_argument("--folder", default="specproxy", help="folder title (default specproxy)")
    push.add_argument("--folder-uid", default="specproxy", help="folder uid (default specproxy)")
    push.add_argument("--timeout", type=float, default=10.0, help="per-request timeout, seconds")


def run(args: argparse.Namespace) -> int:
    if args.action == "export":
        return _export(args.out)
    return _push(args)


def _export(out: Path) -> int:
    out.mkdir(parents=True, exist_ok=True)
    path = out / DASHBOARD_FILENAME
    path.write_text(dashboard_json(), encoding="utf-8")
    print(path)
    return 0


def _push(args: argparse.Namespace) -> int:
    require("grafana_client", "specproxy dashboards push")
    from specproxy.grafana.push import push_dashboards  # grafana-client is optional

    parts = urlsplit(args.grafana_url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ConfigError(f"--grafana-url must be an http(s) URL, got {args.grafana_url!r}")
    token = os.environ.get(args.token_env) or None
    if token is None and not parts.password:
        raise ConfigError(
            f"no Grafana credential: set {args.token_env} to a service-account token"
            " (or put user:password in --grafana-url)"
        )
    pushed = push_dashboards(
        [build_dashboard()],
        grafana_url=args.grafana_url,
        token=token,
        folder_title=args.folder,
        folder_uid=args.folder_uid,
        timeout_s=args.timeout,
    )
    for dashboard in pushed:
        print(f"{dashboard.uid} version {dashboard.version} {dashboard.url}")
    return 0
