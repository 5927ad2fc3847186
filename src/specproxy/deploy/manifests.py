"""The Kubernetes objects that are copies of another file, generated from it, so each has one
source:

    deploy/prometheus/rules/specproxy.rules.yml -> deploy/kubernetes/base/prometheusrule.yaml
    dashboards/specproxy.json                   -> deploy/kubernetes/base/grafana-dashboard.yaml

The PrometheusRule's `spec.groups` are the rule file's groups, unchanged but for each alert's
links (`AlertLinks`: an absolute Grafana `dashboard_url`, another home for the runbooks) when
`specproxy deploy generate --grafana-url/--runbook-base` asks for them; the dashboard ConfigMap
holds the dashboard JSON byte for byte, labelled `grafana_dashboard: "1"` (the kube-prometheus-stack
Grafana sidecar's default). Pure functions from text to text; `specproxy deploy generate` writes
the results and tests/deploy fails while a checked-in copy differs.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final
from urllib.parse import urlsplit

import yaml

from specproxy.errors import ConfigError

__all__ = [
    "DASHBOARD",
    "DASHBOARD_CONFIGMAP",
    "PROJECT_URL",
    "PROMETHEUS_RULE",
    "RULES",
    "RUNBOOK_BASE",
    "AlertLinks",
    "dashboard_configmap",
    "generate",
    "prometheus_rule",
    "rules_file",
    "to_yaml",
]

RULES = Path("deploy/prometheus/rules/specproxy.rules.yml")
DASHBOARD = Path("dashboards/specproxy.json")
PROMETHEUS_RULE = Path("deploy/kubernetes/base/prometheusrule.yaml")
DASHBOARD_CONFIGMAP = Path("deploy/kubernetes/base/grafana-dashboard.yaml")

_NAME = "specproxy"

# PLACEHOLDER: the project's public home. The one place it is set: the rule file's runbook links
# are RUNBOOK_BASE + "#" + the alert's name in lower case (tests/deploy/test_rules.py holds them
# to it), the Dockerfile's labels take it as `--build-arg SOURCE_URL`, and
# `specproxy deploy generate --runbook-base URL` points the generated copies at a fork or an
# internal wiki that serves docs/runbooks.md.
PROJECT_URL: Final = "https://github.com/specproxy/specproxy"
RUNBOOK_BASE: Final = f"{PROJECT_URL}/blob/main/docs/runbooks.md"


@dataclass(frozen=True, slots=True)
class AlertLinks:
    """Where the alerts' links point. `grafana_url`: Grafana's base URL (with any sub-path),
    which makes every `dashboard_url` absolute ("" keeps it a path, as in the rule file, which
    Alertmanager templates can prefix); `runbook_base`: the runbooks page each `runbook_url`
    anchors into."""

    grafana_url: str = ""
    runbook_base: str = RUNBOOK_BASE

    def __post_init__(self) -> None:
        for name, url in (
            ("--grafana-url", self.grafana_url),
            ("--runbook-base", self.runbook_base),
        ):
            if url == "" and name == "--grafana-url":
                continue
            parts = urlsplit(url)
            if parts.scheme not in ("http", "https") or not parts.netloc:
                raise ConfigError(f"{name} {url!r}: must be an http(s) URL with a host")
            if parts.query or parts.fragment:
                raise ConfigError(f"{name} {url!r}: no query or #fragment (the links add theirs)")

    def apply(self, groups: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """A copy of the rule groups with each alert's `runbook_url` and `dashboard_url` moved."""
        out = copy.deepcopy(groups)
        base = self.grafana_url.rstrip("/")
        for group in out:
            for rule in group.get("rules", []):
                annotations = rule.get("annotations") if "alert" in rule else None
                if not annotations:
                    continue
                runbook = annotations.get("runbook_url")
                if isinstance(runbook, str) and "#" in runbook:
                    annotations["runbook_url"] = f"{self.runbook_base}#{runbook.split('#', 1)[1]}"
                dashboard = annotations.get("dashboard_url")
                if base and isinstance(dashboard, str) and dashboard.startswith("/"):
                    annotations["dashboard_url"] = base + dashboard
        return out


def prometheus_rule(rules_text: str, links: AlertLinks | None = None) -> dict[str, Any]:
    """A monitoring.coreos.com/v1 PrometheusRule holding the rule file's groups (their alert
    links moved by `links`, if given)."""
    rules = yaml.safe_load(rules_text)
    if links is not None:
        rules["groups"] = links.apply(rules["groups"])
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


def rules_file(rules_text: str, links: AlertLinks) -> str:
    """The rule file with its alert links moved (for Prometheus without the Operator: load this
    instead of the checked-in file), under the same do-not-edit header."""
    rules = yaml.safe_load(rules_text)
    rules["groups"] = links.apply(rules["groups"])
    return to_yaml(rules, RULES)


def generate(root: Path, links: AlertLinks | None = None) -> dict[Path, str]:
    """{path relative to root: text} of every generated file, from the sources under root."""
    rules = (root / RULES).read_text(encoding="utf-8")
    dashboard = (root / DASHBOARD).read_text(encoding="utf-8")
    return {
        PROMETHEUS_RULE: to_yaml(prometheus_rule(rules, links), RULES),
        DASHBOARD_CONFIGMAP: to_yaml(dashboard_configmap(dashboard), DASHBOARD),
    }


class _Dumper(yaml.SafeDumper):
    pass


def _str(dumper: yaml.SafeDumper, value: str) -> yaml.ScalarNode:
    style = "|" if "\n" in value else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_Dumper.add_representer(str, _str)
