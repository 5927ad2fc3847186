"""The generated Kubernetes objects (specproxy.deploy.manifests) are exactly their sources: the
checked-in copies match a fresh generation, the PrometheusRule carries the rules promtool tests,
and the dashboard ConfigMap holds dashboards/specproxy.json byte for byte."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from specproxy.cli import main
from specproxy.deploy.manifests import (
    DASHBOARD,
    DASHBOARD_CONFIGMAP,
    PROJECT_URL,
    PROMETHEUS_RULE,
    RULES,
    RUNBOOK_BASE,
    AlertLinks,
    generate,
)
from specproxy.errors import ConfigError
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


def _alert_annotations(groups: list[dict[str, Any]]) -> dict[str, dict[str, str]]:
    return {
        str(rule["alert"]): dict(rule["annotations"])
        for group in groups
        for rule in group["rules"]
        if "alert" in rule
    }


def test_alert_links_point_at_the_given_grafana_and_runbooks(tmp_path: Path) -> None:
    _copy_sources(tmp_path)
    grafana, runbooks = "https://grafana.example.com/sub/", "https://wiki.example.com/specproxy.md"
    out = tmp_path / "specproxy.rules.yml"
    args = ["deploy", "generate", "--root", str(tmp_path), "--grafana-url", grafana]
    assert main([*args, "--runbook-base", runbooks, "--rules-out", str(out)]) == 0
    source = _alert_annotations(load_rules()["groups"])
    rule = yaml.safe_load((tmp_path / PROMETHEUS_RULE).read_text())
    for written in (
        _alert_annotations(rule["spec"]["groups"]),
        _alert_annotations(yaml.safe_load(out.read_text())["groups"]),
    ):
        assert set(written) == set(source)
        for name, notes in written.items():
            assert notes["dashboard_url"] == "https://grafana.example.com/sub/d/specproxy-ab"
            assert notes["runbook_url"] == f"{runbooks}#{name.lower()}"
            assert notes["summary"] == source[name]["summary"]  # nothing else moves
    # the rendered rule file is still a valid one, and the checked-in rule file is untouched
    assert promtool("check", "rules", str(out)).returncode == 0
    assert (tmp_path / RULES).read_text() == (REPO / RULES).read_text()


def test_without_links_the_rules_keep_the_path_and_the_project_runbooks() -> None:
    for name, notes in _alert_annotations(load_rules()["groups"]).items():
        assert notes["dashboard_url"] == "/d/specproxy-ab"
        assert notes["runbook_url"] == f"{RUNBOOK_BASE}#{name.lower()}"
    assert AlertLinks().apply(load_rules()["groups"]) == load_rules()["groups"]


def test_the_placeholder_project_url_is_one_marked_setting() -> None:
    """Outside the rule file's runbook links (RUNBOOK_BASE + anchor) the project URL appears only
    where it is declared as the setting: PROJECT_URL, and the Dockerfile's SOURCE_URL argument."""
    dockerfile = (REPO / "Dockerfile").read_text(encoding="utf-8")
    assert f"ARG SOURCE_URL={PROJECT_URL}\n" in dockerfile
    assert dockerfile.count(PROJECT_URL) == 1
    rules = (REPO / RULES).read_text(encoding="utf-8")
    anchors = {
        f"{RUNBOOK_BASE}#{name.lower()}" for name in _alert_annotations(load_rules()["groups"])
    }
    rest = rules
    for link in anchors:
        rest = rest.replace(link, "")
    assert PROJECT_URL not in rest


def test_bad_link_urls_are_one_line_errors(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _copy_sources(tmp_path)
    for flag, url in (
        ("--grafana-url", "grafana.example.com"),
        ("--grafana-url", "https://grafana.example.com/?orgId=1"),
        ("--runbook-base", "ftp://wiki/runbooks.md"),
    ):
        assert main(["deploy", "generate", "--root", str(tmp_path), flag, url]) == 2
        err = capsys.readouterr().err.strip()
        assert flag in err and url in err and "\n" not in err and "Traceback" not in err
        with pytest.raises(ConfigError):
            AlertLinks(**{flag.strip("-").replace("-url", "_url").replace("-base", "_base"): url})
