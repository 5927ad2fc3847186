"""Grafana provisioning: a Prometheus datasource and a provider for the generated dashboards."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from specproxy.grafana.dashboard import DASHBOARD_FILENAME

REPO = Path(__file__).resolve().parents[2]
PROVISIONING = REPO / "deploy" / "grafana" / "provisioning"


def _load(relative: str) -> dict[str, Any]:
    loaded: dict[str, Any] = yaml.safe_load((PROVISIONING / relative).read_text(encoding="utf-8"))
    return loaded


def test_datasource_is_a_default_prometheus() -> None:
    spec = _load("datasources/prometheus.yml")
    assert spec["apiVersion"] == 1
    [datasource] = spec["datasources"]
    assert datasource["type"] == "prometheus"
    assert datasource["isDefault"] is True
    assert datasource["url"].startswith("http")


def test_dashboard_provider_loads_the_dashboards_folder() -> None:
    spec = _load("dashboards/specproxy.yml")
    assert spec["apiVersion"] == 1
    [provider] = spec["providers"]
    assert provider["type"] == "file"
    assert provider["options"]["path"]
    assert provider["allowUiUpdates"] is False  # edits belong in the generator
    assert (REPO / "dashboards" / DASHBOARD_FILENAME).is_file()
    comment = (PROVISIONING / "dashboards" / "specproxy.yml").read_text(encoding="utf-8")
    assert f"dashboards:{provider['options']['path']}" in comment  # the mount it documents
