"""Optional dependencies: what each extra of `pip install specproxy[...]` brings, and the one
error a command gives when its extra is missing.

`pip install specproxy` is the proxy and the statistics (aiohttp, numpy, scipy, ...). The rest is
opt-in: `specproxy[report]` (matplotlib: `specproxy report` and the demo's final report),
`specproxy[parquet]` (pyarrow: `specproxy export --format parquet`), `specproxy[postgres]`
(asyncpg), `specproxy[grafana]` (pushing dashboards), `specproxy[otel]` (OpenTelemetry traces).
"""

from __future__ import annotations

import importlib.util

from specproxy.errors import ConfigError

__all__ = ["EXTRAS", "require"]

# importable module -> the extra that installs it
EXTRAS = {
    "matplotlib": "report",
    "pyarrow": "parquet",
    "asyncpg": "postgres",
    "opentelemetry.sdk": "otel",
    "grafana_client": "grafana",
}


def require(module: str, purpose: str) -> None:
    """A `ConfigError` naming the extra when `module` is not installed (nothing is imported)."""
    if importlib.util.find_spec(module) is None:
        extra = EXTRAS[module]
        raise ConfigError(f"{purpose} needs {module}: pip install 'specproxy[{extra}]'")
