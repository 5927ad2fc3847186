"""The metric names a PromQL expression may use: those specproxy exports, checked in tests.

Shared by the dashboard and rule tests, so a query naming a metric the proxy does not export
(a typo, a rename in `specproxy.metrics`) fails a test instead of drawing an empty panel.
"""

from __future__ import annotations

import re

from prometheus_client import CollectorRegistry

from specproxy import metrics
from specproxy.metrics import ProxyMetrics

__all__ = ["PROMETHEUS_BUILTINS", "arm_matchers", "exported_names", "names_in"]

PROMETHEUS_BUILTINS = frozenset({"up", "ALERTS", "ALERTS_FOR_STATE"})

_STRING = re.compile(r'"(?:[^"\\]|\\.)*"')
_ARM_MATCHER = re.compile(r'\barm\s*(?:=~|!~|!=|=)\s*"((?:[^"\\]|\\.)*)"')


def exported_names() -> frozenset[str]:
    """Every series name the proxy can expose: histograms with their _bucket/_sum/_count,
    counters with _total, gauges as they are."""
    registry = CollectorRegistry()
    ProxyMetrics(registry)
    names: set[str] = set()
    typed: set[str] = set()
    for family in registry.collect():
        typed.add(family.name)
        suffixes = {
            "histogram": ("_bucket", "_sum", "_count"),
            "counter": ("_total",),
            "info": ("_info",),
        }.get(family.type, ("",))
        names.update(family.name + suffix for suffix in suffixes)
    for value in vars(metrics).values():
        if isinstance(value, str) and value.startswith("specproxy_") and value not in typed:
            names.update((value, value + "_total"))
    return frozenset(names)


def names_in(expr: str) -> set[str]:
    """Series names in a PromQL expression: specproxy's own, recording rules (they contain a
    colon) and Prometheus's built-ins; functions, keywords, labels and strings are skipped."""
    code = re.sub(r"\{[^}]*\}", "{}", _STRING.sub('""', expr))
    code = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", code)
    tokens = set(re.findall(r"[a-zA-Z_:][a-zA-Z0-9_:]*", code))
    return {
        t
        for t in tokens
        if t.startswith(("specproxy_", "process_")) or ":" in t or t in PROMETHEUS_BUILTINS
    }


def arm_matchers(expr: str) -> set[str]:
    """The values an expression matches the `arm` label against (`arm="x"`, `arm=~"$arm"`):
    an arm's name here means the query changes when the arms do (A/B/n: they are config)."""
    return set(_ARM_MATCHER.findall(expr))
