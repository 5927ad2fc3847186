"""The Prometheus rule file, and its fast variant for tests against a live Prometheus.

There is one source of rules, deploy/prometheus/rules/specproxy.rules.yml. The fast variant is
derived from it at test time by shortening every `for:` and nothing else, so expressions,
labels and annotations proven in the integration test are the production ones.
"""

from __future__ import annotations

import copy
import subprocess
from pathlib import Path
from typing import Any

import yaml

from tests.conftest import require_binary

__all__ = ["PROMETHEUS_DIR", "REPO", "RULES", "fast_variant", "load_rules", "promtool"]

REPO = Path(__file__).resolve().parents[2]
PROMETHEUS_DIR = REPO / "deploy" / "prometheus"
RULES = PROMETHEUS_DIR / "rules" / "specproxy.rules.yml"


def load_rules(path: Path = RULES) -> dict[str, Any]:
    loaded: dict[str, Any] = yaml.safe_load(path.read_text(encoding="utf-8"))
    return loaded


def fast_variant(rules: dict[str, Any], hold: str = "2s") -> dict[str, Any]:
    """The same rules with every `for:` set to `hold` (kept non-zero, so pending still happens)."""
    fast = copy.deepcopy(rules)
    for group in fast["groups"]:
        for rule in group["rules"]:
            if "for" in rule:
                rule["for"] = hold
    return fast


def promtool(*args: str, cwd: Path = PROMETHEUS_DIR) -> subprocess.CompletedProcess[str]:
    """Run promtool (installed by scripts/sysdeps.sh) in `cwd`."""
    return subprocess.run(
        [require_binary("promtool"), *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
