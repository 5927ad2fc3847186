"""Prometheus config and rules: promtool's checks and unit tests, plus what promtool can't see
(names the proxy really exports, a runbook on every alert, the issue's alert list)."""

from __future__ import annotations

import copy
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from specproxy import metrics
from specproxy.deploy.manifests import RUNBOOK_BASE
from specproxy.grafana.dashboard import DASHBOARD_UID
from specproxy.stats.diagnosis import BANDWIDTH_SATURATED, THERMAL_THROTTLE_SHARE
from tests.deploy.rulefiles import (
    PROMETHEUS_DIR,
    REPO,
    RULES,
    fast_variant,
    load_rules,
    promtool,
)
from tests.promql_names import PROMETHEUS_BUILTINS, arm_matchers, exported_names, names_in

REQUIRED_ALERTS = {
    "SpecProxySpeculativeP99Slowdown",
    "SpecProxySpeedupLost",
    "SpecProxyLowAcceptance",
    "SpecProxyArmDown",
    "SpecProxyStoreDroppingRecords",
}
# kube-prometheus mixin conventions (kubernetes-mixin's alerts): these severities and annotations.
SEVERITIES = ("critical", "warning", "info")
ANNOTATIONS = {"summary", "description", "runbook_url", "dashboard_url"}
RUNBOOKS = REPO / "docs" / "runbooks.md"


def _promtool(*args: str, cwd: Path = PROMETHEUS_DIR) -> subprocess.CompletedProcess[str]:
    return promtool(*args, cwd=cwd)


def test_promtool_check_rules() -> None:
    result = _promtool("check", "rules", str(RULES))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout


def test_promtool_check_config() -> None:
    result = _promtool("check", "config", "prometheus.yml")
    assert result.returncode == 0, result.stdout + result.stderr


def test_promtool_unit_tests() -> None:
    tests = sorted(str(p) for p in (PROMETHEUS_DIR / "tests").glob("*.yml"))
    assert tests
    result = _promtool("test", "rules", *tests)
    assert result.returncode == 0, result.stdout + result.stderr


def test_promtool_unit_tests_catch_a_broken_rule(tmp_path: Path) -> None:
    """The unit tests are not vacuous: firing the P99 alert at once must fail them."""
    rules = load_rules()
    for group in rules["groups"]:
        for rule in group["rules"]:
            if rule.get("alert") == "SpecProxySpeculativeP99Slowdown":
                del rule["for"]
    (tmp_path / "rules").mkdir()
    (tmp_path / "rules" / RULES.name).write_text(yaml.safe_dump(rules), encoding="utf-8")
    (tmp_path / "tests").mkdir()
    test_file = tmp_path / "tests" / "specproxy_test.yml"
    test_file.write_text((PROMETHEUS_DIR / "tests" / "specproxy_test.yml").read_text())
    result = _promtool("test", "rules", str(test_file), cwd=tmp_path)
    assert result.returncode != 0
    assert "SpecProxySpeculativeP99Slowdown" in result.stdout + result.stderr


def test_rules_name_only_exported_or_recorded_series() -> None:
    rules = [rule for group in load_rules()["groups"] for rule in group["rules"]]
    recorded = {rule["record"] for rule in rules if "record" in rule}
    allowed = exported_names() | recorded | PROMETHEUS_BUILTINS
    for rule in rules:
        names = names_in(rule["expr"])
        assert names, rule
        assert names <= allowed, f"{rule.get('alert') or rule['record']}: {names - allowed}"


def test_no_rule_names_an_arm() -> None:
    """A/B/n: adding an arm is a config change only, so no rule may select an arm by name
    (`arm="speculative"`); roles come from specproxy_arm_info{role}."""
    for group in load_rules()["groups"]:
        for rule in group["rules"]:
            assert not arm_matchers(rule["expr"]), rule.get("alert") or rule["record"]


def _alerts() -> dict[str, dict[str, Any]]:
    return {
        rule["alert"]: rule
        for group in load_rules()["groups"]
        for rule in group["rules"]
        if "alert" in rule
    }


def _runbook_sections() -> dict[str, str]:
    """docs/runbooks.md's `## Heading` sections by GitHub anchor (the heading in lower case)."""
    sections: dict[str, str] = {}
    anchor = None
    for line in RUNBOOKS.read_text(encoding="utf-8").splitlines():
        if line.startswith("## "):
            anchor = line[3:].strip().lower()
            sections[anchor] = ""
        elif anchor is not None:
            sections[anchor] += line + "\n"
    return sections


