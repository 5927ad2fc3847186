"""Prometheus config and rules: promtool's checks and unit tests, plus what promtool can't see
(names the proxy really exports, a runbook on every alert, the issue's alert list)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
import yaml

from specproxy.stats.diagnosis import LOW_ACCEPTANCE
from tests.conftest import require_binary
from tests.deploy.rulefiles import PROMETHEUS_DIR, RULES, fast_variant, load_rules
from tests.promql_names import PROMETHEUS_BUILTINS, exported_names, names_in

REQUIRED_ALERTS = {
    "SpecProxySpeculativeP99Slowdown",
    "SpecProxySpeedupLost",
    "SpecProxyLowAcceptance",
    "SpecProxyArmDown",
    "SpecProxyStoreDroppingRecords",
}


def _promtool(*args: str, cwd: Path = PROMETHEUS_DIR) -> subprocess.CompletedProcess[str]:
    promtool = require_binary("promtool")
    return subprocess.run(
        [promtool, *args], cwd=cwd, capture_output=True, text=True, timeout=120, check=False
    )


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


def test_every_alert_says_what_to_check() -> None:
    alerts = {
        rule["alert"]: rule
        for group in load_rules()["groups"]
        for rule in group["rules"]
        if "alert" in rule
    }
    assert set(alerts) >= REQUIRED_ALERTS
    for name, rule in alerts.items():
        assert rule["labels"]["severity"] in ("page", "warning"), name
        annotations = rule["annotations"]
        assert {"summary", "description", "runbook", "dashboard"} <= set(annotations), name
        assert len(annotations["runbook"].split()) >= 25, f"{name}: runbook too thin"
    slowdown = alerts["SpecProxySpeculativeP99Slowdown"]
    assert "specproxy_p99_slowdown" in slowdown["expr"]
    assert 'bound="upper"' in alerts["SpecProxySpeedupLost"]["expr"]


def test_low_acceptance_alert_uses_the_diagnosis_threshold() -> None:
    """The alert and the diagnosis it points to agree on what "low" means."""
    [rule] = [
        rule
        for group in load_rules()["groups"]
        for rule in group["rules"]
        if rule.get("alert") == "SpecProxyLowAcceptance"
    ]
    assert rule["expr"].endswith(f"< {LOW_ACCEPTANCE}")


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
