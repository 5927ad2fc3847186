"""Grafana dashboards for specproxy: generated from the metric-name constants, exported or pushed.

`dashboard` builds the JSON model (pure), `push` uploads it with grafana-client, and `cli` is the
`specproxy dashboards` command, re-exported here because the CLI table names this package.
"""

from __future__ import annotations

from specproxy.grafana.cli import configure, run

__all__ = ["configure", "run"]