def alert_convention_problems(
    alerts: dict[str, dict[str, Any]], runbooks: dict[str, str]
) -> list[str]:
    """Every way an alert breaks the kube-prometheus conventions: severity critical, warning or
    info; annotations summary, description, runbook_url (into docs/runbooks.md, whose section
    for the alert says what to check) and dashboard_url (the specproxy dashboard)."""
    problems = []
    for name, rule in alerts.items():
        severity = rule.get("labels", {}).get("severity")
        if severity not in SEVERITIES:
            problems.append(f"{name}: severity {severity!r} is not one of {SEVERITIES}")
        annotations = rule.get("annotations", {})
        if set(annotations) != ANNOTATIONS:
            problems.append(f"{name}: annotations {sorted(annotations)} != {sorted(ANNOTATIONS)}")
        url = str(annotations.get("runbook_url", ""))
        base, _, anchor = url.partition("#")
        if base != RUNBOOK_BASE or anchor != name.lower():
            problems.append(f"{name}: runbook_url {url!r} != {RUNBOOK_BASE}#{name.lower()}")
        elif len(runbooks.get(anchor, "").split()) < 40:
            problems.append(f"{name}: no runbook section of 40+ words in {RUNBOOKS.name}")
        if annotations.get("dashboard_url") != f"/d/{DASHBOARD_UID}":
            problems.append(f"{name}: dashboard_url is not /d/{DASHBOARD_UID}")
        for key in ("summary", "description"):
            if len(str(annotations.get(key, "")).split()) < 4:
                problems.append(f"{name}: {key} too thin")
    return problems


def test_every_alert_follows_the_conventions() -> None:
    alerts = _alerts()
    assert set(alerts) >= REQUIRED_ALERTS
    assert alert_convention_problems(alerts, _runbook_sections()) == []
    slowdown = alerts["SpecProxySpeculativeP99Slowdown"]
    assert "specproxy_p99_slowdown" in slowdown["expr"]
    assert 'bound="upper"' in alerts["SpecProxySpeedupLost"]["expr"]


def test_alert_conventions_catch_each_breach() -> None:
    """The convention check is not vacuous: each kind of breach is reported."""
    runbooks = _runbook_sections()
    name, rule = next(iter(_alerts().items()))
    breaches: list[tuple[str, Callable[[dict[str, Any]], None]]] = [
        ("severity", lambda r: r["labels"].update(severity="page")),
        ("annotations", lambda r: r["annotations"].update(runbook="see docs")),
        ("runbook_url", lambda r: r["annotations"].update(runbook_url=RUNBOOK_BASE + "#other")),
        ("dashboard_url", lambda r: r["annotations"].update(dashboard_url="/d/elsewhere")),
        ("summary", lambda r: r["annotations"].update(summary="Down")),
    ]
    for expected, breach in breaches:
        broken = copy.deepcopy(rule)
        breach(broken)
        [problem] = alert_convention_problems({name: broken}, runbooks)
        assert expected in problem
    missing_section = {k: v for k, v in runbooks.items() if k != name.lower()}
    [problem] = alert_convention_problems({name: rule}, missing_section)
    assert "runbook section" in problem


def test_every_runbook_section_belongs_to_an_alert() -> None:
    assert set(_runbook_sections()) == {name.lower() for name in _alerts()}


def test_low_acceptance_alert_reads_the_diagnosis_rule() -> None:
    """The alert and the diagnosis it points to agree on what "low" means: the alert compares
    the two sides of the diagnosis's rule as the stats job exports them, no threshold of its own."""
    [rule] = [
        rule
        for group in load_rules()["groups"]
        for rule in group["rules"]
        if rule.get("alert") == "SpecProxyLowAcceptance"
    ]
    expr = " ".join(rule["expr"].split())
    assert expr == (
        f"{metrics.SPECULATION_TOKENS_PER_STEP} / {metrics.SPECULATION_BREAK_EVEN} <= 1"
    )


def test_gpu_alerts_use_the_diagnosis_thresholds() -> None:
    """The GPU alerts fire where the diagnosis branches they point to do."""
    rules = {
        rule["alert"]: rule["expr"]
        for group in load_rules()["groups"]
        for rule in group["rules"]
        if "alert" in rule
    }
    assert rules["SpecProxyGpuThermalThrottling"].endswith(f">= {THERMAL_THROTTLE_SHARE}")
    assert rules["SpecProxyGpuMemoryBandwidthSaturated"].endswith(f"> {BANDWIDTH_SATURATED}")


def test_fast_variant_changes_only_for() -> None:
    rules = load_rules()
    fast = fast_variant(rules)
    held = 0
    for group, fast_group in zip(rules["groups"], fast["groups"], strict=True):
        for rule, fast_rule in zip(group["rules"], fast_group["rules"], strict=True):
            if "for" in rule:
                held += 1
                assert fast_rule.pop("for") == "2s"
                rule = {k: v for k, v in rule.items() if k != "for"}
            assert fast_rule == rule
    assert held >= 4


@pytest.mark.parametrize("path", sorted((PROMETHEUS_DIR / "tests").glob("*.yml")), ids=str)
def test_unit_test_files_load_the_shipped_rules(path: Path) -> None:
    spec = yaml.safe_load(path.read_text(encoding="utf-8"))
    assert [(path.parent / f).resolve() for f in spec["rule_files"]] == [RULES.resolve()]
