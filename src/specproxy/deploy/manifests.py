"""The Kubernetes objects that are copies of another file, generated from it, so each has one
source:

    deploy/prometheus/rules/specproxy.rules.yml -> deploy/kubernetes/base/prometheusrule.yaml
    dashboards/specproxy.json                   -> deploy/kubernetes/base/grafana-dashboard.yaml

The PrometheusRule's `spec.groups` are the rule file's groups, unchanged; the dashboard ConfigMap
holds the dashboard JSON byte for byte, labelled `grafana_dashboard: "1"` (the kube-prometheus-stack
Grafana sidecar's default). Pure functions from text to text; `specproxy deploy generate` writes
the results and tests/deploy fails while a checked-in copy differs.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

__all__ = [
    "DASHBOARD",
    "DASHBOARD_CONFIGMAP",
    "PROMETHEUS_RULE",
    "RULES",
    "dashboard_configmap",
    "generate",
    "prometheus_rule",
    "to_yaml",
]

RULES = Path("deploy/prometheus/rules/specproxy.rules.yml")
DASHBOARD = Path("dashboards/specproxy.json")
PROMETHEUS_RULE = Path("deploy/kubernetes/base/prometheusrule.yaml")
DASHBOARD_CONFIGMAP = Path("deploy/kubernetes/base/grafana-dashboard.yaml")

_NAME = "specproxy"


def prometheus_rule(rules_text: str) -> dict[str, Any]:
    """A monitoring.coreos.com/v1 PrometheusRule holding the rule file's groups."""
    rules = yaml.safe_load(rules_text)
    return {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "PrometheusRule",
        "metadata": {"name": _NAME, "labels": {"app.kubernetes.io/component": "monitoring"}},
        "spec": {"groups": rules["groups"]},
    }


def dashboard_configmap(dashboard_text: str) -> dict[str, Any]:
    """A ConfigMap the Grafana sidecar loads: label grafana_dashboard "1", the JSON as is."""
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {
            "name": f"{_NAME}-grafana-dashboard",
            "labels": {"app.kubernetes.io/component": "monitoring", "grafana_dashboard": "1"},
        },
        "data": {DASHBOARD.name: dashboard_text},
    }


def to_yaml(obj: dict[str, Any], source: Path) -> str:
    """The object as YAML, multi-line strings as literal blocks, under a do-not-edit header."""
    header = (
        f"# GENERATED from {source} by `specproxy deploy generate`: do not edit.\n"
        "# tests/deploy/test_kubernetes.py fails while this file differs from its source.\n"
    )
    return header + yaml.dump(obj, Dumper=_Dumper, sort_keys=False, width=100, allow_unicode=True)


def generate(root: Path) -> dict[Path, str]:
    """{path relative to root: text} of every generated file, from the sources under root."""
    rules = (root / RULES).read_text(encoding="utf-8")
    dashboard = (root / DASHBOARD).read_text(encoding="utf-8")
    return {
        PROMETHEUS_RULE: to_yaml(prometheus_rule(rules), RULES),
        DASHBOARD_CONFIGMAP: to_yaml(dashboard_configmap(dashboard), DASHBOARD),
    }


class _Dumper(yaml.SafeDumper):
    pass


def _str(dumper: yaml.SafeDumper, value: str) -> yaml.ScalarNode:
    style = "|" if "\n" in value else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_Dumper.add_representer(str, _str)
