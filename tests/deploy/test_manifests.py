"""The generated Kubernetes objects (specproxy.deploy.manifests) are exactly their sources: the
checked-in copies match a fresh generation, the PrometheusRule carries the rules promtool tests,
and the dashboard ConfigMap holds dashboards/specproxy.json byte for byte."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import yaml

from specproxy.cli import main
from specproxy.deploy.manifests import (
    DASHBOARD,
    DASHBOARD_CONFIGMAP,
    PROMETHEUS_RULE,
    RULES,
    generate,
)
from specproxy.grafana.dashboard import dashboard_json
from tests.deploy.kube import OVERLAYS, REPO, find, render
from tests.deploy.rulefiles import PROMETHEUS_DIR, load_rules, promtool


def _copy_sources(root: Path) -> None:
    for path in (RULES, DASHBOARD, PROMETHEUS_RULE, DASHBOARD_CONFIGMAP):
        (root / path).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(REPO / path, root / path)


def test_checked_in_copies_are_up_to_date() -> None:
    for path, text in generate(REPO).items():
        assert (REPO / path).read_text(encoding="utf-8") == text, (
            f"{path} is stale: run `specproxy deploy generate`"
        )


def test_drift_is_detected_and_regenerated(tmp_path: Path, capsys: object) -> None:
    _copy_sources(tmp_path)
    assert main(["deploy", "generate", "--check", "--root", str(tmp_path)]) == 0
    rules = tmp_path / RULES
    rules.write_text(rules.read_text().replace("for: 30m", "for: 45m"), encoding="utf-8")
    dashboard = tmp_path / DASHBOARD
    dashboard.write_text(dashboard.read_text().replace('"specproxy-ab"', '"other"'))
    assert main(["deploy", "generate", "--check", "--root", str(tmp_path)]) == 1
    assert main(["deploy", "generate", "--root", str(tmp_path)]) == 0
    assert "45m" in (tmp_path / PROMETHEUS_RULE).read_text()
    assert '"other"' in (tmp_path / DASHBOARD_CONFIGMAP).read_text()
    assert main(["deploy", "generate", "--check", "--root", str(tmp_path)]) == 0


def test_the_command_runs_as_a_program(tmp_path: Path) -> None:
    _copy_sources(tmp_path)
    (tmp_path / PROMETHEUS_RULE).write_text("stale\n")
    cmd = [sys.executable, "-m", "specproxy", "deploy", "generate", "--check", "--root", "."]
    result = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, check=False)
    assert result.returncode == 1 and f"out of date: {PROMETHEUS_RULE}" in result.stderr


def test_prometheus_rule_holds_the_rule_files_groups() -> None:
    for overlay in OVERLAYS:
        rule = find(render(overlay), "PrometheusRule", "specproxy")
        assert rule["spec"]["groups"] == load_rules()["groups"]


def test_promtool_unit_tests_pass_on_the_rendered_prometheus_rule(tmp_path: Path) -> None:
    """What the operator loads is what promtool tests: the rule file is rebuilt from the rendered
    PrometheusRule and the unit tests run against it."""
    rule = find(render("production"), "PrometheusRule", "specproxy")
    (tmp_path / "rules").mkdir()
    (tmp_path / "rules" / RULES.name).write_text(yaml.safe_dump({"groups": rule["spec"]["groups"]}))
    (tmp_path / "tests").mkdir()
    for test in (PROMETHEUS_DIR / "tests").glob("*.yml"):
        shutil.copy(test, tmp_path / "tests" / test.name)
    tests = sorted(str(p) for p in (tmp_path / "tests").glob("*.yml"))
    result = promtool("test", "rules", *tests, cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr


def test_dashboard_configmap_holds_the_dashboard_json() -> None:
    text = (REPO / DASHBOARD).read_text(encoding="utf-8")
    assert text.strip() == dashboard_json().strip()  # itself generated from the code
    for overlay in OVERLAYS:
        configmap = find(render(overlay), "ConfigMap", "specproxy-grafana-dashboard")
        assert configmap["metadata"]["labels"]["grafana_dashboard"] == "1"
        assert configmap["data"] == {DASHBOARD.name: text}
        assert json.loads(configmap["data"][DASHBOARD.name])["uid"] == "specproxy-ab"
